"""All-to-all over the sequence-parallel group, differentiable, with an asynchronous start.

``all_to_all(x, group, scatter_dim, gather_dim)`` splits ``x`` into ``sp`` equal chunks along
``scatter_dim``, sends chunk ``j`` to rank ``j`` of ``group`` and concatenates what it receives
along ``gather_dim`` in rank order. Its backward is the same exchange with the two dims swapped.
Both sides use ``torch.distributed.all_to_all_single`` on one contiguous buffer (works on gloo
and NCCL).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class Pending:
    """An all-to-all in flight: :meth:`wait` returns the gathered tensor (no autograd)."""

    def __init__(self, out: torch.Tensor, work: Any, gather_dim: int):
        self.out, self.work, self.gather_dim = out, work, gather_dim

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
            self.work = None
        return torch.cat(self.out.unbind(0), dim=self.gather_dim)


def start_all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int, async_op: bool = False) -> Pending:
    """Issue the exchange of ``x`` (detached); with ``async_op`` it runs while the caller computes."""
    sp = dist.get_world_size(group)
    inp = torch.stack(x.detach().chunk(sp, dim=scatter_dim)).contiguous()  # [sp, ...]: chunk j goes to rank j
    out = torch.empty_like(inp)
    work = dist.all_to_all_single(out, inp, group=group, async_op=async_op)
    return Pending(out, work if async_op else None, gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int, pending: Pending | None) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        if pending is None:
            pending = start_all_to_all(x, group, scatter_dim, gather_dim)
        return pending.wait()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = start_all_to_all(grad.contiguous(), ctx.group, ctx.gather_dim, ctx.scatter_dim).wait()
        return back, None, None, None, None


def all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int, pending: Pending | None = None) -> torch.Tensor:
    """Differentiable all-to-all. ``pending``: the exchange of this same ``x`` already started by
    :func:`start_all_to_all` (Async-Ulysses); waited for here."""
    return _AllToAll.apply(x, group, scatter_dim, gather_dim, pending)
