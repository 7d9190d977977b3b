"""Where each part of a CSM checkpoint lives, and which omnicore component reads it.

``CsmForConditionalGeneration.save_pretrained`` (transformers 5, as ``sesame/csm-1b`` is published)
writes ``embed_text_tokens.*``, ``backbone_model.*`` (its layers and norm; the audio embedding
``backbone_model.embed_tokens.embed_audio_tokens`` is tied to the depth decoder's and saved once, as
``depth_decoder.model.embed_tokens.weight``), ``lm_head.*`` (codebook 0), ``depth_decoder.*`` and
``codec_model.*`` (the Mimi codec in its flat published layout: ``encoder.layers.*``,
``encoder_transformer.*``, ``downsample.*``, ``quantizer.*``, ``upsample.*``,
``decoder_transformer.*``, ``decoder.layers.*``; in memory transformers 5's ``MimiModel`` holds them
under ``encoder.*`` and ``decoder.*``, see its conversion mapping).

* ``foundation/csm`` reads the text embedding and the backbone through the core's strict plan
  (:func:`omnicore.api.plan_checkpoint` with :data:`LM_RENAMES` and :data:`LM_OTHER_PARTS`).
* ``decoder/csm_audio`` reads the rest with :func:`decoder_key` (its Mimi codebooks are buffers,
  which a parameter plan does not fill, and decoders are not loaded shard by shard).
"""

from __future__ import annotations

LM_RENAMES = {"embed_text_tokens.": "model.embed_tokens.", "backbone_model.": "model."}
"""Checkpoint prefix -> the text LM's (:class:`~omnicore_family_csm.model.CsmTextLM`) parameter prefix."""
LM_OTHER_PARTS = ("lm_head", "depth_decoder", "codec_model", "backbone_model.embed_tokens")
"""The checkpoint's parts the decoder reads (left unused by the foundation)."""
DECODER_OTHER_PARTS = ("embed_text_tokens", "backbone_model.layers", "backbone_model.norm")
"""The checkpoint's parts the foundation reads (left unused by the decoder)."""

CODEC_RENAMES = (
    ("encoder.layers.", "encoder.encoder_seanet.layers."),
    ("encoder_transformer.", "encoder.encoder_transformer."),
    ("downsample.", "encoder.downsample."),
    ("upsample.", "decoder.upsample."),
    ("decoder_transformer.", "decoder.decoder_transformer."),
    ("decoder.layers.", "decoder.decoder_seanet.layers."),
)
"""Mimi's published (flat) key prefix -> ``MimiModel``'s own, inside ``codec_model.``; a prefix not
listed (``quantizer.``, and keys already in the in-memory layout) is the same in both."""
AUDIO_EMBED = "backbone_model.embed_tokens.embed_audio_tokens.weight"
DEPTH_EMBED = "depth_decoder.model.embed_tokens.weight"
"""The two names of CSM's one audio embedding (``K * C`` rows, tied); checkpoints hold the second."""


def decoder_key(key: str) -> str | None:
    """The ``decoder/csm_audio`` state-dict name of checkpoint tensor ``key``: ``codec.*`` for
    ``codec_model.*`` (:data:`CODEC_RENAMES` applied), ``code_embed.weight`` for :data:`AUDIO_EMBED`,
    ``lm_head.*`` and ``depth_decoder.*`` as they are; None for the foundation's parts."""
    if key.startswith("codec_model."):
        rest = key[len("codec_model.") :]
        for published, own in CODEC_RENAMES:
            if rest.startswith(published):
                return "codec." + own + rest[len(published) :]
        return "codec." + rest
    if key == AUDIO_EMBED:
        return "code_embed.weight"
    if key.startswith(("lm_head.", "depth_decoder.")):
        return key
    return None


def published_key(name: str) -> str | None:
    """The inverse of :func:`decoder_key` for what a checkpoint holds: a decoder state-dict name
    -> its key in the published layout; None for ``code_embed.weight`` (saved as :data:`DEPTH_EMBED`)."""
    if name.startswith("codec."):
        rest = name[len("codec.") :]
        for published, own in CODEC_RENAMES:
            if rest.startswith(own):
                return "codec_model." + published + rest[len(own) :]
        return "codec_model." + rest
    return None if name == "code_embed.weight" else name
