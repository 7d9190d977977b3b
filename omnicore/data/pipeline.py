"""The training data pipeline: sources -> mixing -> sharding -> DataLoader workers -> packing.

Nothing here holds the dataset in memory, and nothing scales with its size before step 1.

**Virtual shards.** The stream is split into ``V = data groups x train.grad_accum`` virtual shards.
Micro-batch ``k`` of every optimizer step on data group ``g`` comes from shard ``v = g * grad_accum
+ k``, and each shard is a deterministic function of ``(run.seed, sources, V, v)`` alone. So two
processes with ``grad_accum 1`` read exactly what one process with ``grad_accum 2`` reads (the same
two shards), and a run resumes on another world size whenever ``V`` is unchanged; when ``V``
changes, :func:`check_resume` stops with the reason (continuing would repeat or skip samples).

**One shard's stream** (:class:`ShardReader`): position ``p = 0, 1, 2, ...`` draws a source by
weight (``random.Random`` seeded by run seed and shard), then takes that source's next record in this
shard. A source's records for shard ``v`` are its rows ``i`` with ``i % V == v`` (sharded before any
decoding), epoch by epoch (file order shuffled per epoch by the source), through a seeded shuffle
buffer of ``data.shuffle_buffer`` records (the streaming shuffle of ``datasets.IterableDataset`` and
WebDataset). A finite source that runs out starts a new epoch (``on_exhausted: restart``) or ends
the stream (``stop``): training then ends after the last whole step, on every rank together.

**Workers.** The records of a shard are decoded in fixed chunks of positions. Each rank has one
``torch.utils.data.DataLoader`` over an :class:`ShardChunks` dataset whose item ``i`` is chunk
``i // grad_accum`` of the rank's shard ``i % grad_accum``; worker ``w`` of ``W`` makes the items
``i % W == w`` (reading, but not decoding, the records of the others), and the DataLoader hands them
back in item order. A chunk is a list of encoded samples (media decoded, preprocessed by the
components' *processors*, tokenised), or of the :class:`SampleError` of a bad one, in position
order, so the stream does not depend on ``W``: the training process never decodes media.

**Packing** (:class:`ShardPacker`, in the training process): positions are taken in windows of
``data.packing_window``; each window's samples are packed into rows of ``data.max_tokens``
(first-fit in stream order through :class:`~omnicore.data.packing.FreeSpaceIndex`, ``O(n log B)``,
or first-fit decreasing with the rows shuffled), and its rows are collated one per micro-batch. No
epoch-wide length table exists, so streaming sources pack like files do.

**Resume** (:meth:`DataPipeline.state_dict`): per shard, the window's first position, the rows of
it already used, each source's next record (epoch, offset) and the counts per source; on resume the
window is read again, packed again (deterministically) and its used rows are skipped: the next
micro-batch is exactly the one a run without the stop would have read, workers included.
"""

from __future__ import annotations

import atexit
import bisect
import copy
import math
import os
import random
import time
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Dataset

from omnicore.data.chat import ChatProcessor, Encoded
from omnicore.data.jsonl import SampleError
from omnicore.data.packing import PACKING_METHODS, PackingError, collate, map_tensors, pack_first_fit, pack_first_fit_decreasing


class DataExhausted(Exception):
    """A source with ``on_exhausted: stop`` ran out: the stream of this shard ends here."""


class DataResumeError(ValueError):
    """A checkpoint's data position cannot be continued by this run's layout; the message says why
    and which world size / ``grad_accum`` would continue it."""


class DataWorkerError(RuntimeError):
    """A DataLoader worker died (killed, out of memory) or failed outside a sample; names what to do."""


# ---------------------------------------------------------------------------------------------
# one shard's raw record stream
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# decoding in workers
# ---------------------------------------------------------------------------------------------


@dataclass
class Entry:
    """One position of a shard after decoding: its source, the cursor after its record, and the
    encoded sample or the message of the :class:`SampleError` that made it a bad sample."""

    source: int
    cursor: SourceCursor
    sample: Encoded | None = None
    error: str | None = None


