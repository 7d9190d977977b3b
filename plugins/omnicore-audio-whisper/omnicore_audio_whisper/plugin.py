"""Hook module of omnicore-audio-whisper (entry point ``whisper`` in the group ``omnicore``).

Torch-free on purpose: ``omnicore plugins`` imports every hook module. The spec names its factory
and options model as strings; :mod:`omnicore_audio_whisper.encoder` (torch, transformers) is
imported only when the encoder is built, :mod:`omnicore_audio_whisper.processor` (no model code)
when its data side is built (in data workers).
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/whisper`` (audio)."""
    return [
        ComponentSpec(
            name="whisper",
            target="omnicore_audio_whisper.encoder:build",
            options_model="omnicore_audio_whisper.processor:WhisperEncoderOptions",
            processor="omnicore_audio_whisper.processor:build_processor",
            modalities=("audio",),
            description=(
                "Whisper audio encoder (transformers' WhisperEncoder), log-mel at 16 kHz, average-pooled "
                "and projected to the hidden size; from a tiny config or a local checkpoint"
            ),
        )
    ]
