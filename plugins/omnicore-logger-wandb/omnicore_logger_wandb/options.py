"""Options of the ``wandb`` logger (``run.loggers: [{name: wandb, options: {...}}]``) and the rule
that picks its mode.

Free of wandb and torch: the registry imports it to validate options before the logger is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Mode = Literal["offline", "online", "disabled"]

_ENV_MODES: dict[str, Mode] = {"offline": "offline", "dryrun": "offline", "online": "online", "run": "online", "disabled": "disabled"}
"""``WANDB_MODE`` values wandb accepts, as one of our three modes (``dryrun`` and ``run`` are wandb's old names)."""


class WandbOptions(BaseModel):
    """Where the run goes (mode, project, entity), what it is called, and where its files are kept."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode | None = Field(
        default=None,
        description="offline (files only, `wandb sync` uploads them later), online, or disabled; "
        "unset: WANDB_MODE if set, else online when WANDB_API_KEY is set, else offline",
    )
    project: str | None = Field(default=None, description="W&B project; unset: WANDB_PROJECT, else `omnicore`")
    entity: str | None = Field(default=None, description="W&B user or team; unset: WANDB_ENTITY, else your default entity")
    name: str | None = Field(default=None, description="the run's display name; unset: the run folder's name")
    tags: list[str] = Field(default_factory=list, description="tags of the run (W&B allows up to 64 characters each)")
    dir: str = Field(
        default=".",
        description="folder that gets wandb's `wandb/` folder of run files; relative paths are under run.output_dir "
        "(default: `runs/<name>/wandb/offline-run-*`)",
    )
    quiet: bool = Field(default=True, description="keep wandb's banner and status lines off the terminal (wandb's `silent` setting)")


def resolve_mode(option: Mode | None, environ: Mapping[str, str]) -> Mode:
    """The mode a run uses: the ``mode`` option if set; else ``WANDB_MODE``; else ``online`` when
    ``WANDB_API_KEY`` is set and ``offline`` when it is not.

    Raises:
        ValueError: ``WANDB_MODE`` holds a value wandb does not know.
    """
    if option is not None:
        return option
    env = environ.get("WANDB_MODE", "").strip().lower()
    if env:
        if env not in _ENV_MODES:
            raise ValueError(
                f"WANDB_MODE={env!r} is not one of {sorted(_ENV_MODES)}; fix the variable or set the wandb logger's `mode` option"
            )
        return _ENV_MODES[env]
    return "online" if environ.get("WANDB_API_KEY") else "offline"
