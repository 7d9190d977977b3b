"""Packing samples into token budgets, and collation into the micro-batch the model takes.

A packed micro-batch is one row of at most ``max_tokens`` tokens holding whole samples back to back.
``position_ids`` restart at 0 at each sample; ``cu_seqlens`` marks sample boundaries. With no 2-D
attention mask, transformers derives a block-diagonal causal mask from the restarting
``position_ids`` (``masking_utils.find_packed_sequence_indices``), so attention never crosses samples.

The packer is :func:`pack_window`: one window of samples into rows, first-fit in order or first-fit
decreasing (``data.packing``). Training packs each data shard's stream window by window through it
(:class:`omnicore.data.state.ShardPacker`, ``data.packing_window`` samples a window);
:func:`pack_rows` does the same over a finite stream (held-out sets, benchmarks). :func:`collate`
turns one row into a :class:`MicroBatch`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omnicore.data.chat import Encoded
from omnicore.data.seeds import collate_items, item_seed

S = TypeVar("S")


class PackingError(ValueError):
    """A sample does not fit the packing budget; the message names the sample and what to change."""


def map_tensors(obj: Any, fn: Any) -> Any:
    """``obj`` with ``fn(t)`` in place of every tensor ``t`` in it: a tensor, or dataclass instances
    (a :class:`MicroBatch`: a new one, the original untouched), dicts and lists of them nested any
    depth (a micro-batch's ``encoder_inputs``); other values (``decoder_keys``' tuples, ``wheres``)
    as they are."""
    if hasattr(obj, "to") and hasattr(obj, "device"):  # a torch.Tensor, without importing torch here
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [map_tensors(v, fn) for v in obj]
    return obj


def to_device(obj: Any, device: Any) -> Any:
    """``obj`` with every tensor in it moved to ``device`` (:func:`map_tensors`). Used by training,
    validation and generation alike."""
    return map_tensors(obj, lambda t: t.to(device))


def pinned(obj: Any) -> Any:
    """``obj`` with every tensor in it pinned (page-locked, for asynchronous copies to CUDA:
    ``data.pin_memory``), nested ones included (:func:`map_tensors`)."""
    return map_tensors(obj, lambda t: t.pin_memory())


class FreeSpaceIndex:
    """The free space of open bins in a max segment tree: the first bin (lowest index) with at
    least ``n`` free, and updates, in ``O(log B)`` each (the usual first-fit acceleration; see
    Johnson 1974, "Fast algorithms for bin packing"). Capacity doubles as bins are added."""

    def __init__(self) -> None:
        self.size = 1  # leaves; a power of two
        self.tree = [-1] * 2  # tree[1] is the root; empty leaves hold -1 (fits nothing)
        self.count = 0

    def _grow(self) -> None:
        leaves = self.tree[self.size : self.size + self.count]
        self.size *= 2
        self.tree = [-1] * (2 * self.size)
        self.tree[self.size : self.size + len(leaves)] = leaves
        for i in range(self.size - 1, 0, -1):
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])

    def append(self, free: int) -> None:
        """Open a new bin with ``free`` room (it becomes the last one)."""
        if self.count == self.size:
            self._grow()
        self.count += 1
        self.set(self.count - 1, free)

    def set(self, b: int, free: int) -> None:
        """Bin ``b`` now has ``free`` room."""
        i = self.size + b
        self.tree[i] = free
        i //= 2
        while i:
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])
            i //= 2

    def free(self, b: int) -> int:
        """The room bin ``b`` has left."""
        return self.tree[self.size + b]

    def first_fit(self, n: int) -> int | None:
        """The lowest bin index with room for ``n``, or None."""
        if self.tree[1] < n:
            return None
        i = 1
        while i < self.size:
            i = 2 * i if self.tree[2 * i] >= n else 2 * i + 1
        return i - self.size


def pack_first_fit(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group indices into bins of total length at most ``max_tokens``, first-fit in the given order
    (each sample into the first bin with room). ``O(n log B)`` for ``n`` samples and ``B`` bins,
    through :class:`FreeSpaceIndex` (the plain scan over open bins is ``O(n B)``: quadratic).

    Returns the bins in order of creation, each a list of indices in insertion order.

    Raises:
        PackingError: if one length exceeds ``max_tokens``.
    """
    bins: list[list[int]] = []
    index = FreeSpaceIndex()
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise PackingError(f"sample {i} has {n} tokens, more than the packing budget {max_tokens}")
        b = index.first_fit(n)
        if b is None:
            bins.append([i])
            index.append(max_tokens - n)
        else:
            bins[b].append(i)
            index.set(b, index.free(b) - n)
    return bins


