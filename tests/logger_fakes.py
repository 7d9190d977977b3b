"""Fake loggers for tests/test_loggers.py: a torch-free hook module (the contract suite imports it in
a fresh interpreter) with a logger that records every call, one that raises in ``log_metrics``, one
that raises in ``start``, and one that stores wrong values (the contract suite must catch it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnicore.components import ComponentSpec
from omnicore.hookspecs import hookimpl

CALLS: list[tuple[str, str, Any]] = []
"""``(logger name, method, argument)`` of every call to the fakes of this process, in order."""


class RecordingLogger:
    """Records each call in :data:`CALLS` and writes each metrics row to ``<output_dir>/<name>.jsonl``."""

    name = "recording"
    drops_stale = True

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.file: Path | None = None

    def start(self, run_info: dict[str, Any]) -> None:
        CALLS.append((self.name, "start", run_info))
        self.file = Path(run_info["output_dir"]) / f"{self.name}.jsonl"
        self.file.parent.mkdir(parents=True, exist_ok=True)
        if not run_info["resume"]:
            self.file.unlink(missing_ok=True)
        elif self.file.is_file() and self.drops_stale:  # a resume: only the rows up to the checkpoint's step stay
            kept = [x for x in self.file.read_text().splitlines() if json.loads(x)["step"] <= run_info["start_step"]]
            self.file.write_text("".join(x + "\n" for x in kept))

    def log_metrics(self, step: int, row: dict[str, Any], split: str) -> None:
        CALLS.append((self.name, "log_metrics", (step, dict(row), split)))
        with self.file.open("a") as fh:
            fh.write(json.dumps({"step": step, "split": split, "row": self.stored(row)}) + "\n")

    def stored(self, row: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v}

    def log_images(self, step: int, name: str, images: list[Any]) -> None:
        CALLS.append((self.name, "log_images", (step, name, [im.shape for im in images])))

    def close(self) -> None:
        CALLS.append((self.name, "close", None))


class FailingLogLogger(RecordingLogger):
    """Starts fine, then raises in every ``log_metrics``."""

    name = "failing_log"

    def log_metrics(self, step: int, row: dict[str, Any], split: str) -> None:
        CALLS.append((self.name, "log_metrics", (step, dict(row), split)))
        raise ConnectionError("server went away")


class FailingStartLogger(RecordingLogger):
    """Raises in ``start``, as a logger whose library or server is missing does."""

    name = "failing_start"

    def start(self, run_info: dict[str, Any]) -> None:
        CALLS.append((self.name, "start", run_info))
        raise PermissionError("cannot write to /nowhere/events")


class WrongValuesLogger(RecordingLogger):
    """Stores every value doubled: a broken logger the contract suite must reject."""

    name = "wrong_values"

    def stored(self, row: dict[str, Any]) -> dict[str, Any]:
        return {k: 2 * v for k, v in super().stored(row).items()}


class StaleRowsLogger(RecordingLogger):
    """Keeps the rows an interrupted run logged after the step it resumes from: a broken logger the
    contract suite must reject."""

    name = "stale_rows"
    drops_stale = False


def read_back(output_dir: Path, name: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """What a :class:`RecordingLogger` named ``name`` wrote under ``output_dir``, in the contract's form."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for line in (Path(output_dir) / f"{name}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for key, value in rec["row"].items():
            if key != "step":
                out.setdefault((rec["split"], key), []).append((rec["step"], value))
    return out


@hookimpl
def omnicore_loggers() -> list[ComponentSpec]:
    return [
        ComponentSpec(name=cls.name, target=f"{__name__}:{cls.__name__}", description=f"test fake: {cls.__doc__.splitlines()[0]}")
        for cls in (RecordingLogger, FailingLogLogger, FailingStartLogger, WrongValuesLogger, StaleRowsLogger)
    ]
