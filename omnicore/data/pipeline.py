"""The training data pipeline: sources -> mixing -> sharding -> DataLoader workers -> packing.

Nothing here holds the dataset in memory, and nothing scales with its size before step 1. The
stages, each in its module:

1. reading and shuffling (:mod:`omnicore.data.reading`): each virtual shard's raw records, the
   sources mixed by weight, sharded by row and shuffled through a buffer;
2. workers and sampling (:mod:`omnicore.data.loader`): records decoded into encoded samples in
   DataLoader workers, chunk by chunk as the training process asks for them;
3. packing and state (:mod:`omnicore.data.state`): each window of a shard packed into rows by
   :func:`omnicore.data.packing.pack_window`, and the position a checkpoint keeps.

:class:`DataPipeline` drives them for one rank: each step, ``grad_accum`` rows (one from each of
the rank's shards), collated into :class:`~omnicore.data.packing.MicroBatch` es.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import logging
import math
import os
import time
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

from omnicore.data.chat import ChatProcessor
from omnicore.data.jsonl import SampleError
from omnicore.data.loader import Chunk, DataWorkerError, DemandSampler, Entry, ShardChunks, chunk_size, features_as, worker_init
from omnicore.data.packing import check_method, collate, pinned
from omnicore.data.reading import DataExhausted, SourceCursor
from omnicore.data.state import DataResumeError, ShardPacker, ShardState, check_resume

logger = logging.getLogger(__name__)

NAMED_SKIPS = 5
"""Bad samples skipped under ``data.on_error: skip`` that each rank names in a warning line
(``FILE:LINE: why``, each line once); later ones are only counted (``skipped/<source>``)."""

EMPTY_WINDOWS = 4
"""Packing windows in a row without one usable sample after which a shard gives up (every sample
bad, under ``data.on_error: skip``)."""


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
        check_method(data.packing)
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
        self._fingerprint: dict[str, list[list[str]]] | None = None  # what this run reads (fingerprint())
        self._named: list[str] = []  # the bad samples' messages logged so far (NAMED_SKIPS at most)
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
            kwargs.update(
                prefetch_factor=max(d.prefetch_factor, ahead),
                persistent_workers=False,
                worker_init_fn=functools.partial(worker_init, nice=d.worker_nice),
            )
        with _own_sigchld(d.num_workers > 0):
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
                    e.sample.media = [(side, m, features_as(f, to_numpy=False)) for side, m, f in e.sample.media]
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
        (:class:`~omnicore.data.packing.MicroBatch`).

        Raises:
            DataExhausted: a source with ``on_exhausted: stop`` ran out (on this rank).
            SampleError: a bad sample under ``data.on_error: raise``.
            DataWorkerError: a worker died; the data position is put back to before this step (as
                for ``DataExhausted``), so a checkpoint saved now resumes with this step's samples.
        """
        t0 = time.perf_counter()
        before = [copy.deepcopy(p.state) for p in self.packers]
        self._before = before
        out = []
        for k in range(self.grad_accum):
            try:
                row = self._row(k)
            except (DataExhausted, DataWorkerError):
                for p, st in zip(self.packers, before):  # a checkpoint keeps the position after the last whole step
                    p.state = st
                raise
            mb = collate([e.sample for e in row], self.chat.encoders, self.chat.decoders, decoder_keys=self.decoder_keys)
            if self.pin_memory:
                mb = pinned(mb)
            out.append(mb)
        self._name_skips()
        self.wait_s += time.perf_counter() - t0
        return out

    def _name_skips(self) -> None:
        """Log the first :data:`NAMED_SKIPS` bad samples the step passed over (each ``FILE:LINE``
        once, however many epochs pass it), then one line saying that later ones are only counted."""
        for p in self.packers:
            errors, p.consumed_errors = p.consumed_errors, []
            for message in errors:
                if len(self._named) >= NAMED_SKIPS or message in self._named:
                    continue
                self._named.append(message)
                logger.warning("data: skipped a bad sample (data.on_error: skip): %s", message)
                if len(self._named) == NAMED_SKIPS:
                    logger.warning(
                        "data: %d bad samples named; later ones are counted, not named (skipped/<source> in metrics.jsonl)", NAMED_SKIPS
                    )

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

    def __del__(self) -> None:
        # A pipeline dropped without close() (a script, a test, an error path) would otherwise leave
        # its workers to the DataLoader iterator's own shutdown, which waits 5 s for each worker
        # blocked on a full result queue: ended here at once instead.
        try:
            if getattr(self, "_it", None) is not None and getattr(self._it, "_workers", None):
                self.close(now=True)
        except Exception:  # noqa: BLE001 - never raise from a finalizer (interpreter exit included)
            pass

    def take_wait(self) -> float:
        """Seconds spent in :meth:`step` since the last call."""
        w, self.wait_s = self.wait_s, 0.0
        return w

    def counts(self) -> tuple[list[int], list[int]]:
        """Samples used and bad samples skipped so far, per source, over this rank's shards; both
        counted as the stream is consumed (a sample once per epoch that trains it), never as it is
        read ahead (:mod:`omnicore.data.state`)."""
        seen = [sum(p.state.seen[i] for p in self.packers) for i in range(len(self.sources))]
        skipped = [sum(p.state.skipped[i] for p in self.packers) for i in range(len(self.sources))]
        return seen, skipped

    # ---- checkpoint state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's shards' positions (JSON-able): ``{"num_shards", "sources", "settings",
        "files", "shards": {v: ShardState}}``, ``files`` being :meth:`fingerprint`."""
        return {
            "num_shards": self.num_shards,
            "sources": self.source_names,
            "settings": self.settings(),
            "files": self.fingerprint(),
            "shards": {str(v): vars(p.state) for v, p in zip(self.shards, self.packers)},
        }

    def fingerprint(self) -> dict[str, list[list[str]]]:
        """``{source: [[file, fingerprint], ...]}`` of what this run reads
        (:mod:`omnicore.data.fingerprint`: size and sampled bytes of each file, at most 1 MiB read
        per file), computed once per pipeline."""
        if self._fingerprint is None:
            from omnicore.data.fingerprint import source_fingerprint

            self._fingerprint = {s.name: source_fingerprint(s) for s in self.sources}
        return self._fingerprint

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

    def load_state_dict(self, merged: dict[str, Any], *, verify: bool = True) -> None:
        """Continue from a checkpoint's data state (every rank's shards merged, :func:`merge_states`).

        Args:
            verify: refuse data files that differ from the ones the checkpoint's run read (its
                ``files`` against :meth:`fingerprint`); False (``run.verify: false``) warns instead.

        Raises:
            DataResumeError: see :func:`check_resume`; a data setting differs; or (``verify``) a
                data file differs, naming the source and the file.
        """
        from omnicore.data.fingerprint import compare_fingerprints

        check_resume(merged, self.num_shards, self.source_names, self.grad_accum)
        changed = [(k, v, self.settings().get(k)) for k, v in merged.get("settings", {}).items() if self.settings().get(k) != v]
        if changed:
            what = "; ".join(f"{k} was {v!r}, now {now!r}" for k, v, now in changed)
            raise DataResumeError(
                f"the data settings differ from the checkpoint's ({what}); the current packing window would be read differently and "
                "samples repeated or skipped: resume with the checkpoint's settings, or start a new run"
            )
        other = compare_fingerprints(merged.get("files"), self.fingerprint())
        if other and verify:
            raise DataResumeError(
                f"{other}; a resume must read the data its checkpoint was trained on, or it trains on other samples than a run "
                "without the stop: restore the file, or start a new run from the checkpoint's weights (model.init_from), or "
                "resume anyway with --no-verify (run.verify: false)"
            )
        if other:
            logger.warning("data: %s; resuming anyway (run.verify: false)", other)
        for v, p in zip(self.shards, self.packers):
            st = merged["shards"][str(v)]
            p.state = ShardState(**st)
            p.last_cursor = [list(c) for c in p.state.cursors]
        self._it = None


@contextlib.contextmanager
def _own_sigchld(workers: bool) -> Iterator[None]:
    """Leave no DataLoader SIGCHLD handler behind once a DataLoader has started its workers.

    torch installs one (``torch.utils.data._utils.signal_handling``, once per process) that raises
    ``RuntimeError: DataLoader worker (pid N) is killed by signal`` from whatever line the training
    process is running when a worker dies: inside the forward, the optimizer step or a save, as a
    traceback (exit status 1), and on one rank only, the others then waiting in a collective. Without
    it the DataLoader still finds a dead worker where data is read (it checks its workers whenever
    it has waited ``MP_STATUS_CHECK_INTERVAL``, 5 s), and :meth:`DataPipeline._fetch` raises
    :class:`DataWorkerError` there, which the training loop agrees on across ranks and saves after.
    The handler that was there before torch's comes back (the default when it was torch's own)."""
    import signal
    import threading

    main = workers and threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGCHLD")
    before = signal.getsignal(signal.SIGCHLD) if main else None
    try:
        yield
    finally:
        if main and _torch_sigchld(signal.getsignal(signal.SIGCHLD)):
            keep = before if before is not None and not _torch_sigchld(before) else signal.SIG_DFL
            signal.signal(signal.SIGCHLD, keep)


def _torch_sigchld(handler: Any) -> bool:
    """Whether ``handler`` is the SIGCHLD handler torch's DataLoader installs (:func:`_own_sigchld`)."""
    return callable(handler) and getattr(handler, "__module__", "") == "torch.utils.data._utils.signal_handling"


_LIVE: weakref.WeakSet[DataPipeline] = weakref.WeakSet()
"""Pipelines that may hold workers, closed at interpreter exit (:func:`_close_all`)."""


@atexit.register
def _close_all() -> None:
    for pipe in list(_LIVE):
        pipe.close(now=True)
