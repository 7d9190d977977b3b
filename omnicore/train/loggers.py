"""The run's loggers (``run.loggers``): built from the registry, started before step 1, fed every
metrics row, closed at the end; and the built-in ``jsonl`` logger, which writes ``metrics.jsonl``.

Loggers are a component kind (:class:`omnicore.components.Logger`, hook ``omnicore_loggers``). They
run on rank 0 only: the other ranks hold an empty :class:`Loggers`. The failure policy:

* a logger that cannot be resolved, whose options are invalid, or whose ``start`` raises stops the
  run before step 1 with one :class:`LoggerError` naming ``run.loggers[i]`` and the reason (the CLI
  prints it as one ``error:`` line); on several processes every rank raises it, so none waits in a
  collective for rank 0;
* a logger that raises in ``log_metrics``, ``log_images`` or ``close`` is reported once, as a
  :class:`LoggerWarning` naming it, and is **skipped** for the rest of the run (not retried: a
  logger that failed once, such as a full disk or a lost connection, would otherwise warn every
  step); the run and the other loggers go on.
* a logger that raises ``SystemExit`` or ``KeyboardInterrupt`` in a hook (a plugin calling
  ``sys.exit``) asks to end the process: it is skipped from then on, and the run stops as it does
  on a stop signal (:mod:`omnicore.train.signals`): the step is finished and saved, then
  :class:`LoggerStopped` says which logger asked and how to continue; the process ends with the
  status the logger asked for (130 for ``KeyboardInterrupt``). Ending the process inside the hook
  would lose every step since the last checkpoint.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnicore.config import ComponentConfig, Config, ConfigError
from omnicore.train.signals import Interrupted

METRICS_FILE = "metrics.jsonl"
"""The built-in ``jsonl`` logger's file, in ``run.output_dir``."""


class LoggerError(ConfigError):
    """A logger of ``run.loggers`` could not be built or started; the message names
    ``run.loggers[i]`` and the reason."""


class LoggerWarning(UserWarning):
    """A logger raised while logging; it is skipped from then on (issued once per logger)."""


@dataclass(frozen=True)
class StopRequest:
    """A logger raised ``SystemExit`` or ``KeyboardInterrupt`` in a hook: a request to end the run,
    honoured like a stop signal (finish the step, save, stop)."""

    where: str
    """``run.loggers[i] (name)``."""
    method: str
    """The hook that raised: ``log_metrics``, ``log_images`` or ``close``."""
    raised: str
    """What it raised: ``SystemExit(3)``, ``KeyboardInterrupt``."""
    exit_code: int
    """The status the process ends with: the ``SystemExit`` code when it is a non-zero int, 130 for
    ``KeyboardInterrupt`` (as for SIGINT), else 1 (a run stopped early never exits 0)."""

    def describe(self) -> str:
        """``run.loggers[0] (jsonl): log_metrics raised SystemExit(3)``."""
        return f"{self.where}: {self.method} raised {self.raised}"

    @classmethod
    def of(cls, where: str, method: str, exc: BaseException) -> StopRequest:
        """The request of ``exc`` (a ``SystemExit`` or ``KeyboardInterrupt``) raised by ``where``'s ``method``."""
        if isinstance(exc, SystemExit):
            code = exc.code
            return cls(where, method, f"SystemExit({code!r})", code if isinstance(code, int) and code else 1)
        return cls(where, method, type(exc).__name__, 130)


class LoggerStopped(Interrupted):
    """The run stopped, after saving, because a logger raised ``SystemExit`` or ``KeyboardInterrupt``
    (:class:`StopRequest`); the CLI prints the message and exits with :attr:`exit_code`, the status
    the logger asked for."""

    def __init__(self, code: int, message: str):
        super().__init__(2, message)  # signum: unused here, exit_code says the status
        self.code = code

    @property
    def exit_code(self) -> int:
        return self.code


@dataclass
class _Slot:
    where: str  # "run.loggers[i] (name)"
    logger: Any
    failed: bool = False


