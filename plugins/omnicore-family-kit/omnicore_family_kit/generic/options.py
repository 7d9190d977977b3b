"""Options of the generic family's components (pydantic, strict)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class AutoFoundationOptions(BaseModel):
    """Options of ``foundation/generic`` when no family plugin claims the checkpoint's model type."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(
        description=(
            "a folder written by a transformers multimodal class's save_pretrained with its processor (config.json, "
            "safetensors, tokenizer and processor files), or a Hub id in the local cache (e.g. llava-hf/llava-1.5-7b-hf)"
        )
    )


class AutoEncoderOptions(BaseModel):
    """Options of ``encoder/generic_encoder``: one modality of a checkpoint served by the generic family."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str = Field(description="the same folder as the foundation's options.checkpoint")
    modality: Literal["image", "video", "audio"] = Field(
        default="image", description="the medium this entry reads: image (PIL images), video (omnicore.api.Video) or audio"
    )
    marker: str | None = Field(
        default=None,
        description=(
            "the text the checkpoint's processor expands into one item's tokens (default: what its chat template writes for "
            "one item of the modality, else the processor's own token such as image_token)"
        ),
    )
