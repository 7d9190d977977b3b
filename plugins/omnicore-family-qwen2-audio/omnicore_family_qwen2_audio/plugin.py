"""Hook module of omnicore-family-qwen2-audio (entry point ``qwen2_audio`` in the group ``omnicore``):
torch-free, the specs name their factories as strings (:mod:`omnicore_family_kit.specs`)."""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl
from omnicore_family_kit.specs import foundation_spec, part_spec

MODEL_TYPES = ("qwen2_audio",)
"""The ``config.json`` ``model_type`` values this family reads (Qwen2-Audio): ``foundation/qwen2_audio``
names them in ``extra["model_types"]``, so ``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/qwen2_audio``."""
    description = (
        "Qwen2-Audio as published (Qwen2AudioForConditionalGeneration folder): its Qwen2 LM, tokenizer and chat "
        "template, and its audio tower + projector as the audio encoder; exports the published layout"
    )
    return [foundation_spec(__package__, "qwen2_audio", "Qwen2AudioFoundationOptions", MODEL_TYPES, description)]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/qwen2_audio_encoder`` (audio)."""
    description = (
        "Qwen2-Audio's audio_tower (Whisper-style, avg-pooled) and multi_modal_projector from a published "
        "checkpoint, fed by the checkpoint's own WhisperFeatureExtractor"
    )
    return [part_spec(__package__, "qwen2_audio_encoder", "Qwen2AudioEncoderOptions", ("audio",), description)]
