"""Hook module of omnicore-family-qwen3-vl (entry point ``qwen3_vl`` in the group ``omnicore``).

Torch-free on purpose (``omnicore plugins`` imports every hook module): the specs name their
factories as strings, imported only when a component is built.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl

MODEL_TYPES = ("qwen3_vl",)
"""The ``config.json`` ``model_type`` values this family reads (Qwen3-VL): ``foundation/qwen3_vl``
names them in ``extra["model_types"]``, so ``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/qwen3_vl``."""
    return [
        ComponentSpec(
            name="qwen3_vl",
            target="omnicore_family_qwen3_vl.foundation:build",
            options_model="omnicore_family_qwen3_vl.processor:Qwen3VLFoundationOptions",
            description=(
                "Qwen3-VL as published (a Qwen3VLForConditionalGeneration folder): its interleaved-mRoPE LM with DeepStack "
                "inputs, tokenizer and chat template, and its vision tower + mergers as the image and video encoder; exports "
                "the published layout"
            ),
            extra={"model_types": MODEL_TYPES},
        )
    ]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/qwen3_vl_encoder`` (image and video: one tower serves both)."""
    return [
        ComponentSpec(
            name="qwen3_vl_encoder",
            target="omnicore_family_qwen3_vl.encoder:build",
            options_model="omnicore_family_qwen3_vl.processor:Qwen3VLEncoderOptions",
            processor="omnicore_family_qwen3_vl.processor:build_processor",
            modalities=("image", "video"),
            description=(
                "Qwen3-VL's vision tower with its merger and DeepStack mergers (rows at the LM's width for the placeholders "
                "and for its first layers) from a published checkpoint, fed by the checkpoint's own image and video processors"
            ),
        )
    ]