@dataclass
class Chunk:
    """Positions ``[start, start + len(entries))`` of shard slot ``k`` (the rank's ``k``-th shard);
    ``end``: the shard's stream ended inside this chunk (no positions after it)."""

    k: int
    start: int
    entries: list[Entry] = field(default_factory=list)
    end: bool = False
    error: str | None = None  # reading the shard failed here (not one sample): the stream cannot go on


class ShardChunks(Dataset):
    """The dataset each rank's DataLoader reads (module docstring): item ``(k, j)`` is chunk ``j``
    (positions ``[j * chunk, (j + 1) * chunk)``) of the rank's shard slot ``k``, decoded. The
    training process asks for chunks by demand (:class:`DemandSampler`), in increasing ``j`` per
    slot, so each worker reads every shard stream forward once, decoding only the chunks it is asked
    for (it reads past the others' chunks without decoding them).

    Args:
        sources: the run's sources; ``chat``: the :class:`ChatProcessor` (tokenizer and processors,
            never the model); ``shards``: this rank's virtual shard ids; ``starts`` / ``cursors``:
            where each shard resumes (multiples of ``chunk``).
    """

    def __init__(self, sources: list[Any], chat: ChatProcessor, shards: list[int], num_shards: int, *, chunk: int, opts: dict[str, Any]):
        self.sources, self.chat, self.shards, self.num_shards = sources, chat, shards, num_shards
        self.chunk, self.opts = chunk, opts
        self.starts = [0] * len(shards)
        self.cursors: list[list[SourceCursor] | None] = [None] * len(shards)
        self.in_worker = False
        self._readers: list[Iterator[tuple[int, int, Any, SourceCursor]] | None] = []
        self._next: list[int] = []
        self._ended: list[bool] = []

    def _decode(self, s: int, rec: Any) -> tuple[Encoded | None, str | None]:
        try:
            enc = self.chat.encode(self.sources[s].to_sample(rec))
        except SampleError as exc:
            return None, str(exc)
        except Exception as exc:  # a processor or reader failing on this record: still name it
            return None, f"{rec.where}: {type(exc).__name__}: {' '.join(str(exc).split())}"
        if self.in_worker:
            enc.media = [(side, m, _features_as(f, to_numpy=True)) for side, m, f in enc.media]
        return enc, None

    def _chunk(self, k: int, start: int, decode: bool) -> Chunk:
        out = Chunk(k, start)
        reader = self._readers[k]
        for _ in range(self.chunk):
            try:
                item = next(reader, None)
            except SampleError as exc:  # e.g. a source without rows for this shard
                out.error = str(exc)
                item = None
            if item is None:
                out.end = True
                break
            _, s, rec, cur = item
            sample, error = self._decode(s, rec) if decode else (None, None)
            out.entries.append(Entry(s, cur, sample, error))
        self._next[k] += len(out.entries)
        self._ended[k] = out.end
        return out

    def _reader(self, k: int) -> Iterator[tuple[int, int, Any, SourceCursor]]:
        o = self.opts
        return iter(ShardReader(self.sources, self.shards[k], self.num_shards, o["seed"], shuffle=o["shuffle"], buffer=o["buffer"],
                                limit=o["limit"], start=self.starts[k], cursors=self.cursors[k]))  # fmt: skip

    def __getitem__(self, index: tuple[int, int]) -> Chunk:
        from torch.utils.data import get_worker_info

        k, j = index
        if not self._readers:
            self.in_worker = get_worker_info() is not None
            self._readers = [None] * len(self.shards)
            self._next, self._ended = list(self.starts), [False] * len(self.shards)
        if self._readers[k] is None:
            self._readers[k] = self._reader(k)
        start = j * self.chunk
        while self._next[k] < start and not self._ended[k]:
            self._chunk(k, self._next[k], decode=False)  # another worker's chunk: read past it
        if self._ended[k]:
            return Chunk(k, start, end=True)
        if self._next[k] != start:
            raise RuntimeError(f"chunk {j} of shard slot {k} asked for after position {self._next[k]}; chunks must come in order")
        return self._chunk(k, start, decode=True)

    def __len__(self) -> int:  # a sampler decides what is read; the stream has no fixed length
        raise TypeError("ShardChunks has no length")


