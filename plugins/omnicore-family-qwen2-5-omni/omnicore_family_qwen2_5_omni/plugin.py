"""Hook module of omnicore-family-qwen2-5-omni (entry point ``qwen2_5_omni`` in the group ``omnicore``):
torch-free, the specs name their factories as strings (:mod:`omnicore_family_kit.specs`)."""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl
from omnicore_family_kit.specs import foundation_spec, part_spec

MODEL_TYPES = ("qwen2_5_omni", "qwen2_5_omni_thinker")
"""The ``config.json`` ``model_type`` values this family reads (Qwen2.5-Omni: the whole model or its
thinker): ``foundation/qwen2_5_omni`` names them in ``extra["model_types"]``, so
``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/qwen2_5_omni`` (whole-model and thinker-only checkpoints alike)."""
    description = (
        "Qwen2.5-Omni as published (a Qwen2_5OmniForConditionalGeneration or thinker folder): the thinker's mRoPE LM, "
        "tokenizer and chat template, its audio and vision towers as encoders (clips with their sound track "
        "time-aligned); exports the whole model with the talker and token2wav unchanged"
    )
    return [foundation_spec(__package__, "qwen2_5_omni", "Qwen2_5OmniFoundationOptions", MODEL_TYPES, description)]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/qwen2_5_omni_vision`` (image and video: one tower serves both) and
    ``encoder/qwen2_5_omni_audio``."""
    vision = (
        "Qwen2.5-Omni thinker's vision tower with its merger (output at the LM's width) from a published checkpoint, fed "
        "by its image and video processors; a clip's sound track interleaved with its frames (use_audio_in_video)"
    )
    audio = (
        "Qwen2.5-Omni thinker's audio tower (Whisper-style, chunked attention, pooled and projected to the LM's width) "
        "from a published checkpoint, fed by its own WhisperFeatureExtractor"
    )
    return [
        part_spec(
            __package__, "qwen2_5_omni_vision", "Qwen2_5OmniVisionOptions", ("image", "video"), vision, target="encoder:build_vision"
        ),
        part_spec(__package__, "qwen2_5_omni_audio", "Qwen2_5OmniAudioOptions", ("audio",), audio, target="encoder:build_audio"),
    ]
