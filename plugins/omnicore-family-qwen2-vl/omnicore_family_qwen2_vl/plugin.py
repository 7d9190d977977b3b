"""Hook module of omnicore-family-qwen2-vl (entry point ``qwen2_vl`` in the group ``omnicore``):
torch-free, the specs name their factories as strings (:mod:`omnicore_family_kit.specs`)."""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl
from omnicore_family_kit.specs import foundation_spec, part_spec

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
"""The ``config.json`` ``model_type`` values this family reads (Qwen2-VL and Qwen2.5-VL): ``foundation/qwen2_vl``
names them in ``extra["model_types"]``, so ``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/qwen2_vl`` (Qwen2-VL and Qwen2.5-VL checkpoints alike)."""
    description = (
        "Qwen2-VL / Qwen2.5-VL as published (a ...ForConditionalGeneration folder): its mRoPE LM, tokenizer and chat "
        "template, and its vision tower + merger as the image and video encoder; exports the published layout"
    )
    return [foundation_spec(__package__, "qwen2_vl", "Qwen2VLFoundationOptions", MODEL_TYPES, description)]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/qwen2_vl_encoder`` (image and video: one tower serves both)."""
    description = (
        "Qwen2-VL / Qwen2.5-VL's vision tower with its merger (output at the LM's width) from a published checkpoint, "
        "fed by the checkpoint's own image and video processors; video may share the image module"
    )
    return [part_spec(__package__, "qwen2_vl_encoder", "Qwen2VLEncoderOptions", ("image", "video"), description)]
