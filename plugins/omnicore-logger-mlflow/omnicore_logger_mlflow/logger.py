"""The ``mlflow`` logger: :class:`MlflowLogger`, on ``mlflow.MlflowClient`` (mlflow-skinny).

What one run records, by default in a SQLite store in the run folder
(``sqlite:///<run.output_dir>/mlflow/mlflow.db``, artifacts in ``<run.output_dir>/mlflow/artifacts``),
in the experiment ``omnicore``, as a run named after the run folder:

* the config, once: flattened to params (``train.max_steps``, ``model.foundation.name``; lists
  and other non-strings as JSON, values cut to MLflow's 6000 characters) and whole as the artifact
  ``config.json``;
* every metrics row as metrics ``<split>/<key>`` (``train/loss``, ``val/val_loss``; the same names as
  the TensorBoard logger) at the row's step, in one ``log_batch``. ``None`` and strings are left out,
  booleans are written as 0 or 1, a NaN as NaN (MLflow stores an infinity as the largest float);
* images with ``log_image(key=name, step=step)`` (``name/i`` when a call has several), which the
  MLflow UI shows per step.

The client is used directly (no ``mlflow.start_run``), so MLflow's process-wide active run, which
the user's own code may hold, is left alone. MLflow's usage telemetry is switched off
(``MLFLOW_DISABLE_TELEMETRY=true`` unless the variable is set) before mlflow is first imported.
A resumed run (``run_info["resume"]``) continues the MLflow run of the first start (its id is kept
in ``<run.output_dir>/mlflow/omnicore-run-id``); params it already has are kept (MLflow forbids
changing one), the resumed config is stored as ``config-resume-step-<N>.json``, and the metric
values of steps after ``N`` (logged by the interrupted run after its last checkpoint) are deleted,
in a SQLite store, so that each step has one value.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omnicore_logger_mlflow.options import MlflowOptions

RUN_ID_FILE = "omnicore-run-id"
"""In ``<run.output_dir>/mlflow/``: the MLflow run id of the last start, read back when the run resumes."""

MAX_PARAM_VALUE = 6000
"""MLflow's longest param value in characters (``mlflow.utils.validation.MAX_PARAM_VAL_LENGTH``)."""

PARAMS_PER_BATCH = 100
"""MLflow's most params in one ``log_batch`` (``MAX_PARAMS_TAGS_PER_BATCH``)."""

MAX_KEY = 250
"""MLflow's longest param or metric name (``MAX_ENTITY_KEY_LENGTH``)."""


