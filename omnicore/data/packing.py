"""Packing samples into token budgets, collation, and the deterministic micro-batch stream.

A packed micro-batch is one row of at most ``max_tokens`` tokens holding whole samples back to back.
``position_ids`` restart at 0 at each sample; ``cu_seqlens`` marks sample boundaries. With no 2-D
attention mask, transformers derives a block-diagonal causal mask from the restarting
``position_ids`` (``masking_utils.find_packed_sequence_indices``), so attention never crosses samples.

The stream is a pure function of ``(seed, position)``: epoch ``e`` shuffles the samples with
``seed + e``, packs them (``data.packing``: first-fit in that order, or first-fit decreasing per
window with the rows shuffled after), and yields the packed micro-batches in order. A run that stops
after ``k`` micro-batches resumes by skipping ``k``; with ``G = grad_accum * dp`` micro-batches per
optimizer step, rank ``r`` takes micro-batches ``r, r + dp, ...`` of each step's ``G``, so one process
with ``grad_accum = G`` sees exactly the batches that ``G`` processes see together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from omnicore.data.chat import Encoded


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


def pack_first_fit_decreasing(lengths: list[int], max_tokens: int, window: int = 4096) -> list[list[int]]:
    """First-fit decreasing (Johnson 1973) in consecutive windows of ``window`` indices: within a
    window, longest first, each into the first bin with room; a window's bins are closed before the
    next window starts, so the cost is ``O(n x bins per window)`` however long the epoch is (the
    "multipack" idea of packing samplers). Fills rows much closer to ``max_tokens`` than
    :func:`pack_first_fit` in random order, at the price of rows whose samples have similar lengths
    (shuffle the returned bins to spread them).

    Returns bins (lists of indices, longest sample first), window by window.

    Raises:
        PackingError: if one length exceeds ``max_tokens``.
    """
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise PackingError(f"sample {i} has {n} tokens, more than the packing budget {max_tokens}")
    bins: list[list[int]] = []
    for start in range(0, len(lengths), window):
        idx = sorted(range(start, min(start + window, len(lengths))), key=lambda i: -lengths[i])
        local = pack_first_fit([lengths[i] for i in idx], max_tokens)
        bins.extend([idx[j] for j in b] for b in local)
    return bins


PACKING_METHODS = ("first_fit", "ffd")
"""``data.packing`` choices: :func:`pack_first_fit` in the shuffled order, or
:func:`pack_first_fit_decreasing` per window with the bins shuffled after."""


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
    """Concatenate encoded samples into one packed :class:`MicroBatch`. With ``decoder_keys`` (a
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
    for s in samples:
        ids += s.input_ids
        labels += s.labels
        pos += list(range(len(s)))
        cu.append(cu[-1] + len(s))
        for side, modality, feats in s.media:
            (enc_items if side == "encoder" else dec_items).setdefault(modality, []).append(feats)
    return MicroBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        labels=torch.tensor([labels], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32),
        max_seqlen=max((len(s) for s in samples), default=0),
        encoder_inputs={m: encoders[m].collate(v) for m, v in enc_items.items()},
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


class PackedStream:
    """The deterministic stream of packed micro-batches over epochs (see the module docstring).

    Args:
        samples: encoded samples (the whole training set).
        max_tokens: packing budget per micro-batch.
        seed: base seed; epoch ``e`` shuffles with ``seed + e``.
        shuffle: shuffle each epoch (otherwise file order).
    """

    def __init__(
        self, samples: list[Encoded], max_tokens: int, seed: int, shuffle: bool = True, method: str = "first_fit", window: int = 4096
    ):
        if method not in PACKING_METHODS:
            raise PackingError(f"data.packing: unknown method {method!r}; choose one of {', '.join(PACKING_METHODS)}")
        if not samples:
            raise PackingError("no training samples")
        for s in samples:
            if len(s) > max_tokens:
                raise PackingError(f"{s.where}: sample has {len(s)} tokens, more than data.max_tokens={max_tokens}; raise data.max_tokens")
        self.samples = samples
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.method = method
        self.window = window
        self._epochs: dict[int, list[list[int]]] = {}

    def epoch_bins(self, epoch: int) -> list[list[int]]:
        """Sample indices of every micro-batch of one epoch."""
        if epoch not in self._epochs:
            order = list(range(len(self.samples)))
            rng = random.Random(self.seed + epoch)
            if self.shuffle:
                rng.shuffle(order)
            lengths = [len(self.samples[i]) for i in order]
            if self.method == "ffd":
                bins = pack_first_fit_decreasing(lengths, self.max_tokens, self.window)
                if self.shuffle:
                    rng.shuffle(bins)  # FFD emits long-sample rows first; spread them over the epoch
            else:
                bins = pack_first_fit(lengths, self.max_tokens)
            self._epochs[epoch] = [[order[j] for j in b] for b in bins]
        return self._epochs[epoch]

    def micro_batch(self, index: int) -> list[Encoded]:
        """The samples of global micro-batch ``index`` (counting from the start of epoch 0)."""
        epoch = 0
        while True:
            bins = self.epoch_bins(epoch)
            if index < len(bins):
                return [self.samples[i] for i in bins[index]]
            index -= len(bins)
            epoch += 1

    def epoch_of(self, index: int) -> float:
        """Fractional epoch reached after ``index`` micro-batches."""
        epoch = 0
        while True:
            n = len(self.epoch_bins(epoch))
            if index < n:
                return epoch + index / n
            index -= n
            epoch += 1

    def iter_step(self, step: int, grad_accum: int, dp_rank: int, dp_size: int) -> Iterator[list[Encoded]]:
        """This rank's ``grad_accum`` micro-batches of optimizer step ``step`` (0-based)."""
        per_step = grad_accum * dp_size
        start = step * per_step
        for k in range(grad_accum):
            yield self.micro_batch(start + k * dp_size + dp_rank)
