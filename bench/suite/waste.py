"""Padding waste, pure arithmetic on sample lengths (tokens); no model, no timing.

Pad to longest (the Hugging Face ``Trainer`` with a padding collator): the samples are shuffled
(``random.Random(seed)``, as a random sampler would) and cut into batches of ``batch_size``; each
batch is computed as ``len(batch) x longest`` positions, of which ``sum(lengths)`` are real. Waste is
``1 - real / computed``.

Packing (omnicore): the samples, in a seeded random order, are packed into rows of at most
``max_tokens`` by the packer training runs (:func:`omnicore.data.packing.pack_rows`: windows of
``data.packing_window`` samples, each packed by ``pack_window`` as a data shard's windows are). A
packed row is computed at its own length, so no computed position is padding (waste 0). The
*budget fill* waste ``1 - real / (rows x max_tokens)`` is what padding every row to the fixed
budget would waste; it measures how well the packer fills the budget.
"""

from __future__ import annotations

import random
from typing import Any


def shuffled_batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """The lengths in a seeded random order, cut into consecutive batches (the last may be short)."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    return [[lengths[i] for i in order[k : k + batch_size]] for k in range(0, len(order), batch_size)]


def pad_to_longest(lengths: list[int], batch_size: int, seed: int) -> dict[str, Any]:
    """Positions computed when each batch is padded to its longest sample.

    Returns ``real`` and ``computed`` (token positions), ``batches``, ``mean_batch_tokens`` (padded
    positions per batch) and ``waste`` (fraction of computed positions that are padding)."""
    batches = shuffled_batches(lengths, batch_size, seed)
    real = sum(lengths)
    computed = sum(len(b) * max(b) for b in batches)
    return {
        "batch_size": batch_size,
        "batches": len(batches),
        "real": real,
        "computed": computed,
        "mean_batch_tokens": computed / len(batches),
        "waste": 1 - real / computed,
    }


def choose_batch_size(lengths: list[int], max_tokens: int, seed: int, largest: int = 256) -> int:
    """The batch size whose average padded batch (``len(batch) x longest``, tokens) is closest to
    ``max_tokens``: the padding baseline's equivalent of omnicore's token budget."""
    best, best_gap = 1, float("inf")
    for bs in range(1, min(largest, len(lengths)) + 1):
        gap = abs(pad_to_longest(lengths, bs, seed)["mean_batch_tokens"] - max_tokens)
        if gap < best_gap:
            best, best_gap = bs, gap
    return best


def packing(lengths: list[int], max_tokens: int, seed: int, method: str = "first_fit", window: int | None = None) -> dict[str, Any]:
    """omnicore's packing of one epoch as training packs a data shard: the samples in the order of
    ``random.Random(seed)`` (standing for the shuffle buffer's), packed window by window by
    :func:`omnicore.data.packing.pack_rows` (``method`` is ``data.packing``: ``first_fit`` or
    ``ffd``; ``window`` is ``data.packing_window``, None: its default).

    Returns ``rows``, ``real`` (tokens), ``computed`` (= real: rows are not padded), ``waste`` (0.0)
    and ``budget_fill_waste`` = ``1 - real / (rows x max_tokens)``."""
    from omnicore.config import DataConfig
    from omnicore.data.packing import pack_rows

    class _Len:  # the packer needs only len() and .where of a sample
        def __init__(self, n: int):
            self.n, self.where = n, ""

        def __len__(self) -> int:
            return self.n

    window = window or DataConfig.model_fields["packing_window"].default
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    bins = list(pack_rows([_Len(lengths[i]) for i in order], max_tokens, window=window, method=method))
    real = sum(lengths)
    return {
        "max_tokens": max_tokens,
        "rows": len(bins),
        "real": real,
        "computed": real,
        "waste": 0.0,
        "budget_fill_waste": 1 - real / (len(bins) * max_tokens),
        "method": method,
        "window": window,
    }


def compare(lengths: list[int], max_tokens: int, seed: int, batch_size: int | None = None) -> dict[str, Any]:
    """Pad-to-longest (batch size from :func:`choose_batch_size` unless given) vs packing."""
    bs = batch_size or choose_batch_size(lengths, max_tokens, seed)
    return {
        "pad_to_longest": pad_to_longest(lengths, bs, seed),
        "packed": packing(lengths, max_tokens, seed),
        "packed_ffd": packing(lengths, max_tokens, seed, method="ffd"),
    }
