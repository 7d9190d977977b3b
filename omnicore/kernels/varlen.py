"""Packed rows as variable-length samples: sample boundaries from restarting ``position_ids``.

omnicore packs several samples into one row; their ``position_ids`` restart at 0 at each sample
start (``omnicore.data.packing``). A *varlen* attention kernel takes those boundaries instead of a
dense ``[T, T]`` block-diagonal mask:

* :func:`cu_seqlens_from_position_ids`: the cumulative sequence lengths (``cu_seqlens``, the
  FlashAttention varlen convention: ``int32 [n+1]``, ``cu[0] = 0``, ``cu[-1] = B*T``);
* :func:`plan_varlen`: how to run ``n`` samples as a few *batched* dense calls (samples bucketed by
  length, short ones right-padded to their bucket's length, which is exact under a causal mask);
* :func:`mark_varlen` / :func:`is_varlen`: the marker a transformers attention function carries when
  it splits samples itself from the ``position_ids`` keyword argument and needs no mask. Wrappers
  such as Ulysses sequence parallelism call such a function with the *global* ``position_ids``
  instead of building a mask.

torch is imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

VARLEN_ATTR = "omnicore_varlen"
"""Attribute set to True on a transformers attention function that splits packed samples itself
from its ``position_ids`` keyword argument (``[B, T]``, restarting at 0 per sample) and ignores the
attention mask (its mask function returns None)."""


CU_SEQLENS_KWARGS: tuple[str, str, str, str] = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
"""The keyword arguments through which :class:`omnicore.model.omni.OmniModel` hands the packed row's
``cu_seqlens`` (int32 ``[n+1]``, twice: queries and keys) and ``max_seqlen`` (int, twice) to the
foundation; transformers passes them down to the attention function (the names of its
``FlashAttentionKwargs``). A varlen kernel uses them instead of recomputing them from
``position_ids``: they are built once, at collate (:func:`omnicore.data.packing.collate`)."""


def varlen_from_kwargs(kwargs: dict[str, Any], position_ids: Any = None) -> tuple[Any, int]:
    """``(cu_seqlens int32 [n+1], max_seqlen)`` of a packed batch, from an attention function's
    keyword arguments: the ones OmniModel passed (:data:`CU_SEQLENS_KWARGS`) when present, else
    computed from ``position_ids`` (``[B, T]``; ``kwargs["position_ids"]`` when not given).

    Raises:
        ValueError: neither the keyword arguments nor ``position_ids`` are there.
    """
    cu = kwargs.get(CU_SEQLENS_KWARGS[0])
    if cu is not None:
        max_len = kwargs.get(CU_SEQLENS_KWARGS[2])
        return cu, int(max_len) if max_len is not None else int((cu[1:] - cu[:-1]).max())
    pos = position_ids if position_ids is not None else kwargs.get("position_ids")
    if pos is None:
        raise ValueError("varlen attention needs cu_seq_lens_q or position_ids in its keyword arguments")
    return cu_seqlens_from_position_ids(pos)


def mark_varlen(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` (a transformers attention function) as varlen; see :data:`VARLEN_ATTR`."""
    setattr(fn, VARLEN_ATTR, True)
    return fn


def is_varlen(fn: Any) -> bool:
    """Whether ``fn`` is marked by :func:`mark_varlen`."""
    return bool(getattr(fn, VARLEN_ATTR, False))


def cu_seqlens_from_position_ids(position_ids: Any) -> tuple[Any, int]:
    """``(cu_seqlens int32 [n+1], max_seqlen)`` for the flattened ``[B, T]`` ``position_ids``.

    A sample starts wherever the position is 0 (and at the start of every row). For example
    ``[[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]`` gives ``[0, 3, 5, 6, 12]`` and 6.
    """
    import torch

    pos = position_ids.reshape(position_ids.shape[0], -1)
    starts = pos == 0
    starts[:, 0] = True
    flat = starts.reshape(-1)
    idx = torch.nonzero(flat, as_tuple=False).flatten().to(torch.int32)
    total = torch.tensor([flat.numel()], dtype=torch.int32, device=idx.device)
    cu = torch.cat([idx, total])
    max_len = int((cu[1:] - cu[:-1]).max().item())
    return cu, max_len