class Loggers:
    """The started loggers of a run, called in ``run.loggers`` order (empty on ranks other than 0).

    Each call goes to every logger that has not failed; a logger that raises is reported once
    (:class:`LoggerWarning`) and skipped afterwards.
    """

    def __init__(self, slots: list[_Slot] | None = None) -> None:
        self._slots = list(slots or [])
        self._closed = False
        self.stop_request: StopRequest | None = None
        """The first logger's request to end the run (it raised ``SystemExit`` or
        ``KeyboardInterrupt``), which the training loop honours after the step; None when none asked."""

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def failed(self) -> list[str]:
        """``run.loggers[i] (name)`` of each logger that raised so far."""
        return [s.where for s in self._slots if s.failed]

    def log_metrics(self, step: int, row: dict[str, Any], split: str = "train") -> None:
        """Hand one metrics row (step ``step``, 1-based) to every logger; ``split``: ``train`` or ``val``."""
        for slot in self._slots:
            self._call(slot, "log_metrics", step, row, split)

    def log_images(self, step: int, name: str, images: list[Any]) -> None:
        """Hand images (numpy ``uint8`` ``[H, W, 3]`` each) to every logger under ``name``."""
        for slot in self._slots:
            self._call(slot, "log_images", step, name, images)

    def close(self) -> None:
        """Close every logger once (those that failed too: they may hold open files); idempotent."""
        if self._closed:
            return
        self._closed = True
        for slot in self._slots:
            self._call(slot, "close", force=True)

    def _call(self, slot: _Slot, method: str, *args: Any, force: bool = False) -> None:
        if slot.failed and not force:
            return
        try:
            getattr(slot.logger, method)(*args)
        except (SystemExit, KeyboardInterrupt) as exc:  # a request to end the run: honoured after the step, once saved
            request = StopRequest.of(slot.where, method, exc)
            if self.stop_request is None:
                self.stop_request = request
            if not slot.failed:
                warnings.warn(
                    f"{request.describe()}: the run stops after this step, once it is saved; this logger is skipped from now on",
                    LoggerWarning,
                    stacklevel=3,
                )
            slot.failed = True
        except Exception as exc:  # a logger's failure must not end the run
            if not slot.failed:
                reason = " ".join(f"{type(exc).__name__}: {exc}".split())
                warnings.warn(
                    f"{slot.where}: {method} raised {reason}; this logger is skipped for the rest of the run", LoggerWarning, stacklevel=3
                )
            slot.failed = True


def check_loggers(cfg: Config, registry: Any) -> None:
    """Resolve every ``run.loggers`` entry and validate its options, without building it: run early
    so that a misspelt logger fails before the (slow) model build.

    Raises:
        LoggerError: naming ``run.loggers[i]``: unknown name, invalid options, or a ``dtype`` set.
    """
    from omnicore.registry.resolve import validate_options

    for i, choice in enumerate(cfg.run.logger_list()):
        where = f"run.loggers[{i}] ({choice.name})"
        if choice.dtype is not None:
            raise LoggerError(f"run.loggers[{i}].dtype: a logger has no parameters; remove dtype")
        try:
            validate_options(registry.resolve("logger", choice.name), choice.options)
        except Exception as exc:
            raise LoggerError(f"{where}: {_one_line(exc)}") from exc


def start_loggers(
    cfg: Config, registry: Any, *, is_main: bool, resume: bool = False, start_step: int = 0, distributed: bool = False
) -> Loggers:
    """Build and start ``cfg.run.loggers`` on rank 0 (``is_main``); an empty :class:`Loggers` elsewhere.

    ``run_info`` given to each ``start`` is described by :meth:`omnicore.components.Logger.start`.
    With ``distributed``, rank 0's outcome is broadcast so that a failure raises on every rank.

    Raises:
        LoggerError: a logger could not be built or its ``start`` raised (``run.loggers[i] (name):
            reason``); the loggers started before it are closed first.
    """
    started: list[_Slot] = []
    error = None
    if is_main:
        info = run_info(cfg, resume=resume, start_step=start_step)
        for i, choice in enumerate(cfg.run.logger_list()):
            where = f"run.loggers[{i}] ({choice.name})"
            error = _start_one(registry, choice, where, info, started)
            if error is not None:
                break
    if distributed:
        import torch.distributed as dist

        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        Loggers(started).close()
        raise LoggerError(error)
    return Loggers(started)


