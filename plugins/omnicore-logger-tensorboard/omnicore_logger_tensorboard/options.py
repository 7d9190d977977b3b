"""Options of the ``tensorboard`` logger (``run.loggers: [{name: tensorboard, options: {...}}]``).

Torch-free: the registry imports it to validate options before the logger is built.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TensorBoardOptions(BaseModel):
    """Where the event files go and how often they are flushed."""

    model_config = ConfigDict(extra="forbid")

    log_dir: str = Field(
        default="tensorboard",
        description="folder of the event files; relative paths are under run.output_dir (`tensorboard --logdir runs/x/tensorboard`)",
    )
    flush_secs: int = Field(default=30, gt=0, description="seconds between flushes of pending events to disk (close() flushes all)")
