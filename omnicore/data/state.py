"""Packing and state: a shard's windows packed into rows in the training process, and the position
a checkpoint keeps.

**Packing** (:class:`ShardPacker`): positions are taken in windows of ``data.packing_window``;
each window's usable samples are packed into rows of ``data.max_tokens`` by the packer,
:func:`omnicore.data.packing.pack_window` (first-fit in stream order through
:class:`~omnicore.data.packing.FreeSpaceIndex`, ``O(n log B)``, or first-fit decreasing with the
rows shuffled), and the rows are taken one per micro-batch. No epoch-wide length table exists, so
streaming sources pack like files do.

**Counts** (``seen``, ``skipped``): a sample is counted when the row holding it is taken, and a bad
sample (``data.on_error: skip``) when the stream is consumed past it: with the row holding the next
usable sample after it in the window, or, after the window's last usable sample, with the window's
last row (at once for a window without a usable sample). A window is read ahead of what trains
(``data.packing_window`` positions, which on a small file span many epochs), so counting at reading
would count the read-ahead. A bad line is counted once each time the consumed stream passes it (once
per epoch, as ``seen`` counts a sample once per epoch), on the one shard that holds it.

**Resume** (:class:`ShardState`, :func:`check_resume`): per shard, the window's first position, the
rows of it already used, each source's next record (epoch, offset) and the counts per source; on
resume the window is read again, packed again (deterministically) and its used rows are skipped:
the next micro-batch is exactly the one a run without the stop would have read, workers included.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from omnicore.data.jsonl import SampleError
from omnicore.data.loader import Entry
from omnicore.data.packing import pack_window


class DataResumeError(ValueError):
    """A checkpoint's data position cannot be continued by this run's layout; the message says why
    and which world size / ``grad_accum`` would continue it."""


@dataclass
class ShardState:
    """What a checkpoint keeps of one shard (JSON): the current window's first position, the rows of
    it already used, each source's cursor at the window's start, samples used and bad samples skipped
    per source (counted as the stream is consumed, not as it is read ahead: module docstring)."""

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
        self.passed: list[list[Entry]] = []  # per row: the bad entries counted when it is taken (module docstring)
        self.consumed_errors: list[str] = []  # messages of the bad samples counted, until the pipeline takes them
        self.next_row = 0
        self.filled = False  # a window is loaded (rows hold it)
        self.window_len = 0  # positions in the loaded window
        self.last_window = False  # the stream ended inside the loaded window
        self.last_cursor: list[list[int]] = [list(c) for c in self.state.cursors]

    def fill(self, entries: list[Entry], ended: bool) -> None:
        """Pack one window (``entries``: its positions in order; fewer than ``window`` when the stream
        ended). On resume the rows used before the checkpoint (``state.used_rows``) are passed over;
        their samples and bad samples were counted before it. Bad samples are counted as the rows are
        taken (:meth:`take`, module docstring), those of a window without a usable sample here.

        Raises:
            SampleError: a bad sample under ``data.on_error: raise`` (its ``FILE:LINE: why``).
            PackingError: a sample longer than ``max_tokens`` (the chat processor normally refuses it first).
        """
        good: list[Entry] = []
        before: list[list[Entry]] = []  # per usable entry: the bad ones between it and the previous usable one
        bad: list[Entry] = []
        for e in entries:
            self.last_cursor[e.source] = [e.cursor.epoch, e.cursor.offset]
            if e.error is None:
                good.append(e)
                before.append(bad)
                bad = []
            elif self.on_error != "skip":
                raise SampleError(e.error)
            else:
                bad.append(e)
        rng = random.Random(f"{self.seed}:rows:{self.shard}:{self.state.window_start}") if self.shuffle else None
        bins = pack_window([e.sample for e in good], self.max_tokens, self.method, rng)
        self.rows = [[good[j] for j in b] for b in bins]
        self.passed = [[x for j in b for x in before[j]] for b in bins]
        if self.passed:
            self.passed[-1] += bad  # after the window's last usable sample: passed when the window is used up
        elif self.state.used_rows == 0:
            self._count_bad(bad)  # nothing usable: the whole window is passed over now
        self.next_row = self.state.used_rows
        self.filled, self.window_len, self.last_window = True, len(entries), ended

    def take(self) -> list[Entry] | None:
        """The next row of the loaded window, or None when it is used up (or none is loaded). Its
        samples are counted under ``seen``, and the bad samples the stream passes with it under
        ``skipped`` (their messages added to :attr:`consumed_errors`)."""
        if self.next_row >= len(self.rows):
            return None
        row = self.rows[self.next_row]
        self._count_bad(self.passed[self.next_row])
        self.next_row += 1
        self.state.used_rows = self.next_row
        for e in row:
            self.state.seen[e.source] += 1
        return row

    def _count_bad(self, entries: list[Entry]) -> None:
        for e in entries:
            self.state.skipped[e.source] += 1
            self.consumed_errors.append(e.error or "")

    def advance(self) -> None:
        """Move the state past the loaded window."""
        self.state.window_start += self.window_len
        self.state.used_rows = 0
        self.state.cursors = [list(c) for c in self.last_cursor]
        self.rows, self.passed, self.next_row, self.filled = [], [], 0, False


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