def _start_one(registry: Any, choice: ComponentConfig, where: str, info: dict[str, Any], started: list[_Slot]) -> str | None:
    """Build and start one logger, appending it to ``started``; the error line, or None."""
    # SystemExit and KeyboardInterrupt too: before step 1 a logger's sys.exit is an error to name, not a silent exit
    try:
        logger = registry.build("logger", choice.name, choice.options)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        return f"{where}: cannot build it: {_one_line(exc)}"
    try:
        logger.start(dict(info))
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        return f"{where}: start failed: {_one_line(exc)}"
    started.append(_Slot(where, logger))
    return None


def run_info(cfg: Config, *, resume: bool = False, start_step: int = 0) -> dict[str, Any]:
    """What :meth:`omnicore.components.Logger.start` receives: ``config`` (JSON-ready dict),
    ``output_dir`` (str), ``run_name`` (the output folder's name), ``resume``, ``start_step``."""
    out = Path(cfg.run.output_dir)
    return {
        "config": cfg.model_dump(mode="json"),
        "output_dir": str(out),
        "run_name": out.resolve().name,
        "resume": bool(resume),
        "start_step": int(start_step),
    }


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if isinstance(exc, (ConfigError, LookupError)) or type(exc).__name__ == "RegistryError" else f"{type(exc).__name__}: {text}"


class JsonlLogger:
    """The built-in ``jsonl`` logger: one JSON object per line in ``<output_dir>/metrics.jsonl``.

    A training row is written exactly as the loop made it (keys in order, ``step`` first); a row of
    another split gets ``"split": "<split>"`` after ``step``. Strict JSON: NaN and inf (a skipped
    step) are written as ``null``. A fresh run (``resume`` False) empties the file; a resumed one
    first drops the rows of steps after the checkpoint's (``start_step``: a crash after a step was
    logged but before it was saved would otherwise leave two rows of that step once it is trained
    again; a line cut off by the crash goes too), then appends: one row per step and split.
    Each row is appended and the file closed at once, so a crash loses nothing written.
    Images are not stored (use ``samples/`` or an image-capable logger).
    """

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.path: Path | None = None

    def start(self, run_info: dict[str, Any]) -> None:
        """Create the output folder; empty ``metrics.jsonl``, or on ``run_info["resume"]`` keep only
        its rows up to ``run_info["start_step"]`` (:func:`drop_rows_after`)."""
        out = Path(run_info["output_dir"])
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / METRICS_FILE
        if not run_info.get("resume"):
            self.path.unlink(missing_ok=True)
        else:
            drop_rows_after(self.path, int(run_info.get("start_step", 0)))

    def log_metrics(self, step: int, row: dict[str, Any], split: str) -> None:
        """Append ``row`` as one line (see the class docstring for the format).

        Raises:
            RuntimeError: called before :meth:`start`.
        """
        if self.path is None:
            raise RuntimeError("JsonlLogger.log_metrics before start()")
        clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
        if split != "train":
            clean = {"step": clean.pop("step", step), "split": split, **clean}
        elif "step" not in clean:
            clean = {"step": step, **clean}
        with self.path.open("a") as fh:
            fh.write(json.dumps(clean, allow_nan=False) + "\n")

    def log_images(self, step: int, name: str, images: list[Any]) -> None:
        """Nothing: a JSONL file holds no images."""

    def close(self) -> None:
        """Nothing to flush: every row is written when logged."""


def drop_rows_after(path: Path, step: int) -> int:
    """Rewrite the JSONL metrics file ``path`` without its rows of steps after ``step`` (and without
    lines that are not whole JSON objects, such as one cut off by a crash); atomic (a temporary
    file, then ``os.replace``). Returns how many lines were dropped (0: the file is left as it is)."""
    import os

    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or int(row.get("step", 0)) > step:
            dropped += bool(line.strip())
            continue
        kept.append(line + "\n")
    if dropped:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    return dropped