def bucket_length(length: int, pad_below: int) -> int:
    """The padded length of a sample of ``length`` tokens: ``length`` itself from ``pad_below`` on
    (long samples are not padded), else rounded up to a grid of 4 steps per power of two (at most
    25% padding; lengths up to 8 are kept): 5 -> 5, 9 -> 10, 17 -> 20, 100 -> 112, 129 -> 160."""
    if length >= pad_below or length <= 8:
        return length
    step = 1 << (length.bit_length() - 3)  # 2^(floor(log2 L) - 2)
    return -(-length // step) * step


@dataclass
class VarlenGroup:
    """One batched dense call: ``n`` samples, each run as ``length`` tokens.

    Either ``start`` (the samples are consecutive, all exactly ``length`` long: the rows
    ``[start, start + n*length)`` of the flattened sequence, viewed as ``[n, length]``, no copy) or
    ``index`` (LongTensor ``[n, length]``: the flattened rows to gather; a sample shorter than
    ``length`` is right-padded with the rows that follow it, clamped to the last row). ``keep``
    (LongTensor, or None when nothing is padding): the rows of the ``[n*length]`` result that are
    real tokens, in order.
    """

    n: int
    length: int
    start: int | None = None
    index: Any = None
    keep: Any = None


@dataclass
class VarlenPlan:
    """:func:`plan_varlen`'s result: ``groups`` in order; the concatenation of their kept rows,
    permuted by ``inverse`` (LongTensor ``[N]``, None when already in order), is the flattened
    sequence of ``N = B*T`` rows. ``lengths``: the samples' lengths in order."""

    groups: list[VarlenGroup]
    inverse: Any
    lengths: list[int] = field(default_factory=list)


def plan_varlen(cu_seqlens: Any, *, pad: bool, pad_below: int = 512, device: Any = None) -> VarlenPlan:
    """Group the samples of ``cu_seqlens`` (``[n+1]``, from :func:`cu_seqlens_from_position_ids`)
    into as few dense calls as possible.

    Samples of equal (with ``pad``: equal *bucketed*, see :func:`bucket_length`) length share one
    call of batch size ``n``. Right-padding is exact only for causal attention: a real query at
    position ``i`` sees keys ``0..i``, all real; padded queries are dropped (``keep``) and padded
    keys are never seen by a real query, so they get zero gradient. Index tensors are on
    ``device``.
    """
    import torch

    cu = [int(x) for x in cu_seqlens.tolist()]
    total = cu[-1]
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    buckets: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        buckets.setdefault(bucket_length(n, pad_below) if pad else n, []).append(i)
    groups: list[VarlenGroup] = []
    order: list[Any] = []
    in_order = True
    expect = 0  # the next row the concatenation must produce for the order to be the identity
    for length, members in buckets.items():
        starts = [cu[i] for i in members]
        exact = all(lengths[i] == length for i in members)
        consecutive = exact and all(b - a == length for a, b in zip(starts, starts[1:]))
        if consecutive:
            groups.append(VarlenGroup(len(members), length, start=starts[0]))
            rows = torch.arange(starts[0], starts[0] + len(members) * length)
        else:
            index = (torch.tensor(starts)[:, None] + torch.arange(length)[None, :]).clamp_(max=total - 1)
            keep = None
            if not exact:
                real = (torch.arange(length)[None, :] < torch.tensor([lengths[i] for i in members])[:, None]).flatten()
                keep = real.nonzero().flatten()
                rows = index.flatten()[keep]
                keep = keep.to(device)
            else:
                rows = index.flatten()
            groups.append(VarlenGroup(len(members), length, index=index.to(device), keep=keep))
        if in_order and (int(rows[0]) != expect or not torch.equal(rows, torch.arange(expect, expect + rows.numel()))):
            in_order = False
        expect += rows.numel()
        order.append(rows)
    inverse = None
    if not in_order:
        perm = torch.cat(order)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel())
        inverse = inverse.to(device)
    return VarlenPlan(groups, inverse, lengths)
