"""Hook module of omnicore-audio-codec (entry point ``encodec`` in group ``omnicore``).

Torch-free by contract: ``omnicore plugins`` imports this module, so it only names the target and
the options model as strings; :mod:`omnicore_audio_codec.decoder` (torch, transformers) is imported
when the registry builds the component, :mod:`omnicore_audio_codec.processor` (no model code) when
it builds its data side.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_decoders() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="encodec",
            target="omnicore_audio_codec.decoder:build",
            options_model="omnicore_audio_codec.processor:EncodecOptions",
            processor="omnicore_audio_codec.processor:build_processor",
            modalities=("audio",),
            description="EnCodec speech tokenizer/decoder (transformers EncodecModel, RVQ codes flattened frame by frame); codes -> 16 kHz audio",
        )
    ]
