"""Hook module of omnicore-logger-wandb (entry point ``wandb`` in the group ``omnicore``).

Free of wandb and torch on purpose: ``omnicore plugins`` imports every hook module. The spec names
its factory as a string; :mod:`omnicore_logger_wandb.logger` imports ``wandb`` only in ``start``.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_loggers() -> list[ComponentSpec]:
    """Register ``logger/wandb``."""
    return [
        ComponentSpec(
            name="wandb",
            target="omnicore_logger_wandb.logger:WandbLogger",
            options_model="omnicore_logger_wandb.options:WandbOptions",
            description="Weights & Biases (wandb; offline unless WANDB_API_KEY is set): the config, every metrics row, images",
        )
    ]
