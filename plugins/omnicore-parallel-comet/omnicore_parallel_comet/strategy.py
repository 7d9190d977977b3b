"""COMET-style overlap for expert parallelism (Zhang et al. 2025, "Comet: Fine-grained
Computation-communication Overlapping for Mixture-of-Experts").

Plain EP (:func:`omnicore.parallel.expert.all_to_all_dispatcher`) runs dispatch, expert compute and
combine one after the other: the experts idle while tokens travel and the links idle while the
experts compute. Here each rank's tokens are split into ``chunks`` contiguous chunks (the EP core
sorts rows by (chunk, expert) and exchanges a ``[chunk, rank, expert]`` count table once), and one
autograd function runs a software pipeline over them:

forward, for chunk ``c``::

    start dispatch(c+1)   (async all-to-all)
    wait  dispatch(c)  -> compute experts(c)   (graph kept for backward)
    start combine(c)      (async all-to-all, overlaps experts(c+1))

backward, the same pipeline on the gradients::

    start a2a of grad_out(c+1) to the experts' owners
    wait  grad_out(c)  -> backward of experts(c) (input and weight gradients)
    start a2a of grad_in(c) back to the tokens' ranks (overlaps experts(c+1)'s backward)

The all-to-alls are ``torch.distributed.all_to_all_single(..., async_op=True)``: gloo and NCCL run
them on their own threads / streams while this thread computes. The numbers are those of plain EP up
to the order of float additions in the weight gradients (summed per chunk).

COMET proper also splits the *experts'* GEMMs into tiles with a fine-grained, kernel-level schedule
on GPUs; this is the chunk-level (token-granularity) version of the same idea, in pure PyTorch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from omnicore.api import ExpertParallel, local_experts_forward, regroup


def _launch(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> tuple[torch.Tensor, Any]:
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    work = dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group, async_op=True)
    return out, work


class _PipelinedExperts(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, module: nn.Module, send: list, recv: list, group: Any
    ) -> torch.Tensor:
        C = len(send)
        ins = [[sum(r) for r in send[c]] for c in range(C)]
        outs = [[sum(r) for r in recv[c]] for c in range(C)]
        bounds = [0]
        for c in range(C):
            bounds.append(bounds[-1] + sum(ins[c]))
        w1d = w1.detach().requires_grad_(w1.requires_grad)
        w2d = w2.detach().requires_grad_(w2.requires_grad)
        dispatch: list[Any] = [None] * C
        combine: list[Any] = [None] * C
        saved = []
        dispatch[0] = _launch(x[bounds[0] : bounds[1]], outs[0], ins[0], group)
        for c in range(C):
            if c + 1 < C:
                dispatch[c + 1] = _launch(x[bounds[c + 1] : bounds[c + 2]], outs[c + 1], ins[c + 1], group)
            arrived, work = dispatch[c]
            work.wait()
            perm, inverse, per_expert = regroup(recv[c], x.device)
            xe = arrived[perm].detach().requires_grad_(x.requires_grad)
            with torch.enable_grad():
                ye = local_experts_forward(module, xe, w1d, w2d, per_expert)
            saved.append((xe, ye, perm, inverse))
            combine[c] = _launch(ye.detach()[inverse], ins[c], outs[c], group)
        result = []
        for c in range(C):
            out, work = combine[c]
            work.wait()
            result.append(out)
        ctx.pipeline = (saved, w1d, w2d, ins, outs, bounds, group)
        return torch.cat(result, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        saved, w1d, w2d, ins, outs, bounds, group = ctx.pipeline
        del ctx.pipeline
        C = len(ins)
        grad = grad.contiguous()
        g1 = torch.zeros_like(w1d) if w1d.requires_grad else None
        g2 = torch.zeros_like(w2d) if w2d.requires_grad else None
        arrive: list[Any] = [None] * C
        back: list[Any] = [None] * C
        arrive[0] = _launch(grad[bounds[0] : bounds[1]], outs[0], ins[0], group)
        for c in range(C):
            if c + 1 < C:
                arrive[c + 1] = _launch(grad[bounds[c + 1] : bounds[c + 2]], outs[c + 1], ins[c + 1], group)
            gy, work = arrive[c]
            work.wait()
            xe, ye, perm, inverse = saved[c]
            wrt = [t for t in (xe, w1d, w2d) if t.requires_grad]
            grads = torch.autograd.grad(ye, wrt, gy[perm], allow_unused=True)
            got = dict(zip((id(t) for t in wrt), grads))
            gx = got.get(id(xe))
            if g1 is not None and got.get(id(w1d)) is not None:
                g1 += got[id(w1d)]
            if g2 is not None and got.get(id(w2d)) is not None:
                g2 += got[id(w2d)]
            gx = torch.zeros_like(xe) if gx is None else gx
            back[c] = _launch(gx[inverse], ins[c], outs[c], group)
        grad_x = []
        for c in range(C):
            out, work = back[c]
            work.wait()
            grad_x.append(out)
        return torch.cat(grad_x, dim=0), g1, g2, None, None, None, None


def comet_dispatcher(
    module: nn.Module, x: torch.Tensor, send: list, recv: list, w1: torch.Tensor, w2: torch.Tensor, group: Any
) -> torch.Tensor:
    """A dispatcher for :class:`omnicore.parallel.expert.EPContext`: the pipelined
    dispatch-compute-combine over ``len(send)`` chunks, in forward and backward."""
    return _PipelinedExperts.apply(x, w1, w2, module, send, recv, group)


class CometExpertParallel(ExpertParallel):
    """Parallel strategy ``comet_ep``: :class:`~omnicore.parallel.expert.ExpertParallel` (same
    plan, mesh and FSDP handling) with the pipelined dispatcher. Options: ``chunks`` (default 2;
    1 gives plain EP's schedule) and ``plan``."""

    chunks_default = 2

    def dispatcher(self) -> Any:
        return comet_dispatcher