def pack_first_fit_decreasing(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing (Johnson 1973): longest first (equal lengths in the given order), each
    into the first bin with room. Fills rows much closer to ``max_tokens`` than
    :func:`pack_first_fit` in random order, at the price of rows whose samples have similar lengths
    (shuffle the returned bins to spread them). Its cost grows with the bins open at once, so the
    caller packs bounded windows (:func:`pack_window`, the "multipack" idea of packing samplers).

    Returns bins (lists of indices, longest sample first), in order of creation.

    Raises:
        PackingError: if one length exceeds ``max_tokens``.
    """
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise PackingError(f"sample {i} has {n} tokens, more than the packing budget {max_tokens}")
    idx = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [[idx[j] for j in b] for b in pack_first_fit([lengths[i] for i in idx], max_tokens)]


PACKING_METHODS = ("first_fit", "ffd")
"""``data.packing`` choices: :func:`pack_first_fit` in the stream's order, or
:func:`pack_first_fit_decreasing` per window with the rows shuffled after."""


def check_method(method: str) -> None:
    """Check a ``data.packing`` value.

    Raises:
        PackingError: ``method`` is not one of :data:`PACKING_METHODS` (the message names the key).
    """
    if method not in PACKING_METHODS:
        raise PackingError(f"data.packing: unknown method {method!r}; choose one of {', '.join(PACKING_METHODS)}")


def pack_window(samples: Sequence[Any], max_tokens: int, method: str = "first_fit", rng: random.Random | None = None) -> list[list[int]]:
    """The packer: one window of samples into rows of at most ``max_tokens`` tokens, every sample
    in exactly one row. Training packs each window of a data shard with it, and so does
    :func:`pack_rows`.

    Args:
        samples: the window, in stream order; each has ``len()`` (tokens) and ``where``
            (``FILE:LINE``, for errors), as :class:`~omnicore.data.chat.Encoded` does.
        method: ``first_fit`` (:func:`pack_first_fit` in the given order: rows in order of
            opening) or ``ffd`` (:func:`pack_first_fit_decreasing` over the window).
        rng: shuffles the rows of ``ffd`` (which opens the long samples' rows first), so that
            they are spread over the stream; None: rows as packed. ``first_fit`` rows are never
            shuffled: they already follow the stream's order.

    Returns:
        The rows as lists of indices into ``samples``; a pure function of the lengths, ``method``
        and ``rng``'s state.

    Raises:
        PackingError: an unknown ``method``; a sample longer than ``max_tokens`` (``WHERE: sample
            has N tokens, more than data.max_tokens=M``).
    """
    check_method(method)
    lengths = [len(s) for s in samples]
    for s, n in zip(samples, lengths):
        if n > max_tokens:
            raise PackingError(f"{s.where}: sample has {n} tokens, more than data.max_tokens={max_tokens}; raise data.max_tokens")
    if method == "first_fit":
        return pack_first_fit(lengths, max_tokens)
    bins = pack_first_fit_decreasing(lengths, max_tokens)
    if rng is not None:
        rng.shuffle(bins)
    return bins


def pack_rows(samples: Iterable[S], max_tokens: int, *, window: int = 1024, method: str = "first_fit") -> Iterator[list[S]]:
    """A finite stream of samples packed into rows as training packs a data shard: ``window``
    samples at a time (``data.packing_window``; the last window may be shorter), each window by
    :func:`pack_window` without the row shuffle, the rows yielded in order. Deterministic (a
    function of the samples' order and lengths); holds one window of samples at a time.

    Raises:
        PackingError: as :func:`pack_window`; ``window < 1``.
    """
    check_method(method)
    if window < 1:
        raise PackingError(f"data.packing_window must be at least 1, got {window}")
    it = iter(samples)
    while chunk := list(itertools.islice(it, window)):
        for row in pack_window(chunk, max_tokens, method):
            yield [chunk[j] for j in row]


@dataclass
class MicroBatch:
    """One packed row, what :meth:`omnicore.model.omni.OmniModel.forward` takes (``model(mb)``).

    :func:`collate` fills every field. A hand-built row (tests, benchmarks) needs only the first
    three; the model computes ``cu_seqlens`` and ``max_seqlen`` from ``position_ids`` when they are
    None.

    Tensors: ``input_ids``, ``labels``, ``position_ids``: LongTensor ``[1, T]``; ``labels`` already
    shifted (``labels[i]`` is the target at position ``i``), ``-100`` where not trained;
    ``position_ids`` restart at 0 at each sample. ``cu_seqlens``: int32 ``[num_samples + 1]`` (the
    samples' boundaries, FlashAttention's varlen convention) and ``max_seqlen`` (int, the longest
    sample): built here once and handed by the model to the attention kernels.
    ``encoder_inputs`` / ``decoder_inputs``: modality -> collated features of the media in this
    row, in order of appearance. ``n_targets``: text + code targets, which the training loop
    all-reduces before the forward to scale the loss (the model counts its own targets and does not
    read it; None in a hand-built row). ``wheres``: ``FILE:LINE`` of the packed samples, for error
    messages. ``rope_position_ids``: LongTensor ``[3, 1, T]``, the samples' own multi-dimensional
    rotary positions (:mod:`omnicore.data.positions`), each restarting at 0, for an mRoPE
    foundation; None otherwise. ``position_ids`` stays the 1-D restarting row either way (sample
    boundaries). ``decoder_keys``: modality -> ``(digest, num_codes)`` per decoder target, in the
    order of ``decoder_inputs`` (:func:`features_digest`, None for a target it cannot hash; the
    model's :class:`~omnicore.model.code_cache.CodeCache` reuses the codes of a target it has seen);
    empty unless ``collate(..., decoder_keys=True)``.
    """

    input_ids: Any
    labels: Any
    position_ids: Any
    cu_seqlens: Any = None
    max_seqlen: int | None = None
    encoder_inputs: dict[str, Any] = field(default_factory=dict)
    decoder_inputs: dict[str, Any] = field(default_factory=dict)
    n_targets: int | None = None
    wheres: list[str] = field(default_factory=list)
    rope_position_ids: Any = None
    decoder_keys: dict[str, list[tuple[str | None, int]]] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def features_digest(features: dict[str, Any]) -> str | None:
    """A 128-bit BLAKE2b hex digest of one item's features (a processor's ``preprocess`` output), or
    None when a value is of a kind it cannot hash exactly (the item is then never cached).

    Hashed exactly, nested in dicts (by sorted key), lists and tuples any depth: arrays (numpy, or a
    torch tensor taken as its numpy array, so both forms of one item agree; bfloat16 as float32,
    marked) by dtype, shape and bytes; ``None``, bools, ints, floats and strings by type and value.
    Equal features give equal digests in any process; a changed value, shape, dtype or structure
    gives another (barring a 128-bit hash collision)."""
    import numpy as np

    h = hashlib.blake2b(digest_size=16)

    def feed(v: Any) -> bool:
        if hasattr(v, "detach"):  # a torch.Tensor (torch is imported when there are tensors)
            import torch

            t = v.detach().cpu()
            if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its values as float32, marked
                h.update(b"bfloat16")
                t = t.float()
            v = t.numpy()  # the same digest as the item's numpy form (data workers send numpy)
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                return False
            a = np.ascontiguousarray(v)
            h.update(f"a{a.dtype}{a.shape}:".encode() + a.tobytes())
        elif isinstance(v, dict):
            h.update(f"d{len(v)}:".encode())
            for k in sorted(v, key=repr):
                h.update(repr(k).encode() + b"=")
                if not feed(v[k]):
                    return False
        elif isinstance(v, (list, tuple)):
            h.update(f"{type(v).__name__[0]}{len(v)}:".encode())
            return all(feed(x) for x in v)
        elif v is None or isinstance(v, (bool, int, float, str, np.generic)):
            h.update(f"s{type(v).__name__}:{v!r};".encode())
        else:
            return False
        return True

    return h.hexdigest() if feed(features) else None


def collate(samples: list[Encoded], encoders: dict[str, Any], decoders: dict[str, Any], *, decoder_keys: bool = False) -> MicroBatch:
    """Concatenate encoded samples into one packed :class:`MicroBatch` (an encoder batch of training
    samples also holds its items' seeds, :func:`omnicore.data.seeds.collate_items`). With ``decoder_keys`` (a
    model with a :class:`~omnicore.model.code_cache.CodeCache` will take it) each decoder target is
    keyed by :func:`features_digest` and its code count (``decoders``' ``num_tokens``); without, no
    digest is computed (BLAKE2b over the features, about 1 ms per MB) and ``decoder_keys`` is empty."""
    import torch

    ids: list[int] = []
    labels: list[int] = []
    pos: list[int] = []
    cu = [0]
    enc_items: dict[str, list[Any]] = {}
    dec_items: dict[str, list[Any]] = {}
    seeds: dict[str, list[int]] = {}  # per encoder item, from its sample's seed (training samples)
    for s in samples:
        ids += s.input_ids
        labels += s.labels
        pos += list(range(len(s)))
        cu.append(cu[-1] + len(s))
        counts: dict[str, int] = {}
        for side, modality, feats in s.media:
            (enc_items if side == "encoder" else dec_items).setdefault(modality, []).append(feats)
            if side == "encoder":
                counts[modality] = k = counts.get(modality, -1) + 1
                seeds.setdefault(modality, []).append(item_seed(s.seed or 0, modality, k))
    seeded = any(s.seed is not None for s in samples)
    return MicroBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        labels=torch.tensor([labels], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32),
        max_seqlen=max((len(s) for s in samples), default=0),
        encoder_inputs={m: collate_items(encoders[m], v, seeds[m] if seeded else None) for m, v in enc_items.items()},
        decoder_inputs={m: decoders[m].collate(v) for m, v in dec_items.items()},
        n_targets=sum(s.n_targets for s in samples),
        wheres=[s.where for s in samples],
        rope_position_ids=_rope_rows(samples),
        decoder_keys={m: [(features_digest(f), int(decoders[m].num_tokens(f))) for f in v] for m, v in dec_items.items()}
        if decoder_keys
        else {},
    )


def _rope_rows(samples: list[Encoded]) -> Any:
    """``[3, 1, T]`` LongTensor of the samples' 3-D positions, back to back (a sample encoded without
    them gets its text layout); None when no sample has them (every 1-D foundation)."""
    if all(s.rope_position_ids is None for s in samples):
        return None
    import torch

    from omnicore.data.positions import text_positions

    rows: list[list[int]] = [[], [], []]
    for s in samples:
        own = s.rope_position_ids if s.rope_position_ids is not None else text_positions(len(s))
        for r, part in zip(rows, own, strict=True):
            r.extend(part)
    return torch.tensor(rows, dtype=torch.long).unsqueeze(1)
