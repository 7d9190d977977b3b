"""Hook module of omnicore-logger-tensorboard (entry point ``tensorboard`` in the group ``omnicore``).

Torch-free on purpose: ``omnicore plugins`` imports every hook module. The spec names its factory
as a string; :mod:`omnicore_logger_tensorboard.logger` (torch, tensorboard) is imported only when
the logger is built.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_loggers() -> list[ComponentSpec]:
    """Register ``logger/tensorboard``."""
    return [
        ComponentSpec(
            name="tensorboard",
            target="omnicore_logger_tensorboard.logger:TensorBoardLogger",
            options_model="omnicore_logger_tensorboard.options:TensorBoardOptions",
            description="TensorBoard event files (torch.utils.tensorboard): config as text, every metrics row as scalars, images",
        )
    ]
