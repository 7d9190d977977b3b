"""Hook module of omnicore-family-qwen3-vl (entry point ``qwen3_vl`` in the group ``omnicore``):
torch-free, the specs name their factories as strings (:mod:`omnicore_family_kit.specs`)."""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl
from omnicore_family_kit.specs import foundation_spec, part_spec

MODEL_TYPES = ("qwen3_vl",)
"""The ``config.json`` ``model_type`` values this family reads (Qwen3-VL): ``foundation/qwen3_vl``
names them in ``extra["model_types"]``, so ``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/qwen3_vl``."""
    description = (
        "Qwen3-VL as published (a Qwen3VLForConditionalGeneration folder): its interleaved-mRoPE LM with DeepStack "
        "inputs, tokenizer and chat template, and its vision tower + mergers as the image and video encoder; exports "
        "the published layout"
    )
    return [foundation_spec(__package__, "qwen3_vl", "Qwen3VLFoundationOptions", MODEL_TYPES, description)]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/qwen3_vl_encoder`` (image and video: one tower serves both)."""
    description = (
        "Qwen3-VL's vision tower with its merger and DeepStack mergers (rows at the LM's width for the placeholders "
        "and for its first layers) from a published checkpoint, fed by the checkpoint's own image and video processors"
    )
    return [part_spec(__package__, "qwen3_vl_encoder", "Qwen3VLEncoderOptions", ("image", "video"), description)]
