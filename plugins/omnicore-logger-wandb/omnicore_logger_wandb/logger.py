"""The ``wandb`` logger: :class:`WandbLogger`, on the ``wandb`` library (Weights & Biases).

What one run records (``wandb.init`` then ``run.log``), by default offline, in
``<run.output_dir>/wandb/offline-run-<time>-<id>/`` (``wandb sync`` uploads such a folder later):

* the config, once, as the W&B run config (nested as in the YAML);
* every metrics row as one ``run.log`` call: the values under ``<split>/<key>`` (``train/loss``,
  ``train/lr``, ``val/val_loss``; the same names as the TensorBoard logger) plus ``step``, the
  optimizer step. ``step`` is declared the x-axis of every metric (``define_metric("*",
  step_metric="step")``), so a validation row may come after a training row of a later step (W&B's
  own ``_step`` must only grow, and it is left to wandb). ``None`` and strings are left out,
  booleans are written as 0 or 1, a non-finite float (a skipped step's NaN loss) as is;
* images as a list of ``wandb.Image`` under the name given (``samples/image``) with ``step``.

Offline mode touches no network: no login, and wandb-core's error reports (Sentry) are switched off
(``WANDB_ERROR_REPORTING=false`` while the run starts). A resumed run (``run_info["resume"]``)
continues the W&B run of the first start (its id is kept in ``wandb/omnicore-run-id``) with
``resume="allow"``; offline, that is a second folder with the same id, and ``wandb sync`` of both
folders gives one run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omnicore_logger_wandb.options import Mode, WandbOptions, resolve_mode

STEP_KEY = "step"
"""The history key holding the optimizer step, the x-axis of every metric."""

RUN_ID_FILE = "omnicore-run-id"
"""In ``<dir>/wandb/``: the W&B run id of the last start, read back when the run resumes."""


class WandbLogger:
    """An :class:`omnicore.components.Logger` writing a Weights & Biases run.

    Args:
        options: :class:`~omnicore_logger_wandb.options.WandbOptions` as a dict.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = WandbOptions.model_validate(options or {})
        self.run: Any = None
        self.mode: Mode | None = None
        self.dir: Path | None = None

    def start(self, run_info: dict[str, Any]) -> None:
        """Start (or, on resume, continue) a W&B run with the config; see the module docstring.

        Raises:
            ImportError: wandb is not installed (``pip install wandb``).
            ValueError: ``WANDB_MODE`` holds an unknown value.
            wandb.Error: wandb could not start (online: no API key, no connection).
        """
        import wandb

        mode = resolve_mode(self.options.mode, os.environ)
        root = Path(self.options.dir)
        if not root.is_absolute():
            root = Path(run_info["output_dir"]) / root
        root.mkdir(parents=True, exist_ok=True)
        id_file = root / "wandb" / RUN_ID_FILE
        run_id = _read_run_id(id_file) if run_info.get("resume") else None
        with _no_error_reports(offline=mode == "offline"):
            if self.options.quiet:
                wandb.setup(wandb.Settings(silent=True))  # the terminal settings are wandb's process-wide ones
            self.run = wandb.init(
                mode=mode,
                dir=str(root),
                project=self.options.project or os.environ.get("WANDB_PROJECT") or "omnicore",
                entity=self.options.entity,
                name=self.options.name or run_info.get("run_name"),
                tags=self.options.tags or None,
                config=run_info.get("config", {}),
                id=run_id,
                resume="allow" if run_id else None,
                reinit="create_new",  # leave a W&B run the user's own code holds open alone
                settings=wandb.Settings(silent=self.options.quiet, console="off", allow_val_change=True),
            )
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)
        self.mode, self.dir = mode, root
        if mode != "disabled":
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(self.run.id + "\n")

    def log_metrics(self, step: int, row: dict[str, Any], split: str) -> None:
        """Log each numeric value of ``row`` as ``<split>/<key>``, with ``step``, in one history row."""
        data: dict[str, Any] = {}
        for key, value in row.items():
            if key == "step" or value is None or isinstance(value, str):
                continue
            if isinstance(value, bool):
                value = float(value)
            if isinstance(value, (int, float)):
                data[f"{split}/{key}"] = value
        if data:
            self.run.log({STEP_KEY: int(step), **data})

    def log_images(self, step: int, name: str, images: list[Any]) -> None:
        """Log ``images`` (numpy ``uint8`` ``[H, W, 3]``; sizes may differ) as ``wandb.Image``s under ``name``.

        Raises:
            ValueError: an image is not a ``uint8`` array ``[H, W, 3]``.
        """
        import numpy as np
        import wandb

        if not images:
            return
        bad = [(tuple(getattr(im, "shape", ())), str(getattr(im, "dtype", type(im).__name__))) for im in images]
        bad = [b for b in bad if len(b[0]) != 3 or b[0][2] != 3 or b[1] != "uint8"]
        if bad:
            raise ValueError(f"log_images({name!r}): expected uint8 arrays [H, W, 3], got (shape, dtype) {bad}")
        self.run.log({STEP_KEY: int(step), name: [wandb.Image(np.asarray(im)) for im in images]})

    def close(self) -> None:
        """Finish the W&B run and wait until its files are complete (safe to call twice).

        ``run.finish()`` only asks wandb-core to close the run, which it then does in the background;
        when no other W&B run of this process is active, ``wandb.teardown()`` waits for that (and
        stops wandb-core, which the next ``start`` starts again)."""
        import wandb

        if self.run is not None:
            run, self.run = self.run, None
            run.finish()
            if wandb.setup().most_recent_active_run is None:  # a run of the user's own code stays open
                wandb.teardown()


def _read_run_id(path: Path) -> str | None:
    """The run id kept by an earlier start, or None when there is none."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


@contextlib.contextmanager
def _no_error_reports(*, offline: bool) -> Iterator[None]:
    """Offline, set ``WANDB_ERROR_REPORTING=false`` while wandb starts its service (wandb-core reads
    it then: no Sentry reports over the network); the variable's earlier value is restored after."""
    if not offline:
        yield
        return
    before = os.environ.get("WANDB_ERROR_REPORTING")
    os.environ["WANDB_ERROR_REPORTING"] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("WANDB_ERROR_REPORTING", None)
        else:
            os.environ["WANDB_ERROR_REPORTING"] = before
