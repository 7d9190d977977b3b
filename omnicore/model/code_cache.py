"""Decoder target codes kept in memory, so a frozen tokenizer encodes each target once.

A decoder turns its training targets into codes with its own tokenizer (an image VQ, an audio codec)
on every step (:meth:`omnicore.components.Decoder.encode`). When that tokenizer is frozen, the codes
of a target never change, and over several epochs the same target is encoded again and again, a
cost that grows with the target while a lookup does not (``bench/code_cache.py`` measures both;
its figures are in ``bench/README.md``).
:class:`CodeCache` keeps the codes of each target, keyed by a digest of its collated-to-be features
(:func:`omnicore.data.packing.features_digest`), so an augmented or otherwise different target is a
different key and never gets stale codes.

The core uses the cache only for a decoder whose ``fixed_codes`` attribute is true (its ``encode``
is a deterministic function of the features that training does not change: a frozen tokenizer in
eval mode; see :class:`omnicore.components.Decoder`), and only while ``train.code_cache_mb`` is
above 0. It evicts the least recently used codes beyond that budget. It helps when targets repeat
(epochs over a dataset); a single pass over a million targets gains nothing and should tokenize its
targets offline instead.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch

ENTRY_OVERHEAD = 256
"""Bytes counted per kept target besides its codes: the key (a tuple and a 32-character digest), the
``bytes`` object's header and the ordered dict's node (measured with ``tracemalloc`` on CPython 3.11:
about 245 bytes)."""


_DTYPE = {b"h": np.dtype(np.int16), b"i": np.dtype(np.int32)}
"""The one-byte tag that starts each kept ``bytes`` object: the dtype of the codes after it."""


class CodeCache:
    """Codes per ``(modality, digest)``, least recently used evicted beyond ``max_bytes``.

    Each target's codes are kept as one ``bytes`` object on the host: a one-byte tag, then the codes
    as int16 when every code of the batch fits (a codebook below 32768), else int32. They are handed back as
    LongTensor on the caller's device. ``bytes`` counts the codes plus :data:`ENTRY_OVERHEAD` per
    target, so ``max_bytes`` bounds the host memory the cache holds (give or take the allocator).

    Args:
        max_bytes: the budget (bytes).

    Raises:
        ValueError: ``max_bytes`` is negative.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"CodeCache: max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._codes: OrderedDict[tuple[str, str], bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._codes)

    def lookup(self, modality: str, keys: list[tuple[str | None, int]], device: Any = None, *, width: int = 1) -> torch.Tensor | None:
        """The codes of every item of ``keys`` (``(digest, num_codes)`` in item order), concatenated:
        LongTensor ``[sum(num_codes)]`` on ``device`` (``[sum(num_codes), width]`` for a decoder with
        ``width`` codebooks per frame); None (and every item counted as a miss) when any item is
        absent, has no digest or was kept with another width, since the decoder then encodes the
        whole batch anyway."""
        found = self._found(modality, keys, width)
        if found is None:
            self.misses += len(keys)
            return None
        for d, _ in keys:
            self._codes.move_to_end((modality, d))  # type: ignore[arg-type]
        parts = [np.frombuffer(b, dtype=_DTYPE[b[:1]], offset=1) for b in found]  # type: ignore[index]
        self.hits += len(keys)
        codes = torch.from_numpy(np.concatenate(parts).astype(np.int64)).to(device)
        return codes if width == 1 else codes.reshape(-1, width)

    def holds(self, modality: str, keys: list[tuple[str | None, int]], *, width: int = 1) -> bool:
        """Whether :meth:`lookup` would find every item of ``keys`` (nothing counted or reordered):
        the decoder's ``encode`` will not run for them (:mod:`omnicore.model.flops` counts so)."""
        return self._found(modality, keys, width) is not None

    def _found(self, modality: str, keys: list[tuple[str | None, int]], width: int) -> list[bytes] | None:
        found = [self._codes.get((modality, d)) if d is not None else None for d, _ in keys]
        if not keys or any(b is None or len(b) != 1 + _DTYPE[b[:1]].itemsize * n * width for b, (_, n) in zip(found, keys)):
            return None
        return found  # type: ignore[return-value]

    def store(self, modality: str, keys: list[tuple[str | None, int]], codes: torch.Tensor) -> bool:
        """Keep ``codes`` (LongTensor ``[sum(num_codes)]``, or ``[sum(num_codes), K]`` with ``K``
        codebooks per frame: the batch's codes in item order) per item of ``keys`` (an item without a
        digest is not kept); returns False (nothing kept) when the counts do not add up to ``codes``'
        length or the budget is 0."""
        counts = [n for _, n in keys]
        if sum(counts) != codes.shape[0] or self.max_bytes == 0:
            return False
        small = codes.numel() == 0 or (
            int(codes.min()) >= torch.iinfo(torch.int16).min and int(codes.max()) <= torch.iinfo(torch.int16).max
        )
        tag = b"h" if small else b"i"
        stored = codes.detach().cpu().numpy().astype(_DTYPE[tag])
        start = 0
        for d, n in keys:
            part, start = tag + stored[start : start + n].reshape(-1).tobytes(), start + n
            if d is None:
                continue
            key = (modality, d)
            if key in self._codes:
                self.bytes -= len(self._codes.pop(key)) + ENTRY_OVERHEAD
            self._codes[key] = part
            self.bytes += len(part) + ENTRY_OVERHEAD
        while self.bytes > self.max_bytes and self._codes:
            _, old = self._codes.popitem(last=False)
            self.bytes -= len(old) + ENTRY_OVERHEAD
        return True

    def describe(self) -> str:
        """``code cache: 1,234 targets (0.5 MiB of 256 MiB), 96.1% of lookups hit``."""
        total = self.hits + self.misses
        rate = f"{100 * self.hits / total:.1f}% of lookups hit" if total else "no lookups"
        return f"code cache: {len(self):,} targets ({self.bytes / 2**20:.1f} MiB of {self.max_bytes / 2**20:.0f} MiB), {rate}"
