"""Decoder target codes kept in memory, so a frozen tokenizer encodes each target once.

A decoder turns its training targets into codes with its own tokenizer (an image VQ, an audio codec)
on every step (:meth:`omnicore.components.Decoder.encode`). When that tokenizer is frozen, the codes
of a target never change, and over several epochs the same target is encoded again and again: in
the five-task digits run the MoVQGAN and EnCodec encoders took about 37 ms of a 190 ms CPU step.
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

import torch


class CodeCache:
    """Codes per ``(modality, digest)``, least recently used evicted beyond ``max_bytes``.

    Codes are stored on the CPU as int16 when every code fits (a codebook below 32768), else int32,
    and handed back as LongTensor on the caller's device.

    Args:
        max_bytes: the budget for the stored codes (bytes; keys and bookkeeping not counted).

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
        self._codes: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._codes)

    def lookup(self, modality: str, keys: list[tuple[str, int]], device: Any = None) -> torch.Tensor | None:
        """The codes of every item of ``keys`` (``(digest, num_codes)`` in item order), concatenated:
        LongTensor ``[sum(num_codes)]`` on ``device``; None (and every item counted as a miss) when
        any item is absent, since the decoder then encodes the whole batch anyway."""
        found = [self._codes.get((modality, d)) for d, _ in keys]
        if not keys or any(c is None or c.numel() != n for c, (_, n) in zip(found, keys)):
            self.misses += len(keys)
            return None
        for d, _ in keys:
            self._codes.move_to_end((modality, d))
        self.hits += len(keys)
        return torch.cat(found).to(device=device, dtype=torch.long)  # type: ignore[arg-type]

    def store(self, modality: str, keys: list[tuple[str, int]], codes: torch.Tensor) -> bool:
        """Keep ``codes`` (LongTensor ``[sum(num_codes)]``, the batch's codes in item order) per item of
        ``keys``; returns False (nothing kept) when the counts do not add up to ``codes``' length."""
        counts = [n for _, n in keys]
        if sum(counts) != codes.numel() or self.max_bytes == 0:
            return False
        small = codes.numel() == 0 or (
            int(codes.min()) >= torch.iinfo(torch.int16).min and int(codes.max()) <= torch.iinfo(torch.int16).max
        )
        stored = codes.detach().to(device="cpu", dtype=torch.int16 if small else torch.int32)
        for (d, _), part in zip(keys, stored.split(counts)):
            key = (modality, d)
            if key in self._codes:
                self.bytes -= self._size(self._codes.pop(key))
            part = part.clone()  # its own storage, so evicting one item frees it
            self._codes[key] = part
            self.bytes += self._size(part)
        while self.bytes > self.max_bytes and self._codes:
            _, old = self._codes.popitem(last=False)
            self.bytes -= self._size(old)
        return True

    @staticmethod
    def _size(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def describe(self) -> str:
        """``code cache: 1,234 targets (0.5 MiB of 256 MiB), 96.1% of lookups hit``."""
        total = self.hits + self.misses
        rate = f"{100 * self.hits / total:.1f}% of lookups hit" if total else "no lookups"
        return f"code cache: {len(self):,} targets ({self.bytes / 2**20:.1f} MiB of {self.max_bytes / 2**20:.0f} MiB), {rate}"
