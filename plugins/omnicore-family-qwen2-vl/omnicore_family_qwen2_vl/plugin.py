"""Hook module of omnicore-family-qwen2-vl (entry point ``qwen2_vl`` in the group ``omnicore``).

Torch-free on purpose (``omnicore plugins`` imports every hook module): the specs name their
factories as strings, imported only when a component is built.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
"""The ``config.json`` ``model_type`` values this family reads (Qwen2-VL and Qwen2.5-VL): ``foundation/qwen2_vl``
names them in ``extra["model_types"]``, so ``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/qwen2_vl`` (Qwen2-VL and Qwen2.5-VL checkpoints alike)."""
    return [
        ComponentSpec(
            name="qwen2_vl",
            target="omnicore_family_qwen2_vl.foundation:build",
            options_model="omnicore_family_qwen2_vl.processor:Qwen2VLFoundationOptions",
            description=(
                "Qwen2-VL / Qwen2.5-VL as published (a ...ForConditionalGeneration folder): its mRoPE LM, tokenizer and chat "
                "template, and its vision tower + merger as the image and video encoder; exports the published layout"
            ),
            extra={"model_types": MODEL_TYPES},
        )
    ]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/qwen2_vl_encoder`` (image and video: one tower serves both)."""
    return [
        ComponentSpec(
            name="qwen2_vl_encoder",
            target="omnicore_family_qwen2_vl.encoder:build",
            options_model="omnicore_family_qwen2_vl.processor:Qwen2VLEncoderOptions",
            processor="omnicore_family_qwen2_vl.processor:build_processor",
            modalities=("image", "video"),
            description=(
                "Qwen2-VL / Qwen2.5-VL's vision tower with its merger (output at the LM's width) from a published checkpoint, "
                "fed by the checkpoint's own image and video processors; video may share the image module"
            ),
        )
    ]
