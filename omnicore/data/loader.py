"""Workers and sampling: decoding a rank's shards in DataLoader workers, chunk by chunk on demand.

The records of a shard (:class:`~omnicore.data.reading.ShardReader`) are decoded in fixed chunks
of positions. Each rank has one ``torch.utils.data.DataLoader`` over a :class:`ShardChunks`
dataset whose item ``(k, j)`` is chunk ``j`` of the rank's shard slot ``k``; worker ``w`` of ``W``
makes every ``W``-th item (reading, but not decoding, the records of the others), and the
DataLoader hands them back in request order. A chunk is a list of encoded samples (media decoded,
preprocessed by the components' *processors*, tokenised), or of the
:class:`~omnicore.data.jsonl.SampleError` message of a bad one, in position order, so the stream
does not depend on ``W``: the training process never decodes media. Each sample is decoded with
the global RNGs seeded from its own seed and carries it (:mod:`omnicore.data.seeds`), so its
random draws do not depend on ``W`` either. :class:`DemandSampler` decides
which chunk is asked for next. Workers send features as numpy arrays (:func:`features_as`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset

from omnicore.data.chat import ChatProcessor, Encoded
from omnicore.data.jsonl import SampleError
from omnicore.data.reading import ShardReader, SourceCursor
from omnicore.data.seeds import sample_seed, seeded

if TYPE_CHECKING:
    from omnicore.data.pipeline import DataPipeline


class DataWorkerError(RuntimeError):
    """A DataLoader worker died (killed, out of memory) or failed outside a sample; names what to do."""


def chunk_size(window: int) -> int:
    """Positions per worker item: the largest of 16, 8, 4, 2, 1 that divides ``window`` (windows
    start on chunk boundaries, which resume relies on)."""
    return math.gcd(window, 16)


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

    def _decode(self, s: int, rec: Any, epoch: int = 0) -> tuple[Encoded | None, str | None]:
        seed = sample_seed(self.opts["seed"], self.sources[s].name, epoch, rec.where)
        try:
            with seeded(seed):  # what a processor draws depends on the sample, not on the worker
                enc = self.chat.encode(self.sources[s].to_sample(rec))
            enc.seed = seed
        except SampleError as exc:
            return None, str(exc)
        except Exception as exc:  # a processor or reader failing on this record: still name it
            return None, f"{rec.where}: {type(exc).__name__}: {' '.join(str(exc).split())}"
        if self.in_worker:
            enc.media = [(side, m, features_as(f, to_numpy=True)) for side, m, f in enc.media]
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
            sample, error = self._decode(s, rec, cur.epoch) if decode else (None, None)
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


def features_as(features: dict[str, Any], *, to_numpy: bool) -> dict[str, Any]:
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


def worker_init(worker_id: int, nice: int = 0) -> None:
    """How a worker meets signals and the end of its training process, and its priority.

    ``nice`` (``data.worker_nice``, 0-19) is added to the worker's niceness (``os.nice``; skipped
    where the system has no such call): the workers then take the CPU time the training process
    leaves idle rather than contend with its compute threads, whose parallel regions stall when a
    core they wait on is busy with a worker.

    SIGTERM (a scheduler signals every process of a job; ``multiprocessing`` terminates daemon
    processes at exit) ends the worker at once with exit status 0: torch reports a worker that died
    of a signal or exited non-zero as an error in the training process, which must instead finish
    its step and save (it holds the step's micro-batches already). SIGINT (Ctrl-C reaches the whole
    process group) is left to the training process. A daemon thread ends the worker within a second
    once the training process is gone: torch's own check cannot end a worker whose result queue is
    full, so a killed run would leave its workers behind."""
    import signal
    import threading

    if nice > 0 and hasattr(os, "nice"):
        os.nice(nice)
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="omnicore-parent-watch", daemon=True).start()
