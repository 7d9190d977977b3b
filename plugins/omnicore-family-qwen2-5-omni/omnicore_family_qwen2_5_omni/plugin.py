"""Hook module of omnicore-family-qwen2-5-omni (entry point ``qwen2_5_omni`` in the group ``omnicore``).

Torch-free on purpose (``omnicore plugins`` imports every hook module): the specs name their
factories as strings, imported only when a component is built.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl

MODEL_TYPES = ("qwen2_5_omni", "qwen2_5_omni_thinker")
"""The ``config.json`` ``model_type`` values this family reads (Qwen2.5-Omni: the whole model or its
thinker): ``foundation/qwen2_5_omni`` names them in ``extra["model_types"]``, so
``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/qwen2_5_omni`` (whole-model and thinker-only checkpoints alike)."""
    return [
        ComponentSpec(
            name="qwen2_5_omni",
            target="omnicore_family_qwen2_5_omni.foundation:build",
            options_model="omnicore_family_qwen2_5_omni.processor:Qwen2_5OmniFoundationOptions",
            description=(
                "Qwen2.5-Omni as published (a Qwen2_5OmniForConditionalGeneration or thinker folder): the thinker's mRoPE LM, "
                "tokenizer and chat template, its audio and vision towers as encoders (clips with their sound track "
                "time-aligned); exports the whole model with the talker and token2wav unchanged"
            ),
            extra={"model_types": MODEL_TYPES},
        )
    ]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/qwen2_5_omni_vision`` (image and video: one tower serves both) and
    ``encoder/qwen2_5_omni_audio``."""
    return [
        ComponentSpec(
            name="qwen2_5_omni_vision",
            target="omnicore_family_qwen2_5_omni.encoder:build_vision",
            options_model="omnicore_family_qwen2_5_omni.processor:Qwen2_5OmniVisionOptions",
            processor="omnicore_family_qwen2_5_omni.processor:build_vision_processor",
            modalities=("image", "video"),
            description=(
                "Qwen2.5-Omni thinker's vision tower with its merger (output at the LM's width) from a published checkpoint, fed "
                "by its image and video processors; a clip's sound track interleaved with its frames (use_audio_in_video)"
            ),
        ),
        ComponentSpec(
            name="qwen2_5_omni_audio",
            target="omnicore_family_qwen2_5_omni.encoder:build_audio",
            options_model="omnicore_family_qwen2_5_omni.processor:Qwen2_5OmniAudioOptions",
            processor="omnicore_family_qwen2_5_omni.processor:build_audio_processor",
            modalities=("audio",),
            description=(
                "Qwen2.5-Omni thinker's audio tower (Whisper-style, chunked attention, pooled and projected to the LM's width) "
                "from a published checkpoint, fed by its own WhisperFeatureExtractor"
            ),
        ),
    ]
