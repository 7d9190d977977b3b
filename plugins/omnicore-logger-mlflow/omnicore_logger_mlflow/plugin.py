"""Hook module of omnicore-logger-mlflow (entry point ``mlflow`` in the group ``omnicore``).

Free of mlflow and torch on purpose: ``omnicore plugins`` imports every hook module. The spec names
its factory as a string; :mod:`omnicore_logger_mlflow.logger` imports ``mlflow`` only in ``start``.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_loggers() -> list[ComponentSpec]:
    """Register ``logger/mlflow``."""
    return [
        ComponentSpec(
            name="mlflow",
            target="omnicore_logger_mlflow.logger:MlflowLogger",
            options_model="omnicore_logger_mlflow.options:MlflowOptions",
            description="MLflow tracking (a SQLite store in the run folder by default): the config as params, every metrics row, images",
        )
    ]
