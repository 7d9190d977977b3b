"""Training progress on rank 0: a tqdm bar on a terminal, plain lines in a log file.

tqdm redraws its bar with carriage returns; written to a file (``omnicore train ... 2> log``, a batch
job's output) that becomes one line of hundreds of thousands of characters. When stderr is not a
terminal, :class:`PlainProgress` prints one ordinary line instead at the first step, at the last,
and whenever :data:`PLAIN_EVERY_S` seconds have passed since the previous line.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

PLAIN_EVERY_S = 30.0
"""Seconds between two plain progress lines (besides the first and the last step)."""


class PlainProgress:
    """The part of tqdm's interface the training loop uses (``set_postfix``, ``update``,
    ``close``), printing lines such as ``train: step 40/200 (20%), loss 1.2345, tok_s 3100;
    12 s elapsed, about 48 s left``.

    Args:
        total: the last step (``train.max_steps``).
        initial: the step already done (a resumed run).
        every_s: seconds between lines; 0 prints every step.
        stream: where lines go (default: stderr at the time of each line, as tqdm does).
        clock: seconds, monotonic (a parameter so tests need not wait).
    """

    def __init__(
        self, total: int, initial: int = 0, *, every_s: float = PLAIN_EVERY_S, stream: TextIO | None = None, clock: Any = time.monotonic
    ) -> None:
        self.total, self.n, self.every_s = total, initial, every_s
        self.stream, self.clock = stream, clock
        self.postfix: dict[str, Any] = {}
        self.start = self.last = clock()
        self.initial = initial
        self.lines = 0

    def set_postfix(self, postfix: dict[str, Any]) -> None:
        """Figures to show on the next line (``{"loss": "1.2345", ...}``)."""
        self.postfix = dict(postfix)

    def update(self, n: int = 1) -> None:
        """``n`` more steps done; prints a line when one is due."""
        self.n += n
        now = self.clock()
        if self.n - n == self.initial or self.n >= self.total or now - self.last >= self.every_s:
            self.last = now
            self._print(now)

    def close(self) -> None:
        """Nothing to tidy: every line is complete when printed."""

    def _print(self, now: float) -> None:
        elapsed = now - self.start
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        figures = "".join(f", {k} {v}" for k, v in self.postfix.items())
        done = self.n - self.initial
        left = f", about {elapsed / done * (self.total - self.n):.0f} s left" if 0 < done and self.n < self.total else ""
        print(f"train: step {self.n}/{self.total}{pct}{figures}; {elapsed:.0f} s elapsed{left}", file=self.stream or sys.stderr, flush=True)
        self.lines += 1


def progress_bar(total: int, initial: int) -> Any:
    """A tqdm bar when stderr is a terminal, else a :class:`PlainProgress`."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)
    return PlainProgress(total, initial)
