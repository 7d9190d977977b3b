"""SIGTERM and SIGINT as a request to stop cleanly: finish the current step, save, exit non-zero.

Slurm and Kubernetes send SIGTERM some seconds before they kill a job, and Ctrl-C sends SIGINT; by
default either ends a run mid-step and loses everything since the last checkpoint. Inside
:class:`GracefulStop` the first of them only sets a flag: the training loop finishes the step it is
in, agrees with the other ranks that someone was asked to stop (one all-reduce, so that every rank
saves the same step; under torchrun each worker gets the signal), saves a checkpoint and raises
:class:`Interrupted`, which the CLI turns into one line and the exit status ``128 + signal``
(143 for SIGTERM, 130 for SIGINT), as a shell reports a process killed by that signal.

A repeat within :data:`GRACE_S` seconds of the first is the same request delivered twice and is
ignored, so that it cannot cancel the save the first one started: Slurm signals every task of a job
step, torchrun's launcher forwards the signal it gets to its workers (and SIGKILLs them only after
its ``--shutdown-timeout``, 30 s by default), so each rank gets two SIGTERMs tens of milliseconds
apart. A signal after the grace period restores the default action and re-sends itself: the process
ends at once (checkpoints are written atomically, so the previous one stays usable).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

_log = logging.getLogger(__name__)

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
"""The signals turned into a stop request."""

GRACE_S = 5.0
"""Seconds after the first stop signal during which another one is taken as the same request and
ignored (the launcher's forwarded copy arrives within milliseconds; a person who means "now" sends
it again later)."""


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
        announce: log a warning when a signal arrives (rank 0 only, say).
        grace_s: seconds after the first signal during which a second one is ignored (module
            docstring; default :data:`GRACE_S`); after them a second signal ends the process at once.
    """

    def __init__(self, announce: bool = True, grace_s: float | None = None):
        self.announce = announce
        self.grace_s = GRACE_S if grace_s is None else grace_s
        self.received: int | None = None
        self._first_at = 0.0  # time.monotonic() of the first signal
        self._old: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived on this process."""
        return self.received is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            since = time.monotonic() - self._first_at
            if since < self.grace_s:  # the same request again (a launcher's forwarded copy): the save goes on
                if self.announce:
                    _log.warning("received %s again %.0f ms after the first: still finishing the step and saving", name, 1e3 * since)
                return
            signal.signal(signum, signal.SIG_DFL)  # a second request: leave at once, as the default action does
            os.kill(os.getpid(), signum)
            return
        self.received, self._first_at = signum, time.monotonic()
        if self.announce:
            _log.warning(
                "received %s: finishing this step and saving a checkpoint; send it again after %g s to exit at once", name, self.grace_s
            )

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
