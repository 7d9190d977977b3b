"""Random streams per sample and per rank: draws that differ where the data differs, and never
depend on how the run is laid out over processes and workers.

* **Per sample.** A training sample's stream is derived from ``run.seed`` and its place in the data
  stream: its source, the source's epoch, and the record (``FILE:LINE``, ``FILE row N``)
  (:func:`sample_seed`); each media item of it gets its own (:func:`item_seed`). A data worker
  decodes a sample with the global RNGs (torch, NumPy, ``random``) seeded from it and restored
  after (:func:`seeded`), and the collated batch of an encoder carries its items' seeds under
  :data:`ITEM_SEEDS` (:func:`collate_items`), from which the encoder draws (an augmentation):
  :func:`item_generators`. So two ranks draw differently for their different samples, and 2 ranks
  draw what 1 rank with ``grad_accum 2`` draws for the same samples.
* **Per rank.** What else draws from torch's global RNG while training (dropout) starts from
  :func:`rank_seed` on each rank: the ranks draw differently, and a run repeats exactly (the RNG
  state is kept in checkpoints, so a resume continues it).
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator
from typing import Any

ITEM_SEEDS = "item_seeds"
"""The key of a collated encoder batch that holds its items' seeds (int64 ``[B]``, item order),
present for training batches; read it with :func:`item_generators`."""


def _seed(text: str) -> int:
    """A 63-bit seed from ``text`` (BLAKE2b: the same in every process and Python version)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def sample_seed(run_seed: int, source: str, epoch: int, where: str) -> int:
    """The seed of one training sample: its source, the source's ``epoch`` and its record ``where``."""
    return _seed(f"{run_seed}:sample:{source}:{epoch}:{where}")


def item_seed(sample: int, modality: str, index: int) -> int:
    """The seed of the ``index``-th ``modality`` item of the sample whose seed is ``sample``."""
    return _seed(f"{sample}:{modality}:{index}")


def rank_seed(run_seed: int, rank: int) -> int:
    """The seed of torch's global RNG on ``rank`` once the model is built (dropout)."""
    return _seed(f"{run_seed}:rank:{rank}")


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Inside, torch's CPU RNG, NumPy's global RNG and ``random`` are seeded from ``seed``; after,
    they are as before. ``None``: nothing is touched."""
    if seed is None:
        yield
        return
    import numpy as np
    import torch

    np_state, py_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)


def collate_items(processor: Any, items: list[dict[str, Any]], seeds: list[int] | None = None) -> Any:
    """``processor.collate(items)`` with the items' seeds under :data:`ITEM_SEEDS`: from ``seeds``,
    else from the items' own :data:`ITEM_SEEDS` (an item cut from a collated batch, as a strategy
    that moves items between ranks cuts them), which the processor never sees."""
    import torch

    if seeds is None and items and all(ITEM_SEEDS in it for it in items):
        seeds = [int(it[ITEM_SEEDS]) for it in items]
    batch = processor.collate([{k: v for k, v in it.items() if k != ITEM_SEEDS} for it in items])
    if seeds is not None and isinstance(batch, dict):
        batch[ITEM_SEEDS] = torch.tensor(seeds, dtype=torch.long)
    return batch


def item_generators(batch: Any) -> list[Any] | None:
    """One CPU ``torch.Generator`` per item of a collated encoder batch, seeded with the item's seed
    (:data:`ITEM_SEEDS`), for an encoder's random draws (augmentation); None when the batch holds no
    seeds (a batch not from the training data: draw from torch's global RNG, as without it)."""
    import torch

    seeds = batch.get(ITEM_SEEDS) if isinstance(batch, dict) else None
    if seeds is None or getattr(seeds, "is_meta", False):  # on meta (a plan's FLOP count): no values to draw from
        return None
    return [torch.Generator().manual_seed(int(s)) for s in seeds.reshape(-1).tolist()]
