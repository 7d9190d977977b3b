"""Console logging: one rank-aware format for the status lines of the core and its plugins.

Every module logs under the ``omnicore`` namespace (``logging.getLogger(__name__)``), and so does a
plugin through its own module name (``omnicore_image_movqgan...``). The command line configures
logging once per command (:func:`setup_logging`); lines go to stderr as::

    12:03:04 INFO omnicore.train.loop: model: 1.23 M parameters; ...
    [rank1] 12:03:09 WARNING py.warnings: UserWarning: ... (file.py:12)      (when WORLD_SIZE > 1)

The level: ``--log-level {debug,info,warning,error}`` (every subcommand), else the environment
variable ``OMNICORE_LOG_LEVEL``, else ``info``. On ranks other than 0 INFO lines are left out unless
the level is ``debug``, so N ranks do not say everything N times; their warnings and errors always
show, with the rank. Other libraries' loggers show from WARNING up. What a command *returns* (``omnicore plugins``' table, ``plan``'s report,
``eval``'s accuracy lines, ``done: ...``) is printed on stdout, not logged.

Python warnings (``warnings.warn``) become one line each on the ``py.warnings`` logger (as
:func:`logging.captureWarnings` does, without the source line). Library warnings that tell a user
nothing to act on (:data:`QUIET_WARNINGS`) are filtered out, except at ``debug``; omnicore's own
(a logger plugin that failed, a plugin without a processor) stay.

A user error ends a command with one ``error: ...`` line on stderr (:func:`error_line`): under
torchrun an error that every rank meets alike is printed by rank 0 alone, one that only some ranks
may meet by each of them with its ``[rankN]`` prefix.

A program that uses omnicore as a library configures logging itself (``logging.basicConfig(level=
logging.INFO)``, or :func:`setup_logging`); without that Python shows only warnings and errors.

Pure standard library: ``omnicore plugins`` configures logging without importing torch.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from types import TracebackType
from typing import Any

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
"""The ``--log-level`` / ``OMNICORE_LOG_LEVEL`` names."""

ENV_LEVEL = "OMNICORE_LOG_LEVEL"

QUIET_WARNINGS: list[tuple[str, str]] = [
    # (message regex, why it needs no action); matched from the start of the warning's text
    (r"`is_gradient_checkpointing` is deprecated", "transformers 5 renamed it; peft still calls it when LoRA is applied"),
]
"""Library warnings left out at levels above ``debug``: ``(message regex, why)``."""

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _StderrHandler(logging.Handler):
    """Writes each line to the *current* ``sys.stderr`` (so captured stderr catches it), through
    ``tqdm.write`` when tqdm is loaded so that a live progress bar is redrawn below the line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            tqdm_module = sys.modules.get("tqdm")
            if tqdm_module is not None and hasattr(tqdm_module, "tqdm"):
                tqdm_module.tqdm.write(line, file=sys.stderr)
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except Exception:  # logging must never end the program (logging's own convention)
            self.handleError(record)


def resolve_level(level: str | None = None) -> int:
    """The logging level from ``level`` (a :data:`LEVELS` name), else ``OMNICORE_LOG_LEVEL``, else INFO.

    Raises:
        ValueError: the name is not one of :data:`LEVELS` (the message names where it came from).
    """
    where = "--log-level"
    if level is None:
        level, where = os.environ.get(ENV_LEVEL) or "info", ENV_LEVEL
    name = level.strip().lower()
    if name not in LEVELS:
        raise ValueError(f"{where}={level}: not a log level; use one of {', '.join(LEVELS)}")
    return LEVELS[name]


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size, from torchrun's ``RANK`` / ``WORLD_SIZE`` (0, 1 without)."""
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


ECHO_ATTRIBUTE = "omnicore_echo"
"""Set (true) on an exception by :func:`echo_of_other_rank`."""


def echo_of_other_rank(exc: BaseException) -> BaseException:
    """``exc``, marked as this rank's echo of another rank's failure (``1 rank(s) stopped on a data
    error (see that rank's error); this rank 0 stops too``): the rank that failed prints its own
    error, so :func:`error_line` prints nothing for the echo. Returns ``exc`` itself, to be raised."""
    setattr(exc, ECHO_ATTRIBUTE, True)
    return exc


def error_line(message: str, *, alike: bool, echo: bool = False, rank: int | None = None, world_size: int | None = None) -> str | None:
    """The line a command prints on stderr for a user error, or None when this process prints none.

    One process: ``error: MESSAGE``. Under torchrun (``world_size`` > 1), so that N ranks do not
    print the same line N times:

    * an error every rank meets alike (``alike``: one that depends only on the config and the files
      every rank reads, such as a config, registry or checkpoint error, or one the ranks agree on
      in a collective) is printed by rank 0 alone, as ``error: MESSAGE``;
    * an error that may concern only some ranks (a bad sample, a dead data worker, a file) is
      printed by each rank that met it, as ``[rankN] error: MESSAGE``;
    * an ``echo`` (:func:`echo_of_other_rank`: this rank stops because another one failed) prints
      nothing: the failing rank's line is the one to read.

    Args:
        rank, world_size: default to torchrun's ``RANK`` and ``WORLD_SIZE`` (:func:`rank_and_world`).
    """
    env_rank, env_world = rank_and_world()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if world_size <= 1:
        return f"error: {message}"
    if echo or (alike and rank != 0):
        return None
    return f"error: {message}" if alike else f"[rank{rank}] error: {message}"


