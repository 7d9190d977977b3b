"""Hook module of omnicore-image-siglip (entry point ``siglip`` in the group ``omnicore``).

Torch-free on purpose: ``omnicore plugins`` imports every hook module. The component's heavy code
(torch, transformers) is imported only when the encoder is built, through the spec's ``target``; its
data side (:mod:`omnicore_image_siglip.processor`, no model code) through the spec's ``processor``.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="siglip",
            target="omnicore_image_siglip.encoder:build",
            options_model="omnicore_image_siglip.processor:SiglipEncoderOptions",
            processor="omnicore_image_siglip.processor:build_processor",
            modalities=("image",),
            description="SigLIP vision tower (all patch tokens) + LLaVA-style 2-layer GELU MLP projector to H",
        )
    ]
