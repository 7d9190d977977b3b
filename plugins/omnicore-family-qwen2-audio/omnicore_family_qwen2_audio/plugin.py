"""Hook module of omnicore-family-qwen2-audio (entry point ``qwen2_audio`` in the group ``omnicore``).

Torch-free on purpose (``omnicore plugins`` imports every hook module): the specs name their
factories as strings, imported only when a component is built.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl

MODEL_TYPES = ("qwen2_audio",)
"""The ``config.json`` ``model_type`` values this family reads (Qwen2-Audio): ``foundation/qwen2_audio``
names them in ``extra["model_types"]``, so ``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/qwen2_audio``."""
    return [
        ComponentSpec(
            name="qwen2_audio",
            target="omnicore_family_qwen2_audio.foundation:build",
            options_model="omnicore_family_qwen2_audio.processor:Qwen2AudioFoundationOptions",
            description=(
                "Qwen2-Audio as published (Qwen2AudioForConditionalGeneration folder): its Qwen2 LM, tokenizer and chat "
                "template, and its audio tower + projector as the audio encoder; exports the published layout"
            ),
            extra={"model_types": MODEL_TYPES},
        )
    ]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/qwen2_audio_encoder`` (audio)."""
    return [
        ComponentSpec(
            name="qwen2_audio_encoder",
            target="omnicore_family_qwen2_audio.encoder:build",
            options_model="omnicore_family_qwen2_audio.processor:Qwen2AudioEncoderOptions",
            processor="omnicore_family_qwen2_audio.processor:build_processor",
            modalities=("audio",),
            description=(
                "Qwen2-Audio's audio_tower (Whisper-style, avg-pooled) and multi_modal_projector from a published "
                "checkpoint, fed by the checkpoint's own WhisperFeatureExtractor"
            ),
        )
    ]
