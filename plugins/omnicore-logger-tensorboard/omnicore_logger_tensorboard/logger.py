"""The ``tensorboard`` logger: :class:`TensorBoardLogger`, on ``torch.utils.tensorboard.SummaryWriter``.

What it writes, per run, into ``<run.output_dir>/<log_dir>`` (default ``tensorboard``):

* the config, once, as text under the tag ``config`` (YAML-like JSON, in a code block so
  TensorBoard's text tab keeps its indentation);
* every metrics row as scalars tagged ``<split>/<key>`` (``train/loss``, ``train/lr``,
  ``val/val_loss``) at the row's step; keys with ``/`` keep them (``train/loss/text``). Values that are
  not numbers (``None``, strings) are left out, booleans are written as 0 or 1, and a non-finite
  float (a skipped step's NaN loss) is written as is: TensorBoard shows the gap;
* images as one ``[N, H, W, 3]`` batch tagged with the given name (``add_images``, ``HWC`` order).

A resumed run (``run_info["resume"]``) adds events with a ``purge_step`` at its first step, so
events of steps the checkpoint had not reached (written after the last save of the interrupted
run) are hidden, as TensorBoard documents for restarts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnicore_logger_tensorboard.options import TensorBoardOptions


class TensorBoardLogger:
    """An :class:`omnicore.components.Logger` writing TensorBoard event files.

    Args:
        options: validated :class:`~omnicore_logger_tensorboard.options.TensorBoardOptions` as a dict.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = TensorBoardOptions.model_validate(options or {})
        self.writer: Any = None
        self.log_dir: Path | None = None

    def start(self, run_info: dict[str, Any]) -> None:
        """Open a ``SummaryWriter`` under the run folder and write the config as text.

        Raises:
            ImportError: tensorboard is not installed (``pip install tensorboard``).
            OSError: the folder cannot be created.
        """
        from torch.utils.tensorboard import SummaryWriter

        log_dir = Path(self.options.log_dir)
        if not log_dir.is_absolute():
            log_dir = Path(run_info["output_dir"]) / log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        purge = int(run_info.get("start_step", 0)) + 1 if run_info.get("resume") else None
        self.writer = SummaryWriter(log_dir=str(log_dir), flush_secs=self.options.flush_secs, purge_step=purge)
        self.log_dir = log_dir
        text = json.dumps(run_info.get("config", {}), indent=2, sort_keys=False, default=str)
        self.writer.add_text("config", "```\n" + text + "\n```", global_step=int(run_info.get("start_step", 0)))

    def log_metrics(self, step: int, row: dict[str, Any], split: str) -> None:
        """Write each numeric value of ``row`` as the scalar ``<split>/<key>`` at ``step``."""
        for key, value in row.items():
            if key == "step" or value is None or isinstance(value, str):
                continue
            if isinstance(value, bool):
                value = float(value)
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"{split}/{key}", float(value), global_step=step)

    def log_images(self, step: int, name: str, images: list[Any]) -> None:
        """Write ``images`` (numpy ``uint8`` ``[H, W, 3]``, all of one size) as one batch under ``name``.

        Raises:
            ValueError: an image is not ``uint8`` ``[H, W, 3]``, or the sizes differ.
        """
        import numpy as np

        if not images:
            return
        shapes = {tuple(getattr(im, "shape", ())) for im in images}
        if len(shapes) != 1 or len(next(iter(shapes))) != 3 or next(iter(shapes))[2] != 3:
            raise ValueError(f"log_images({name!r}): expected uint8 arrays [H, W, 3] of one size, got shapes {sorted(shapes)}")
        batch = np.stack([np.asarray(im, dtype=np.uint8) for im in images])
        self.writer.add_images(name, batch, global_step=step, dataformats="NHWC")

    def close(self) -> None:
        """Flush and close the event file (safe to call twice)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
