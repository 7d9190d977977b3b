"""The options every family component shares (pydantic, strict; torch-free)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CheckpointOptions(BaseModel):
    """Options of a component that reads a published checkpoint: ``checkpoint``, and no option it
    does not know (``extra="forbid"``). A family's options subclass it, describing ``checkpoint``
    for the family and adding their own fields."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(
        description="a published checkpoint folder (config.json, safetensors, tokenizer and processor files), or a Hub name in the local cache"
    )