class MlflowLogger:
    """An :class:`omnicore.components.Logger` writing an MLflow run.

    Args:
        options: :class:`~omnicore_logger_mlflow.options.MlflowOptions` as a dict.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = MlflowOptions.model_validate(options or {})
        self.client: Any = None
        self.run_id: str | None = None
        self.tracking_uri: str | None = None

    def start(self, run_info: dict[str, Any]) -> None:
        """Open the store, start (or, on resume, continue) the run, log the config; see the module docstring.

        Raises:
            ImportError: mlflow-skinny (or sqlalchemy and alembic, for SQLite) is not installed.
            ValueError: the experiment exists but is deleted.
            mlflow.exceptions.MlflowException: the store cannot be opened or written.
        """
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # read when mlflow is first imported
        from mlflow import MlflowClient

        out = Path(run_info["output_dir"])
        self.tracking_uri, artifacts = self._where(out)
        with _quiet():  # a new SQLite store logs its schema migrations and SQLAlchemy deprecations
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
            experiment_id = self._experiment_id(artifacts)
        id_file = out / "mlflow" / RUN_ID_FILE
        self.run_id = self._resumable(id_file, experiment_id) if run_info.get("resume") else None
        config = run_info.get("config", {})
        if self.run_id is None:
            run = self.client.create_run(experiment_id, run_name=self.options.run_name or run_info.get("run_name"), tags=self.options.tags)
            self.run_id, known, name = run.info.run_id, {}, "config.json"
        else:
            self.client.update_run(self.run_id, status="RUNNING")
            known, name = self.client.get_run(self.run_id).data.params, f"config-resume-step-{int(run_info.get('start_step', 0))}.json"
            self._drop_metrics_after(int(run_info.get("start_step", 0)))
        self._log_params({k: v for k, v in flatten_config(config).items() if k not in known})
        self.client.log_dict(self.run_id, config, name)
        id_file.parent.mkdir(parents=True, exist_ok=True)
        id_file.write_text(self.run_id + "\n")

    def _where(self, out: Path) -> tuple[str, str | None]:
        """The tracking URI and the artifact location for a new experiment (None: the store's default)."""
        uri = self.options.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        location = self.options.artifact_location
        if location is not None and ":" not in location and not Path(location).is_absolute():
            location = str((out / location).resolve())
        if uri:
            return uri, location
        (out / "mlflow").mkdir(parents=True, exist_ok=True)
        return "sqlite:///" + str((out / "mlflow" / "mlflow.db").resolve()), location or str((out / "mlflow" / "artifacts").resolve())

    def _experiment_id(self, artifacts: str | None) -> str:
        """The id of the experiment ``options.experiment``, created (with ``artifacts``) when missing."""
        name = self.options.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "omnicore"
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            return self.client.create_experiment(name, artifact_location=artifacts)
        if experiment.lifecycle_stage == "deleted":
            raise ValueError(
                f"MLflow experiment {name!r} in {self.tracking_uri} is deleted: restore it (`mlflow experiments restore`) or set the mlflow logger's `experiment` option"
            )
        return experiment.experiment_id

    def _resumable(self, id_file: Path, experiment_id: str) -> str | None:
        """The run id an earlier start kept, if that run is still in this store and experiment."""
        from mlflow.exceptions import MlflowException

        try:
            run_id = id_file.read_text().strip()
            run = self.client.get_run(run_id)
        except (FileNotFoundError, MlflowException):
            return None
        return run_id if run.info.experiment_id == experiment_id and run.info.lifecycle_stage == "active" else None

    def _drop_metrics_after(self, step: int) -> None:
        """Delete the run's metric values of steps after ``step`` (logged by the interrupted run after
        its last checkpoint; the resumed run logs those steps again), so that the run holds one value
        per metric and step. MLflow's client cannot delete a metric value, so this is done in the
        store's own database, for a SQLite store (the default); another store keeps them, with a warning."""
        import sqlite3

        if not self.tracking_uri.startswith("sqlite:///"):
            warnings.warn(
                f"mlflow logger: the run in {self.tracking_uri} keeps the values the interrupted run logged after step {step}; "
                "MLflow can delete them only in a SQLite store",
                stacklevel=2,
            )
            return
        with contextlib.closing(sqlite3.connect(self.tracking_uri[len("sqlite:///") :])) as db, db:
            db.execute("DELETE FROM metrics WHERE run_uuid = ? AND step > ?", (self.run_id, step))
            db.execute("DELETE FROM latest_metrics WHERE run_uuid = ? AND step > ?", (self.run_id, step))
            # each key's latest value again, as MLflow picks it: the largest (step, timestamp, value)
            db.execute(
                "INSERT OR REPLACE INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                "SELECT key, value, timestamp, step, is_nan, run_uuid FROM metrics m WHERE run_uuid = ? AND NOT EXISTS "
                "(SELECT 1 FROM latest_metrics l WHERE l.run_uuid = m.run_uuid AND l.key = m.key) "
                "AND (step, timestamp, value) = (SELECT step, timestamp, value FROM metrics n WHERE n.run_uuid = m.run_uuid "
                "AND n.key = m.key ORDER BY step DESC, timestamp DESC, value DESC LIMIT 1)",
                (self.run_id,),
            )

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + PARAMS_PER_BATCH])

    def log_metrics(self, step: int, row: dict[str, Any], split: str) -> None:
        """Log each numeric value of ``row`` as the metric ``<split>/<key>`` at ``step`` (one ``log_batch``)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = []
        for key, value in row.items():
            if key == "step" or value is None or isinstance(value, str):
                continue
            if isinstance(value, (bool, int, float)):
                metrics.append(Metric(mlflow_name(f"{split}/{key}"), float(value), now, int(step)))
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def log_images(self, step: int, name: str, images: list[Any]) -> None:
        """Log ``images`` (numpy ``uint8`` ``[H, W, 3]``) with ``log_image`` under ``name`` (``name/i`` for several).

        Raises:
            ValueError: an image is not a ``uint8`` array ``[H, W, 3]``.
        """
        import numpy as np

        bad = [(tuple(getattr(im, "shape", ())), str(getattr(im, "dtype", type(im).__name__))) for im in images]
        bad = [b for b in bad if len(b[0]) != 3 or b[0][2] != 3 or b[1] != "uint8"]
        if bad:
            raise ValueError(f"log_images({name!r}): expected uint8 arrays [H, W, 3], got (shape, dtype) {bad}")
        for i, image in enumerate(images):
            key = name if len(images) == 1 else f"{name}/{i}"
            self.client.log_image(self.run_id, np.asarray(image), key=key, step=int(step))

    def close(self) -> None:
        """Mark the run finished (safe to call twice)."""
        if self.run_id is not None:
            run_id, self.run_id = self.run_id, None
            self.client.set_terminated(run_id)


def mlflow_name(name: str) -> str:
    """``name`` as a valid MLflow param or metric name: each character MLflow does not allow
    (it allows letters, digits, ``_ - . / : `` and space) becomes ``_``; cut to :data:`MAX_KEY`."""
    return re.sub(r"[^/\w.\- :]", "_", name)[:MAX_KEY]


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``config`` as MLflow params: nested keys joined with ``.`` (see :func:`mlflow_name`); a string
    value as is, any other (number, bool, None, list) as JSON; an empty dict as ``{}``; values cut to
    :data:`MAX_PARAM_VALUE` characters."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_config(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[mlflow_name(name)] = text[:MAX_PARAM_VALUE]
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep MLflow's and alembic's INFO lines and deprecation warnings off the terminal while the
    store opens; levels and filters are restored after."""
    loggers = [logging.getLogger(name) for name in ("mlflow", "alembic")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
