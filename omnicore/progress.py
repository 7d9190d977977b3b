"""Progress on rank 0 (training steps, evaluated samples): a tqdm bar on a terminal, plain lines in a
log file.

tqdm redraws its bar with carriage returns; written to a file (``omnicore train ... 2> log``, a batch
job's output) that becomes one line of hundreds of thousands of characters. When stderr is not a
terminal, :class:`PlainProgress` logs one ordinary line instead at the first step, at the last,
and whenever :data:`PLAIN_EVERY_S` seconds have passed since the previous line. Training counts
steps; ``omnicore eval`` counts samples.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

_log = logging.getLogger(__name__)

PLAIN_EVERY_S = 30.0
"""Seconds between two plain progress lines (besides the first and the last step)."""


class PlainProgress:
    """The part of tqdm's interface the training and eval loops use (``set_postfix``, ``update``,
    ``close``), logging plain lines such as ``train: step 40/200 (20%), loss 1.2345, tok_s 3100;
    12 s elapsed, about 48 s left`` or ``eval: 160/800 samples (20%); 12 s elapsed, about 48 s left``:
    at the first update, at the last, and whenever ``every_s`` seconds have passed since the previous line.

    Args:
        total: the last count (``train.max_steps``, the samples to evaluate).
        initial: the count already done (a resumed run).
        desc: what runs (``train``, ``eval``): each line starts with it.
        count: how the count reads, a format of ``n`` and ``total`` (``step {n}/{total}``,
            ``{n}/{total} samples``).
        every_s: seconds between lines; 0 prints every update.
        stream: where lines go; None logs them at INFO on ``logger`` (the usual case: one format,
            rank 0's lines shown, :mod:`omnicore.logs`).
        logger: the logger of ``stream=None`` (default: this module's).
        clock: seconds, monotonic (a parameter so tests need not wait).
    """

    def __init__(
        self,
        total: int,
        initial: int = 0,
        *,
        desc: str = "train",
        count: str = "step {n}/{total}",
        every_s: float = PLAIN_EVERY_S,
        stream: TextIO | None = None,
        logger: logging.Logger | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.total, self.n, self.every_s = total, initial, every_s
        self.desc, self.count = desc, count
        self.stream, self.logger, self.clock = stream, logger or _log, clock
        self.postfix: dict[str, Any] = {}
        self.start = self.last = clock()
        self.initial = initial
        self.lines = 0

    def set_postfix(self, postfix: dict[str, Any]) -> None:
        """Figures to show on the next line (``{"loss": "1.2345", ...}``)."""
        self.postfix = dict(postfix)

    def update(self, n: int = 1) -> None:
        """``n`` more done; writes a line when one is due."""
        self.n += n
        now = self.clock()
        if self.n - n == self.initial or self.n >= self.total or now - self.last >= self.every_s:
            self.last = now
            self._write(now)

    def close(self) -> None:
        """Nothing to tidy: every line is complete when written."""

    def line(self, now: float) -> str:
        """The line for the current count at time ``now`` (of ``clock``)."""
        elapsed = now - self.start
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        figures = "".join(f", {k} {v}" for k, v in self.postfix.items())
        done = self.n - self.initial
        left = f", about {elapsed / done * (self.total - self.n):.0f} s left" if 0 < done and self.n < self.total else ""
        return f"{self.desc}: {self.count.format(n=self.n, total=self.total)}{pct}{figures}; {elapsed:.0f} s elapsed{left}"

    def _write(self, now: float) -> None:
        text = self.line(now)
        if self.stream is not None:
            print(text, file=self.stream, flush=True)
        else:
            self.logger.info("%s", text)
        self.lines += 1


def progress_bar(total: int, initial: int = 0, *, desc: str = "train", unit: str = "step", logger: logging.Logger | None = None) -> Any:
    """A tqdm bar when stderr is a terminal, else a :class:`PlainProgress` logging to ``logger``
    (``unit`` ``step`` reads ``step 3/10``, any other ``3/10 samples``)."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True)
    count = "step {n}/{total}" if unit == "step" else "{n}/{total} " + unit + "s"
    return PlainProgress(total, initial, desc=desc, count=count, logger=logger)
