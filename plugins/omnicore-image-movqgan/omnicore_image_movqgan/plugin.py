"""Hook module of omnicore-image-movqgan (entry point ``movqgan`` in group ``omnicore``).

Torch-free by contract: ``omnicore plugins`` imports this module, so it only names the target and
the options model as strings; :mod:`omnicore_image_movqgan.decoder` (torch, diffusers) is imported
when the registry builds the component, :mod:`omnicore_image_movqgan.processor` (no model code) when
it builds its data side.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_decoders() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="movqgan",
            target="omnicore_image_movqgan.decoder:build",
            options_model="omnicore_image_movqgan.processor:MoVQGANOptions",
            processor="omnicore_image_movqgan.processor:build_processor",
            modalities=("image",),
            description="MoVQGAN image tokenizer/decoder (diffusers VQModel, norm_type='spatial'); codes -> RGB image",
        )
    ]
