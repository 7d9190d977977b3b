"""Hook module of omnicore-family-llava (entry point ``llava`` in the group ``omnicore``): torch-free,
the specs name their factories as strings (:mod:`omnicore_family_kit.specs`)."""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl
from omnicore_family_kit.specs import foundation_spec, part_spec

MODEL_TYPES = ("llava",)
"""The ``config.json`` ``model_type`` values this family reads (LLaVA)."""
AUTO_MODEL_TYPES: tuple[str, ...] = ()
"""The model types ``model.foundation: {name: auto}`` picks this family for: none. The generic
family (omnicore-family-kit) serves ``llava`` exactly, the newline the chat template writes after
each image included, where this family writes the image alone and leaves that newline to the
sample's text; ``name: llava`` still picks this family."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/llava``."""
    description = (
        "LLaVA as published (LlavaForConditionalGeneration folder): its Llama/Qwen2 LM, tokenizer and chat "
        "template, and its CLIP/SigLIP vision tower + projector as the image encoder; exports the published layout"
    )
    return [foundation_spec(__package__, "llava", "LlavaFoundationOptions", AUTO_MODEL_TYPES, description)]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/llava_encoder`` (image)."""
    description = (
        "LLaVA's vision_tower (CLIP or SigLIP, vision_feature_layer and select strategy as configured) and "
        "multi_modal_projector from a published checkpoint, fed by the checkpoint's own image processor"
    )
    return [part_spec(__package__, "llava_encoder", "LlavaEncoderOptions", ("image",), description)]
