"""SIGTERM and SIGINT as a request to stop cleanly: finish the current step, save, exit non-zero.

Slurm and Kubernetes send SIGTERM some seconds before they kill a job, and Ctrl-C sends SIGINT; by
default either ends a run mid-step and loses everything since the last checkpoint. Inside
:class:`GracefulStop` the first of them only sets a flag: the training loop finishes the step it is
in, agrees with the other ranks that someone was asked to stop (one all-reduce, so that every rank
saves the same step; under torchrun each worker gets the signal), saves a checkpoint and raises
:class:`Interrupted`, which the CLI turns into one line and the exit status ``128 + signal``
(143 for SIGTERM, 130 for SIGINT), as a shell reports a process killed by that signal. A second
signal while stopping restores the default action and re-sends itself: the process ends at once
(checkpoints are written atomically, so the previous one stays usable).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

_log = logging.getLogger(__name__)

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
"""The signals turned into a stop request."""


class Interrupted(Exception):
    """The run stopped on a signal after saving; ``signum`` is the signal, :attr:`exit_code` the
    status a shell reports for it (``128 + signum``)."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class GracefulStop:
    """Context manager: while inside, SIGTERM and SIGINT set :attr:`received` instead of ending the
    process; the previous handlers come back on exit. Outside the main thread (where Python cannot
    install handlers) it does nothing and :attr:`requested` stays False.

    Args:
        announce: log one warning when the first signal arrives (rank 0 only, say).
    """

    def __init__(self, announce: bool = True):
        self.announce = announce
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived on this process."""
        return self.received is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # a second signal: leave at once, as the default action does
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        if self.announce:
            name = signal.Signals(signum).name
            _log.warning("received %s: finishing this step and saving a checkpoint; send it again to exit at once", name)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


def signal_flags(stop: GracefulStop | None) -> list[float]:
    """This rank's stop request as a one-hot over :data:`SIGNALS` (all zeros: none). The training
    step adds these to its metrics all-reduce, so agreeing on a stop costs no collective of its own;
    :func:`signal_from_flags` reads the sums."""
    mine = stop.received if stop is not None else None
    return [1.0 if mine == s else 0.0 for s in SIGNALS]


def signal_from_flags(flags: list[float]) -> int | None:
    """The signal any rank received, from the summed :func:`signal_flags` of all ranks (the same on
    every rank), or None. When ranks received different signals, the smallest number wins (SIGINT
    2 before SIGTERM 15)."""
    got = [int(s) for s, f in zip(SIGNALS, flags) if f > 0]
    return min(got) if got else None
