"""Hook module of omnicore-family-llava (entry point ``llava`` in the group ``omnicore``).

Torch-free on purpose (``omnicore plugins`` imports every hook module): the specs name their
factories as strings, imported only when a component is built.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl

MODEL_TYPES = ("llava",)
"""The ``config.json`` ``model_type`` values this family reads (LLaVA): ``foundation/llava``
names them in ``extra["model_types"]``, so ``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/llava``."""
    return [
        ComponentSpec(
            name="llava",
            target="omnicore_family_llava.foundation:build",
            options_model="omnicore_family_llava.processor:LlavaFoundationOptions",
            description=(
                "LLaVA as published (LlavaForConditionalGeneration folder): its Llama/Qwen2 LM, tokenizer and chat "
                "template, and its CLIP/SigLIP vision tower + projector as the image encoder; exports the published layout"
            ),
            extra={"model_types": MODEL_TYPES},
        )
    ]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/llava_encoder`` (image)."""
    return [
        ComponentSpec(
            name="llava_encoder",
            target="omnicore_family_llava.encoder:build",
            options_model="omnicore_family_llava.processor:LlavaEncoderOptions",
            processor="omnicore_family_llava.processor:build_processor",
            modalities=("image",),
            description=(
                "LLaVA's vision_tower (CLIP or SigLIP, vision_feature_layer and select strategy as configured) and "
                "multi_modal_projector from a published checkpoint, fed by the checkpoint's own image processor"
            ),
        )
    ]
