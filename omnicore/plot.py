"""``omnicore plot RUN_DIR``: a run's curves as one PNG, ``RUN_DIR/loss.png``, from ``metrics.jsonl``.

Six panels against the optimizer step: the loss (training rows' ``loss``; validation rows'
``val_loss`` as a second line), the loss of each part (training rows' ``loss/text``,
``loss/decoder.<m>``... as ``train text``, ``train decoder.<m>``; validation rows' ``val_loss/<part>``
as ``val <part>``), the learning rate (``lr``), the throughput (``tokens_per_s``), and the balance
across ranks (:mod:`omnicore.train.metrics`): the spread of model FLOPs (``flops_spread``, max over
mean) and the wait at the gradient reduction (``reduce_wait_s`` as ``mean``,
``reduce_wait_max_s`` as ``max``, ``reduce_wait_s/rank<r>`` as ``rank <r>``).
Training rows are those without a ``split`` key (or ``"split": "train"``); a validation row is one
with ``"split": "val"`` (its ``val_loss``, or its ``loss`` when it has no ``val_loss``) or any row
holding ``val_loss`` (see :mod:`omnicore.eval.validate`). Values that are ``null`` (a skipped
step's NaN) are left out. When a step appears twice (a run resumed from an earlier checkpoint
appends the steps after it again), the last row wins.

The end of training writes the same file (:func:`plot_after_training`, rank 0). matplotlib is
imported inside :func:`plot_run` only, with the Agg backend (no display needed), so importing this
module costs nothing; it imports nothing from omnicore either.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Curve = tuple[list[int], list[float]]
"""``(steps, values)`` of one line, sorted by step."""

PANELS = {
    "loss": "loss",
    "parts": "loss by part",
    "lr": "learning rate",
    "tokens_per_s": "tokens/s",
    "flops_spread": "FLOP spread\n(max/mean)",
    "reduce_wait": "wait at\nreduction (s)",
}
"""Panel key -> y-axis label, top to bottom."""


class PlotError(Exception):
    """``metrics.jsonl`` is missing, empty, or holds a line that is not a JSON object; the message
    names the file (and line) and what to do."""


@dataclass
class Plot:
    """What :func:`plot_run` drew: the PNG's path and, per panel (``loss``, ``lr``,
    ``tokens_per_s``), each line's label (``train``, ``val``) and its :data:`Curve`."""

    path: Path
    panels: dict[str, dict[str, Curve]] = field(default_factory=dict)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file, in file order.

    A last line without its newline that is not valid JSON is a row still being written by a live
    run and is left out; any other bad line is an error.

    Raises:
        PlotError: the file is missing or holds no row (``PATH: ...``), or a line is not a JSON
            object (``PATH:LINE: ...``).
    """
    path = Path(path)
    if not path.is_file():
        raise PlotError(f"{path}: no such file; give a run folder (run.output_dir) whose run.loggers include jsonl")
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines):  # the unterminated last line of a run that is writing it now
                break
            raise PlotError(f"{path}:{i}: not valid JSON ({exc.msg}); each line must be one metrics row") from exc
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise PlotError(f"{path}:{i}: not a metrics row (a JSON object with an integer 'step')")
        rows.append(row)
    if not rows:
        raise PlotError(f"{path}: empty, no metrics rows yet; train first (rows are written every train.log_every steps)")
    return rows


def curves(rows: list[dict[str, Any]]) -> dict[str, dict[str, Curve]]:
    """Per panel, the lines to draw from metrics rows (module docstring: which rows, which keys).

    Returns:
        ``{"loss": {"train": curve, "val": curve}, "parts": {"train text": curve, "val text": curve,
        ...}, "lr": {"train": curve}, "tokens_per_s": {"train": curve}, "flops_spread": {"train":
        curve}, "reduce_wait": {"mean": curve, "max": curve, "rank 0": curve, ...}}`` with only the
        lines that have at least one finite value.
    """
    points: dict[tuple[str, str], dict[int, float]] = {}

    def add(panel: str, label: str, step: int, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            points.setdefault((panel, label), {})[step] = float(value)

    for row in rows:
        step, split = row["step"], row.get("split", "train")
        if split == "train":
            for key in PANELS:
                add(key, "train", step, row.get(key))
        val = row.get("val_loss", row.get("loss") if split == "val" else None)
        add("loss", "val", step, val)
        for key, value in row.items():
            if split == "train" and key.startswith("loss/"):
                add("parts", f"train {key[len('loss/') :]}", step, value)
            elif split == "train" and key.startswith("reduce_wait_"):
                label = {"reduce_wait_s": "mean", "reduce_wait_max_s": "max"}.get(key, key.replace("reduce_wait_s/rank", "rank "))
                add("reduce_wait", label, step, value)
            elif key.startswith("val_loss/"):
                add("parts", f"val {key[len('val_loss/') :]}", step, value)
    out: dict[str, dict[str, Curve]] = {}
    for (panel, label), by_step in points.items():
        steps = sorted(by_step)
        out.setdefault(panel, {})[label] = (steps, [by_step[s] for s in steps])
    return {p: out[p] for p in PANELS if p in out}


def plot_run(run_dir: str | Path, out: str | Path | None = None, *, size: tuple[int, int] = (900, 1100)) -> Plot:
    """Draw a run's curves (module docstring) into ``out`` (default ``RUN_DIR/loss.png``).

    Args:
        run_dir: the run folder (``run.output_dir``) holding ``metrics.jsonl``.
        out: the PNG to write; its folder is created.
        size: the image's width and height in pixels.

    Returns:
        The :class:`Plot`: the path written and the exact data of every line drawn.

    Raises:
        PlotError: as :func:`read_metrics`, or when no row has a figure of any panel.
        OSError: the PNG cannot be written.
    """
    src = Path(run_dir) / "metrics.jsonl"
    panels = curves(read_metrics(src))
    if not panels:
        raise PlotError(f"{src}: no row holds a finite loss, lr, tokens_per_s or balance figure; nothing to plot")
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    dpi = 100
    fig, axes = plt.subplots(len(PANELS), 1, sharex=True, figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    try:
        for ax, (key, ylabel) in zip(axes, PANELS.items(), strict=True):
            _draw_panel(ax, panels.get(key, {}), ylabel, log_y=key in ("loss", "parts"))
        axes[-1].set_xlabel("step")
        fig.suptitle(str(Path(run_dir)))
        fig.tight_layout()
        path = Path(out) if out is not None else Path(run_dir) / "loss.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)  # no bbox_inches="tight": the image is exactly `size`
    finally:
        plt.close(fig)
    return Plot(path=path, panels=panels)


def _draw_panel(ax: Any, lines: dict[str, Curve], ylabel: str, *, log_y: bool) -> None:
    """One panel: each line, with markers where a line has few points (validation every N steps)."""
    if not lines:
        ax.text(0.5, 0.5, "not in metrics.jsonl", ha="center", va="center", transform=ax.transAxes, color="grey")
    for label, (steps, values) in lines.items():
        rank = label.startswith("rank ")  # one rank's wait: thinner and dashed under the mean and max
        ax.plot(steps, values, label=label, marker="o" if len(steps) <= 30 else None, markersize=3, linewidth=0.8 if rank else 1.2,
                linestyle="--" if rank else "-")  # fmt: skip
    values = [v for _, vs in lines.values() for v in vs]
    if log_y and values and min(values) > 0 and max(values) / min(values) > 20:  # a loss spanning decades
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if len(lines) > 1:
        ax.legend()


def plot_after_training(run_dir: str | Path) -> str:
    """Write ``RUN_DIR/loss.png`` at the end of training; returns the line to log. Never raises:
    a run that trained must not fail because its picture could not be drawn, so any error (no
    matplotlib, no ``metrics.jsonl`` because ``run.loggers`` has no ``jsonl``, a full disk) becomes
    a ``warning:`` line instead."""
    try:
        return f"loss curves: {plot_run(run_dir).path}"
    except Exception as exc:  # noqa: BLE001 - a picture is never worth a failed run
        return f"warning: loss.png not written ({type(exc).__name__}: {exc}); try `omnicore plot {run_dir}`"
