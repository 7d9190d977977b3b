"""Hook module of omnicore-audio-mel (entry point ``mel_rvq`` in group ``omnicore``).

Torch-free by contract: ``omnicore plugins`` imports this module, so it only names the target and
the options model as strings; :mod:`omnicore_audio_mel.decoder` is imported when the registry builds
the component, :mod:`omnicore_audio_mel.processor` (no model code) when it builds its data side.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_decoders() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="mel_rvq",
            target="omnicore_audio_mel.decoder:build",
            options_model="omnicore_audio_mel.processor:MelOptions",
            processor="omnicore_audio_mel.processor:build_processor",
            modalities=("audio",),
            description="MelRVQ speech tokenizer/decoder (log-mel frames, residual k-means codebooks, one LM position per frame "
            "with a depth decoder); codes -> Griffin-Lim -> 16 kHz audio",
        )
    ]