class DemandSampler:
    """The chunk requests of a rank's DataLoader: each next request is the next chunk of the shard
    slot that has the fewest decoded positions waiting or on their way, so that the training process
    holds about the same, bounded amount for every slot however unevenly they are used (with
    ``grad_accum > 1`` shards pack different numbers of samples per row). What a chunk holds does not
    depend on when it is asked for, so the stream stays a function of the seed."""

    def __init__(self, pipe: DataPipeline):
        self.pipe = pipe

    def __iter__(self) -> Iterator[tuple[int, int]]:
        p = self.pipe
        p._issued = [st // p.chunk for st in (pk.state.window_start for pk in p.packers)]
        p._received = list(p._issued)
        while True:
            live = [k for k in range(len(p.shards)) if not p._ended[k]] or list(range(len(p.shards)))
            k = min(live, key=lambda k: len(p._queues[k]) + (p._issued[k] - p._received[k]) * p.chunk)
            yield k, p._issued[k]
            p._issued[k] += 1


# ---------------------------------------------------------------------------------------------
# packing in the training process
# ---------------------------------------------------------------------------------------------


@dataclass
class ShardState:
    """What a checkpoint keeps of one shard (JSON): the current window's first position, the rows of
    it already used, each source's cursor at the window's start, samples used and skipped per source."""

    window_start: int = 0
    used_rows: int = 0
    cursors: list[list[int]] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    ended: bool = False


class ShardPacker:
    """Windows of one shard's decoded entries packed into rows (module docstring)."""

    def __init__(self, n_sources: int, shard: int, *, window: int, max_tokens: int, method: str, seed: int, shuffle: bool, on_error: str):
        self.shard, self.window, self.max_tokens = shard, window, max_tokens
        self.method, self.seed, self.shuffle, self.on_error = method, seed, shuffle, on_error
        self.state = ShardState(cursors=[[0, 0] for _ in range(n_sources)], seen=[0] * n_sources, skipped=[0] * n_sources)
        self.rows: list[list[Entry]] = []
        self.next_row = 0
        self.filled = False  # a window is loaded (rows hold it)
        self.window_len = 0  # positions in the loaded window
        self.last_window = False  # the stream ended inside the loaded window
        self.last_cursor: list[list[int]] = [list(c) for c in self.state.cursors]

    def fill(self, entries: list[Entry], ended: bool) -> None:
        """Pack one window (``entries``: its positions in order; fewer than ``window`` when the stream
        ended). On resume the rows used before the checkpoint (``state.used_rows``) are passed over,
        and the window's bad samples are not counted again.

        Raises:
            SampleError: a bad sample under ``data.on_error: raise`` (its ``FILE:LINE: why``).
            PackingError: a sample longer than ``max_tokens`` (the chat processor normally refuses it first).
        """
        good: list[Entry] = []
        for e in entries:
            self.last_cursor[e.source] = [e.cursor.epoch, e.cursor.offset]
            if e.error is None:
                good.append(e)
            elif self.on_error != "skip":
                raise SampleError(e.error)
            elif self.state.used_rows == 0:
                self.state.skipped[e.source] += 1
        lengths = [len(e.sample) for e in good]
        if self.method == "ffd":
            bins = pack_first_fit_decreasing(lengths, self.max_tokens, window=max(1, len(lengths)))
            if self.shuffle:
                random.Random(f"{self.seed}:rows:{self.shard}:{self.state.window_start}").shuffle(bins)
        else:
            bins = pack_first_fit(lengths, self.max_tokens)
        self.rows = [[good[j] for j in b] for b in bins]
        self.next_row = self.state.used_rows
        self.filled, self.window_len, self.last_window = True, len(entries), ended

    def take(self) -> list[Entry] | None:
        """The next row of the loaded window, or None when it is used up (or none is loaded)."""
        if self.next_row >= len(self.rows):
            return None
        row = self.rows[self.next_row]
        self.next_row += 1
        self.state.used_rows = self.next_row
        for e in row:
            self.state.seen[e.source] += 1
        return row

    def advance(self) -> None:
        """Move the state past the loaded window."""
        self.state.window_start += self.window_len
        self.state.used_rows = 0
        self.state.cursors = [list(c) for c in self.last_cursor]
        self.rows, self.next_row, self.filled = [], 0, False


# ---------------------------------------------------------------------------------------------
# the pipeline a rank iterates
# ---------------------------------------------------------------------------------------------


EMPTY_WINDOWS = 4
"""Packing windows in a row without one usable sample after which a shard gives up (every sample
bad, under ``data.on_error: skip``)."""


def chunk_size(window: int) -> int:
    """Positions per worker item: the largest of 16, 8, 4, 2, 1 that divides ``window`` (windows
    start on chunk boundaries, which resume relies on)."""
    return math.gcd(window, 16)


class DataPipeline:
    """This rank's micro-batches, step by step (module docstring).

    Args:
        sources: opened sources (:func:`omnicore.data.sources.open_source`).
        chat: the :class:`ChatProcessor` built from the tokenizer and the components' processors.
        data: the config's ``data`` section; ``seed``: ``run.seed``.
        data_rank, data_size: this rank's data group and the number of groups; ``grad_accum``:
            micro-batches per step (the rank's shards are ``data_rank * grad_accum + k``).
        pin_memory: pin collated tensors (CUDA only).
        decoder_keys: key each decoder target by its features' digest in the collated micro-batches
            (:func:`~omnicore.data.packing.collate`), for the model's code cache (``train.code_cache_mb``).

    Raises:
        PackingError: unknown ``data.packing``.
    """

    def __init__(
        self,
        sources: list[Any],
        chat: ChatProcessor,
        data: Any,
        seed: int,
        *,
        data_rank: int,
        data_size: int,
        grad_accum: int,
        pin_memory: bool = False,
        decoder_keys: bool = False,
    ):
        if data.packing not in PACKING_METHODS:
            raise PackingError(f"data.packing: unknown method {data.packing!r}; choose one of {', '.join(PACKING_METHODS)}")
        self.sources, self.chat, self.data, self.seed = sources, chat, data, seed
        self.grad_accum, self.num_shards = grad_accum, data_size * grad_accum
        self.shards = [data_rank * grad_accum + k for k in range(grad_accum)]
        self.window = data.packing_window
        self.chunk = chunk_size(self.window)
        self.pin_memory = pin_memory
        self.decoder_keys = decoder_keys
        self.packers = [
            ShardPacker(len(sources), v, window=self.window, max_tokens=data.max_tokens, method=data.packing, seed=seed,
                        shuffle=data.shuffle, on_error=data.on_error)
            for v in self.shards
        ]  # fmt: skip
        self._it: Iterator[Chunk] | None = None
        self._queues: list[deque[Entry]] = [deque() for _ in self.shards]
        self._ended = [False] * len(self.shards)
        self._errors: list[str | None] = [None] * len(self.shards)
        self._issued = [0] * len(self.shards)  # chunks asked for, per slot (DemandSampler)
        self._received = [0] * len(self.shards)  # chunks arrived, per slot
        self._before: list[ShardState] | None = None  # the packers' states before the last step
        _LIVE.add(self)
        self.wait_s = 0.0  # seconds spent waiting for data since the last :meth:`take_wait`

    @property
    def source_names(self) -> list[str]:
        return [s.name for s in self.sources]

    # ---- the DataLoader ------------------------------------------------------------------------
    def _loader(self) -> Iterator[Chunk]:
        from torch.utils.data import DataLoader

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # workers are forked after the tokenizer is used
        d = self.data
        opts = {"seed": self.seed, "shuffle": d.shuffle, "buffer": d.shuffle_buffer, "limit": d.max_samples}
        ds = ShardChunks(self.sources, self.chat, self.shards, self.num_shards, chunk=self.chunk, opts=opts)
        for k, p in enumerate(self.packers):
            ds.starts[k] = p.state.window_start
            ds.cursors[k] = [SourceCursor(e, o) for e, o in p.state.cursors]
        kwargs: dict[str, Any] = {"batch_size": None, "num_workers": d.num_workers, "sampler": DemandSampler(self)}
        if d.num_workers > 0:
            # the packer takes a whole window at once: keep two windows of every shard in flight, so
            # the workers decode the next one while the model trains on this one
            ahead = math.ceil(2 * self.window * self.grad_accum / (self.chunk * d.num_workers))
            kwargs.update(prefetch_factor=max(d.prefetch_factor, ahead), persistent_workers=False, worker_init_fn=_worker_init)
        return iter(DataLoader(ds, **kwargs))

    def _next_entry(self, k: int) -> Entry | None:
        """The next decoded position of shard slot ``k``; None when its stream ended.

        Raises:
            SampleError: reading the shard failed (not one sample: e.g. a source without rows for it).
        """
        q = self._queues[k]
        while not q:
            if self._ended[k]:
                if self._errors[k]:
                    raise SampleError(self._errors[k])
                return None
            chunk = self._fetch()
            self._received[chunk.k] += 1
            for e in chunk.entries:
                if e.sample is not None and e.sample.media:
                    e.sample.media = [(side, m, _features_as(f, to_numpy=False)) for side, m, f in e.sample.media]
            self._queues[chunk.k].extend(chunk.entries)
            self._ended[chunk.k] = self._ended[chunk.k] or chunk.end
            self._errors[chunk.k] = self._errors[chunk.k] or chunk.error
        return q.popleft()

    def _fetch(self) -> Chunk:
        if self._it is None:
            self._it = self._loader()
        try:
            return next(self._it)
        except StopIteration:  # the sampler never ends; kept for safety
            raise DataExhausted("the data stream ended") from None
        except RuntimeError as exc:
            text = " ".join(str(exc).split())
            if "DataLoader worker" in text and ("exited unexpectedly" in text or "killed by signal" in text):
                raise DataWorkerError(
                    f"a data worker died: {text}; data.num_workers {self.data.num_workers} (too little memory for the workers? "
                    "try fewer, or 0 to read in the training process and see the error)"
                ) from exc
            raise

    def _row(self, k: int) -> list[Entry]:
        """The next packed row of shard slot ``k``.

        Raises:
            DataExhausted: the shard's stream ended (a source with ``on_exhausted: stop``).
            SampleError: a bad sample under ``data.on_error: raise``; or, under ``skip``,
                :data:`EMPTY_WINDOWS` windows in a row without one usable sample (all bad: a wrong
                media folder, ``max_tokens`` below every sample), which would otherwise loop forever.
        """
        p, empty = self.packers[k], 0
        while True:
            row = p.take()
            if row is not None:
                return row
            if p.filled:
                if p.last_window:
                    raise DataExhausted(f"data shard {self.shards[k]} ended")
                p.advance()
            entries = []
            while len(entries) < self.window:
                e = self._next_entry(k)
                if e is None:
                    break
                entries.append(e)
            p.fill(entries, ended=len(entries) < self.window)
            empty = empty + 1 if entries and not p.rows else 0
            if empty >= EMPTY_WINDOWS:
                last = next((e.error for e in reversed(entries) if e.error), "no error recorded")
                raise SampleError(
                    f"data shard {self.shards[k]}: none of the last {empty * self.window} samples could be used, every one was bad "
                    f"(data.on_error: skip); the last: {last}"
                )

    def step(self) -> list[Any]:
        """This rank's ``grad_accum`` collated micro-batches of the next step
        (:class:`~omnicore.data.packing.MicroBatch`, each with ``sources``: its samples per source).

        Raises:
            DataExhausted: a source with ``on_exhausted: stop`` ran out (on this rank).
            SampleError: a bad sample under ``data.on_error: raise``.
            DataWorkerError: a worker died.
        """
        t0 = time.perf_counter()
        before = [copy.deepcopy(p.state) for p in self.packers]
        self._before = before
        out = []
        for k in range(self.grad_accum):
            try:
                row = self._row(k)
            except DataExhausted:
                for p, st in zip(self.packers, before):  # a checkpoint keeps the position after the last whole step
                    p.state = st
                raise
            mb = collate([e.sample for e in row], self.chat.encoders, self.chat.decoders, decoder_keys=self.decoder_keys)
            if self.pin_memory:
                mb = _pin(mb)
            out.append(mb)
        self.wait_s += time.perf_counter() - t0
        return out

    def rewind(self) -> None:
        """Put the data position back to before the last :meth:`step` (its micro-batches were not
        trained: another rank's data ran out), so that a checkpoint keeps the position after the
        last whole step on every rank."""
        if self._before is not None:
            for p, st in zip(self.packers, self._before):
                p.state = copy.deepcopy(st)

    def close(self, *, now: bool = False) -> None:
        """Shut the DataLoader workers down (``now``: terminate them first instead of letting them
        finish what they were asked for: at interpreter exit, for pipelines never closed); a worker
        still alive after torch's shutdown is killed."""
        it, self._it = self._it, None
        workers = list(getattr(it, "_workers", []))
        if now:
            for w in workers:
                if w.is_alive():
                    w.terminate()  # SIGTERM: the worker exits with status 0 (_worker_init)
            for w in workers:
                w.join(timeout=2)
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        for w in workers:
            if w.is_alive():
                w.kill()
                w.join(timeout=5)

    def take_wait(self) -> float:
        """Seconds spent in :meth:`step` since the last call."""
        w, self.wait_s = self.wait_s, 0.0
        return w

    def counts(self) -> tuple[list[int], list[int]]:
        """Samples used and bad samples skipped so far, per source, over this rank's shards."""
        seen = [sum(p.state.seen[i] for p in self.packers) for i in range(len(self.sources))]
        skipped = [sum(p.state.skipped[i] for p in self.packers) for i in range(len(self.sources))]
        return seen, skipped

    # ---- checkpoint state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's shards' positions (JSON-able): ``{"num_shards", "sources", "shards": {v: ShardState}}``."""
        return {
            "num_shards": self.num_shards,
            "sources": self.source_names,
            "settings": self.settings(),
            "shards": {str(v): vars(p.state) for v, p in zip(self.shards, self.packers)},
        }

    def settings(self) -> dict[str, Any]:
        """The settings each shard's order and packing depend on (kept in checkpoints: a resume with
        any of them changed would re-pack the current window differently and repeat or skip samples)."""
        d = self.data
        out: dict[str, Any] = {"run.seed": self.seed}
        for key in ("max_tokens", "packing", "packing_window", "shuffle", "shuffle_buffer", "max_samples", "on_error", "chat_template"):
            out[f"data.{key}"] = getattr(d, key)
        for s in self.sources:
            out[f"weight of source {s.name}"] = float(s.config.weight)
        return out

    def load_state_dict(self, merged: dict[str, Any]) -> None:
        """Continue from a checkpoint's data state (every rank's shards merged, :func:`merge_states`).

        Raises:
            DataResumeError: see :func:`check_resume`.
        """
        check_resume(merged, self.num_shards, self.source_names, self.grad_accum)
        changed = [(k, v, self.settings().get(k)) for k, v in merged.get("settings", {}).items() if self.settings().get(k) != v]
        if changed:
            what = "; ".join(f"{k} was {v!r}, now {now!r}" for k, v, now in changed)
            raise DataResumeError(
                f"the data settings differ from the checkpoint's ({what}); the current packing window would be read differently and "
                "samples repeated or skipped: resume with the checkpoint's settings, or start a new run"
            )
        for v, p in zip(self.shards, self.packers):
            st = merged["shards"][str(v)]
            p.state = ShardState(**st)
            p.last_cursor = [list(c) for c in p.state.cursors]
        self._it = None


_LIVE: weakref.WeakSet[DataPipeline] = weakref.WeakSet()
"""Pipelines that may hold workers, closed at interpreter exit (:func:`_close_all`)."""


@atexit.register
def _close_all() -> None:
    for pipe in list(_LIVE):
        pipe.close(now=True)


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One data state from every rank's :meth:`DataPipeline.state_dict` (ranks of one data group hold
    the same shards)."""
    merged = dict(states[0], shards={})
    for st in states:
        merged["shards"].update(st["shards"])
    return merged


def check_resume(saved: dict[str, Any], num_shards: int, sources: list[str], grad_accum: int) -> None:
    """Whether this run's layout continues a checkpoint's data position.

    Raises:
        DataResumeError: the checkpoint's stream has another number of virtual shards (data groups x
            ``grad_accum``): each shard's order depends on it, so continuing would repeat or skip
            samples; the message names a layout that continues it. Or the sources differ.
    """
    old = int(saved["num_shards"])
    if saved.get("sources") != sources:
        raise DataResumeError(
            f"the checkpoint was trained on the data sources {saved.get('sources')}, this run has {sources}; resume with the same "
            "data.sources (names and order), or start a new run"
        )
    if old != num_shards:
        groups = max(1, old // grad_accum) if old % grad_accum == 0 else None
        hint = (
            f"for example {groups} data-parallel group(s) with train.grad_accum {grad_accum}, or 1 group with train.grad_accum {old}"
            if groups
            else f"for example 1 data-parallel group with train.grad_accum {old}"
        )
        raise DataResumeError(
            f"the checkpoint's data stream is split into {old} virtual shards (data-parallel groups x train.grad_accum), this run "
            f"into {num_shards}; each shard's sample order depends on that number, so continuing would repeat or skip samples. "
            f"Resume with data groups x grad_accum = {old} ({hint})"
        )


def _features_as(features: dict[str, Any], *, to_numpy: bool) -> dict[str, Any]:
    """One item's features with their tensors as numpy arrays (``to_numpy``) or back (zero-copy).
    Workers send numpy: a tensor crosses processes as a shared-memory segment of its own (a file
    descriptor sent and mapped per tensor), which for thousands of small feature tensors per window
    costs the training process more than decoding them would; a pickled array is plain bytes."""
    import numpy as np
    import torch

    out = {}
    for k, v in features.items():
        if to_numpy and isinstance(v, torch.Tensor) and v.dtype != torch.bfloat16:
            out[k] = v.numpy()
        elif not to_numpy and isinstance(v, np.ndarray):
            out[k] = torch.from_numpy(v)
        else:
            out[k] = v
    return out


def _worker_init(worker_id: int) -> None:
    """How a worker meets signals and the end of its training process.

    SIGTERM (a scheduler signals every process of a job; ``multiprocessing`` terminates daemon
    processes at exit) ends the worker at once with exit status 0: torch reports a worker that died
    of a signal or exited non-zero as an error in the training process, which must instead finish
    its step and save (it holds the step's micro-batches already). SIGINT (Ctrl-C reaches the whole
    process group) is left to the training process. A daemon thread ends the worker within a second
    once the training process is gone: torch's own check cannot end a worker whose result queue is
    full, so a killed run would leave its workers behind."""
    import signal
    import threading

    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="omnicore-parent-watch", daemon=True).start()


def _pin(mb: Any) -> Any:
    """``mb`` with every tensor in its fields pinned (page-locked, for asynchronous copies to CUDA),
    nested ones included (:func:`~omnicore.data.packing.map_tensors`)."""
    for k, v in vars(mb).items():
        setattr(mb, k, map_tensors(v, lambda t: t.pin_memory()))
    return mb
