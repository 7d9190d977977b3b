"""One run per output folder: ``<output_dir>/run.lock`` held for the whole run.

The lock file is created atomically (``O_CREAT | O_EXCL``) and holds JSON: the holder's PID, host,
process start time (from ``/proc``, to tell a reused PID apart) and the time the run started. A
second run into the folder fails with a message naming the holder. A lock whose holder is gone
(same host, PID not alive or alive with another start time) is stale: it is taken over, and
:attr:`RunLock.message` says so. A lock from another host cannot be checked and is never taken
over. Under several processes only rank 0 takes the lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from omnicore.checkpoint.errors import CheckpointError

LOCK_NAME = "run.lock"


class RunLockError(CheckpointError):
    """The output folder is held by another live run (or by one this host cannot check)."""


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start: str | None) -> bool:
    """Whether ``pid`` runs on this host and is the same process (same start time, where known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    now = _start_ticks(pid)
    return start is None or now is None or now == start


class RunLock:
    """Context manager holding ``<out_dir>/run.lock`` for one run.

    ::

        with RunLock(out_dir) as lock:
            if lock.message:
                print(lock.message)   # "took over a stale lock ..."
            ... train ...

    Raises:
        RunLockError: (on enter) the folder is held by a live run on this host, or by a run on
            another host, or the lock file is unreadable; the message names PID, host and start
            time and what to do.
    """

    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir) / LOCK_NAME
        self.message: str | None = None
        self._mine: dict[str, Any] | None = None
        self._created: list[Path] = []  # folders acquire() made, removed again if left empty

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _record(self) -> dict[str, Any]:
        pid = os.getpid()
        return {"pid": pid, "host": socket.gethostname(), "proc_start": _start_ticks(pid), "started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        self._mine = self._record()
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self._mine))
        return True

    def acquire(self) -> None:
        """Take the lock (see the class docstring); a stale lock is replaced and noted in :attr:`message`."""
        missing = [p for p in [self.path.parent, *self.path.parent.parents] if not p.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._created = missing  # innermost first
        for _ in range(3):  # a lock that vanishes between our tries (its run ended) is simply retried
            if self._try_create():
                return
            holder = self._read_holder()
            if holder is None:
                continue
            self._check_stale(holder)
            stale_text = json.dumps(holder)
            aside = self.path.with_name(f".{LOCK_NAME}.stale-{os.getpid()}")
            with contextlib.suppress(FileNotFoundError):
                if self.path.read_text() == stale_text:  # unchanged since we judged it stale
                    os.replace(self.path, aside)
                    aside.unlink()
            if self._try_create():
                self.message = f"took over the stale lock {self.path} of PID {holder['pid']} on {holder['host']} (started {holder.get('started')}), which is no longer running"
                return
        raise RunLockError(f"could not take {self.path}: other runs keep creating it; start one run per run.output_dir")

    def _read_holder(self) -> dict[str, Any] | None:
        """The lock's record; None when the file vanished (its run ended)."""
        for _ in range(20):  # an empty file: its holder is between O_EXCL and its write
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                return None
            if text:
                break
            time.sleep(0.05)
        try:
            holder = json.loads(text)
            if isinstance(holder, dict) and isinstance(holder.get("pid"), int) and isinstance(holder.get("host"), str):
                return holder
        except ValueError:
            pass
        raise RunLockError(f"{self.path} is unreadable (not a run lock); if no run is using {self.path.parent}, delete it and start again")

    def _check_stale(self, holder: dict[str, Any]) -> None:
        """Raise unless ``holder`` is a process of this host that is no longer running."""
        who = f"PID {holder['pid']} on host {holder['host']} (started {holder.get('started')})"
        if holder["host"] != socket.gethostname():
            raise RunLockError(
                f"{self.path.parent} is in use by {who}, another host this one cannot check; "
                f"wait for it, use another run.output_dir, or delete {self.path} if that run is gone"
            )
        if _alive(holder["pid"], holder.get("proc_start")):
            raise RunLockError(
                f"{self.path.parent} is in use by the running {who}; wait for it to end, stop it, or use another run.output_dir"
            )

    def release(self) -> None:
        """Delete the lock file if it is still ours, and the folders :meth:`acquire` created if they
        are empty now (a run that failed before writing anything leaves no trace)."""
        if self._mine is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.path.read_text()) == self._mine:
                self.path.unlink()
        self._mine = None
        for folder in self._created:
            with contextlib.suppress(OSError):  # not empty (the run wrote there), or gone
                folder.rmdir()
        self._created = []