def setup_logging(level: str | int | None = None, *, rank: int | None = None, world_size: int | None = None) -> int:
    """Send log lines to stderr in the rank-aware format (module docstring): every level of the
    ``omnicore`` loggers (plugins' ``omnicore_*`` loggers included) from ``level`` up, other
    libraries' warnings and errors, and Python warnings. Safe to call again: the previous set-up is
    replaced; :func:`reset_logging` undoes it. Returns the level in use.

    Args:
        level: a :data:`LEVELS` name or a ``logging`` level; None reads ``OMNICORE_LOG_LEVEL`` (else info).
        rank, world_size: default to torchrun's ``RANK`` and ``WORLD_SIZE``; the ``[rankN]`` prefix is
            shown when ``world_size > 1``.

    Raises:
        ValueError: an unknown level name (:func:`resolve_level`).
    """
    lvl = level if isinstance(level, int) else resolve_level(level)
    env_rank, env_world = rank_and_world()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    reset_logging()
    root = logging.getLogger()
    _saved.update(root_level=root.level, filters=list(warnings.filters), showwarning=warnings.showwarning)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter((f"[rank{rank}] " if world_size > 1 else "") + _FORMAT, datefmt="%H:%M:%S"))
    # other ranks: warnings and errors only, unless debugging (then every rank's lines)
    handler.setLevel(lvl if rank == 0 or lvl <= logging.DEBUG else max(lvl, logging.WARNING))
    handler.addFilter(_ours_or_important)
    root.addHandler(handler)
    root.setLevel(lvl)
    _route_warnings(quiet=lvl > logging.DEBUG)
    return lvl


def reset_logging() -> None:
    """Undo :func:`setup_logging` (its handler, the root level, warning filters and
    ``warnings.showwarning``); nothing to undo is fine. ``omnicore.cli.main`` calls it on return, so
    that calling it in-process (a test, a notebook) leaves logging as it found it."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    if _saved:
        root.setLevel(_saved["root_level"])
        warnings.filters[:] = _saved["filters"]
        warnings.showwarning = _saved["showwarning"]
        _saved.clear()


_saved: dict[str, Any] = {}  # what setup_logging changed, for reset_logging


def _ours_or_important(record: logging.LogRecord) -> bool:
    """Lines of omnicore and its plugins (``omnicore*`` loggers) at every level; other libraries'
    (and Python warnings') from WARNING up."""
    return record.name.startswith("omnicore") or record.levelno >= logging.WARNING


def _route_warnings(*, quiet: bool) -> None:
    """``warnings.warn`` -> one ``py.warnings`` log line; the :data:`QUIET_WARNINGS` filtered when ``quiet``."""
    warnings.showwarning = _show_warning
    if quiet:
        for pattern, _why in QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    """A replacement for :func:`warnings.showwarning`: ``Category: message (file.py:12)`` on ``py.warnings``."""
    text = " ".join(str(message).split())
    logging.getLogger("py.warnings").warning("%s: %s (%s:%d)", category.__name__, text, os.path.basename(filename), lineno)


class Phase:
    """Times one step of start-up and says what it is doing, so that no phase is silent for long.

    On exit (without an exception) it logs ``WHAT: DETAIL (1.2 s)`` at INFO (``WHAT (1.2 s)``
    without a detail); while the phase runs, a timer thread logs ``WHAT: still running, 5 s so far``
    after ``first_s`` seconds and then every ``every_s`` seconds. Set :attr:`detail` inside the block.

    ::

        with Phase(logger, "building the model") as ph:
            model = build()
            ph.detail = f"{n / 1e6:.2f} M parameters"

    Args:
        logger: where the lines go.
        what: the phase, in words a user understands (``waiting for the first micro-batches``).
        first_s, every_s: seconds before the first "still running" line, and between later ones.
    """

    def __init__(self, logger: logging.Logger, what: str, *, first_s: float = 5.0, every_s: float = 30.0) -> None:
        self.logger, self.what, self.first_s, self.every_s = logger, what, first_s, every_s
        self.detail = ""
        self.seconds = 0.0
        self._t0 = 0.0
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Phase:
        self._t0 = time.perf_counter()
        if self.logger.isEnabledFor(logging.INFO):
            self._thread = threading.Thread(target=self._watch, name=f"omnicore-phase: {self.what}", daemon=True)
            self._thread.start()
        return self

    def _watch(self) -> None:
        wait = self.first_s
        while not self._done.wait(wait):
            self.logger.info("%s: still running, %.0f s so far", self.what, time.perf_counter() - self._t0)
            wait = self.every_s

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.seconds = time.perf_counter() - self._t0
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if kind is None:
            self.logger.info("%s%s (%.1f s)", self.what, f": {self.detail}" if self.detail else "", self.seconds)
