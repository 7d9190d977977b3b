"""Hook module of omnicore-family-kit (entry point ``family_kit`` in the group ``omnicore``).

Torch-free on purpose (``omnicore plugins`` imports every hook module): the specs name their
factories as strings, imported only when a component is built.

It registers the generic family: ``foundation/generic`` serves any model type no family plugin
names (``extra["model_types"] == ("*",)``), which is what ``model.foundation: {name: auto}`` picks
for such a checkpoint; ``encoder/generic_encoder`` is the towers of such a checkpoint.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/generic``."""
    return [
        ComponentSpec(
            name="generic",
            target="omnicore_family_kit.generic.foundation:build",
            options_model="omnicore_family_kit.generic.options:AutoFoundationOptions",
            description=(
                "any transformers multimodal checkpoint through its own processor, get_*_features and save_pretrained "
                "(the generic family; name: auto picks it where no family plugin serves the model type)"
            ),
            extra={"model_types": ("*",)},
        )
    ]


@hookimpl
def omnicore_encoders() -> list[ComponentSpec]:
    """Register ``encoder/generic_encoder`` (image, video and audio: one module per checkpoint)."""
    return [
        ComponentSpec(
            name="generic_encoder",
            target="omnicore_family_kit.generic.encoder:build",
            options_model="omnicore_family_kit.generic.options:AutoEncoderOptions",
            processor="omnicore_family_kit.generic.processor:build_processor",
            modalities=("image", "video", "audio"),
            description="a checkpoint's towers and projector through its class's get_*_features, fed by its own processor",
        )
    ]
