"""Hook module of omnicore-family-csm (entry point ``csm`` in the group ``omnicore``).

Torch-free on purpose (``omnicore plugins`` imports every hook module): the specs name their
factories as strings, imported only when a component is built.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl

MODEL_TYPES = ("csm",)
"""The ``config.json`` ``model_type`` values this family reads (CSM): ``foundation/csm``
names them in ``extra["model_types"]``, so ``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/csm``."""
    return [
        ComponentSpec(
            name="csm",
            target="omnicore_family_csm.foundation:build",
            options_model="omnicore_family_csm.processor:CsmFoundationOptions",
            description=(
                "Sesame CSM as published (CsmForConditionalGeneration folder): its text embedding and backbone, "
                "tokenizer; with decoder/csm_audio exports the published layout"
            ),
            extra={"model_types": MODEL_TYPES},
        )
    ]


@hookimpl
def omnicore_decoders() -> list[ComponentSpec]:
    """Register ``decoder/csm_audio`` (audio)."""
    return [
        ComponentSpec(
            name="csm_audio",
            target="omnicore_family_csm.decoder:build",
            options_model="omnicore_family_csm.processor:CsmAudioOptions",
            processor="omnicore_family_csm.processor:build_processor",
            modalities=("audio",),
            description=(
                "CSM's audio half from a published checkpoint: Mimi codec, audio embedding, codebook-0 head and "
                "depth decoder (K codebooks per frame)"
            ),
        )
    ]
