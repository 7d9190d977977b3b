"""Reading and shuffling: one virtual data shard's raw record stream (nothing decoded here).

**Virtual shards.** The stream is split into ``V = data groups x train.grad_accum`` virtual shards.
Micro-batch ``k`` of every optimizer step on data group ``g`` comes from shard ``v = g * grad_accum
+ k``, and each shard is a deterministic function of ``(run.seed, sources, V, v)`` alone. So two
processes with ``grad_accum 1`` read exactly what one process with ``grad_accum 2`` reads (the same
two shards), and a run resumes on another world size whenever ``V`` is unchanged; when ``V``
changes, :func:`omnicore.data.state.check_resume` stops with the reason (continuing would repeat or
skip samples).

**One shard's stream** (:class:`ShardReader`): position ``p = 0, 1, 2, ...`` draws a source by
weight (``random.Random`` seeded by run seed and shard), then takes that source's next record in this
shard. A source's records for shard ``v`` are its rows ``i`` with ``i % V == v`` (sharded before any
decoding), epoch by epoch (file order shuffled per epoch by the source), through a seeded shuffle
buffer of ``data.shuffle_buffer`` records (the streaming shuffle of ``datasets.IterableDataset`` and
WebDataset). A finite source that runs out starts a new epoch (``on_exhausted: restart``) or ends
the stream (``stop``): training then ends after the last whole step, on every rank together.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from omnicore.data.jsonl import SampleError


class DataExhausted(Exception):
    """A source with ``on_exhausted: stop`` ran out: the stream of this shard ends here."""


def shuffle_buffer(records: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A seeded streaming shuffle: keep ``size`` records, emit a random one as each new one arrives
    (``size <= 1``: the input order). Memory ``O(size)``; deterministic for a given ``rng``."""
    if size <= 1:
        yield from records
        return
    buf: list[Any] = []
    for rec in records:
        if len(buf) < size:
            buf.append(rec)
            continue
        j = rng.randrange(size)
        yield buf[j]
        buf[j] = rec
    rng.shuffle(buf)
    yield from buf


@dataclass
class SourceCursor:
    """Where one source stands in one shard: the epoch and the number of records of it already taken
    (after the shuffle buffer), and whether it has run out for good (``on_exhausted: stop``)."""

    epoch: int = 0
    offset: int = 0


class _SourceStream:
    """One source's records for one shard, epoch after epoch, starting at a :class:`SourceCursor`."""

    def __init__(
        self, source: Any, shard: int, num_shards: int, seed: int, shuffle: bool, buffer: int, limit: int | None, cur: SourceCursor
    ):
        self.source, self.shard, self.num_shards = source, shard, num_shards
        self.seed, self.shuffle, self.buffer = seed, shuffle, buffer
        self.limit = None if limit is None else len(range(shard, limit, num_shards))  # this shard's part of the first `limit` rows
        self.cursor = SourceCursor(cur.epoch, cur.offset)
        self._it = self._epoch(self.cursor.epoch, skip=self.cursor.offset)

    def _epoch(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        recs = self.source.records(epoch, self.shard, self.num_shards, self.seed, self.shuffle)
        if self.limit is not None:
            recs = (r for _, r in zip(range(self.limit), recs))
        if self.shuffle:
            recs = shuffle_buffer(recs, self.buffer, random.Random(f"{self.seed}:{self.source.name}:{self.shard}:{epoch}"))
        for _ in range(skip):
            if next(recs, None) is None:
                break
        return recs

    def next(self) -> tuple[Any, SourceCursor]:
        """The next record and the cursor *after* it.

        Raises:
            DataExhausted: the source ran out and its ``on_exhausted`` is ``stop``.
            SampleError: the source has no record at all for this shard (an empty source).
        """
        rec = next(self._it, None)
        if rec is None:
            if self.source.config.on_exhausted == "stop":
                raise DataExhausted(f"data source {self.source.name!r} ran out in epoch {self.cursor.epoch} (on_exhausted: stop)")
            fresh = self.cursor.offset == 0
            self.cursor = SourceCursor(self.cursor.epoch + 1, 0)
            self._it = self._epoch(self.cursor.epoch)
            rec = next(self._it, None)
            if rec is None or fresh:
                raise SampleError(
                    f"data source {self.source.name!r} has no rows for data shard {self.shard} of {self.num_shards}; "
                    "give it more rows than there are data shards (data groups x train.grad_accum), or remove it"
                )
        self.cursor = SourceCursor(self.cursor.epoch, self.cursor.offset + 1)
        return rec, self.cursor


class ShardReader:
    """The raw record stream of virtual shard ``shard`` of ``num_shards`` (module docstring): yields
    ``(position, source index, record, cursor after it)``; nothing is decoded here.

    Args:
        sources: :class:`omnicore.data.sources.Source` objects (each with ``name``, ``config.weight``,
            ``config.on_exhausted``, ``records(...)``).
        start: the position to start at, with ``cursors`` (one per source) giving each source's next
            record there (from :meth:`DataPipeline.state_dict`); the weighted draws before ``start``
            are replayed (``O(start)`` random numbers, no reading).
    """

    def __init__(
        self,
        sources: list[Any],
        shard: int,
        num_shards: int,
        seed: int,
        *,
        shuffle: bool = True,
        buffer: int = 10000,
        limit: int | None = None,
        start: int = 0,
        cursors: list[SourceCursor] | None = None,
    ):
        cursors = cursors or [SourceCursor() for _ in sources]
        self.streams = [_SourceStream(s, shard, num_shards, seed, shuffle, buffer, limit, c) for s, c in zip(sources, cursors)]
        weights = [float(s.config.weight) for s in sources]
        total = sum(weights)
        self.cum = [sum(weights[: i + 1]) / total for i in range(len(weights))]
        self.rng = random.Random(f"{seed}:mix:{shard}")
        for _ in range(start):
            self._draw()
        self.position = start

    def _draw(self) -> int:
        return min(bisect.bisect_right(self.cum, self.rng.random()), len(self.cum) - 1)

    def __iter__(self) -> Iterator[tuple[int, int, Any, SourceCursor]]:
        while True:
            s = self._draw()
            try:
                rec, cur = self.streams[s].next()
            except DataExhausted:
                return
            yield self.position, s, rec, cur
            self.position += 1
