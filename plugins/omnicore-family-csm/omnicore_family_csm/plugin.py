"""Hook module of omnicore-family-csm (entry point ``csm`` in the group ``omnicore``): torch-free,
the specs name their factories as strings (:mod:`omnicore_family_kit.specs`)."""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl
from omnicore_family_kit.specs import foundation_spec, part_spec

MODEL_TYPES = ("csm",)
"""The ``config.json`` ``model_type`` values this family reads (CSM): ``foundation/csm``
names them in ``extra["model_types"]``, so ``model.foundation: {name: auto}`` picks it for them."""


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    """Register ``foundation/csm``."""
    description = (
        "Sesame CSM as published (CsmForConditionalGeneration folder): its text embedding and backbone, "
        "tokenizer; with decoder/csm_audio exports the published layout"
    )
    return [foundation_spec(__package__, "csm", "CsmFoundationOptions", MODEL_TYPES, description)]


@hookimpl
def omnicore_decoders() -> list[ComponentSpec]:
    """Register ``decoder/csm_audio`` (audio)."""
    description = (
        "CSM's audio half from a published checkpoint: Mimi codec, audio embedding, codebook-0 head and "
        "depth decoder (K codebooks per frame)"
    )
    return [part_spec(__package__, "csm_audio", "CsmAudioOptions", ("audio",), description, target="decoder:build")]
