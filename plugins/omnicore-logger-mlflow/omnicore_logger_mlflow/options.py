"""Options of the ``mlflow`` logger (``run.loggers: [{name: mlflow, options: {...}}]``).

Free of mlflow and torch: the registry imports it to validate options before the logger is built.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MlflowOptions(BaseModel):
    """Which MLflow store, experiment and run the metrics go to."""

    model_config = ConfigDict(extra="forbid")

    tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI (`sqlite:///abs/path.db`, `http://host:5000`, `databricks`); "
        "unset: MLFLOW_TRACKING_URI if set, else the SQLite file `mlflow/mlflow.db` in run.output_dir",
    )
    artifact_location: str | None = Field(
        default=None,
        description="where a new experiment keeps its artifacts (images, config.json); relative paths are under "
        "run.output_dir; unset: `mlflow/artifacts` in run.output_dir with the default store, else the store's default",
    )
    experiment: str | None = Field(default=None, description="experiment name; unset: MLFLOW_EXPERIMENT_NAME, else `omnicore`")
    run_name: str | None = Field(default=None, description="the run's name; unset: the run folder's name")
    tags: dict[str, str] = Field(default_factory=dict, description="tags of the run")
