"""Where each part of a CSM checkpoint lives, and which omnicore component reads it: one
:class:`~omnicore_family_kit.keymap.KeyMap` per part, read both ways (checkpoint -> module names
when loading, module -> ``CsmForConditionalGeneration``'s names for the export).

``CsmForConditionalGeneration.save_pretrained`` (transformers 5, as ``sesame/csm-1b`` is published)
writes ``embed_text_tokens.*``, ``backbone_model.*`` (its layers and norm; the audio embedding
``backbone_model.embed_tokens.embed_audio_tokens`` is tied to the depth decoder's and saved once, as
``depth_decoder.model.embed_tokens.weight``), ``lm_head.*`` (codebook 0), ``depth_decoder.*`` and
``codec_model.*`` (the Mimi codec in its flat published layout: ``encoder.layers.*``,
``encoder_transformer.*``, ``downsample.*``, ``quantizer.*``, ``upsample.*``,
``decoder_transformer.*``, ``decoder.layers.*``; in memory transformers 5's ``MimiModel`` holds them
under ``encoder.*`` and ``decoder.*``, see its conversion mapping). The class's in-memory names
load too.

* ``foundation/csm`` reads the text embedding and the backbone (:data:`LM`) through the core's
  strict plan (:func:`omnicore.api.plan_checkpoint`).
* ``decoder/csm_audio`` reads the rest (:data:`DECODER`) with :func:`decoder_key` (its Mimi
  codebooks are buffers, which a parameter plan does not fill, and decoders are not loaded shard
  by shard).
"""

from __future__ import annotations

from omnicore_family_kit.keymap import KeyMap

_CODEC = {
    "encoder.layers.": "encoder.encoder_seanet.layers.",
    "encoder_transformer.": "encoder.encoder_transformer.",
    "downsample.": "encoder.downsample.",
    "upsample.": "decoder.upsample.",
    "decoder_transformer.": "decoder.decoder_transformer.",
    "decoder.layers.": "decoder.decoder_seanet.layers.",
}
"""Mimi's published (flat) prefix -> ``MimiModel``'s own; ``quantizer.`` is the same in both."""
AUDIO_EMBED = "backbone_model.embed_tokens.embed_audio_tokens.weight"
DEPTH_EMBED = "depth_decoder.model.embed_tokens.weight"
"""The two names of CSM's one audio embedding (``K * C`` rows, tied); checkpoints hold the second."""

LM = KeyMap(
    parts={"model.embed_tokens.": "embed_text_tokens.", "model.": "backbone_model."},
    others=("lm_head.", "depth_decoder.", "codec_model.", "backbone_model.embed_tokens."),
)
"""The text LM (:class:`~omnicore_family_csm.model.CsmTextLM`: the text embedding and the backbone;
its fixed head holds no tensor)."""
DECODER = KeyMap(
    parts={
        "codec.": "codec_model.",
        "code_embed.": "backbone_model.embed_tokens.embed_audio_tokens.",
        "lm_head.": "lm_head.",
        "depth_decoder.": "depth_decoder.",
    },
    legacy={"codec_model." + flat: "codec_model." + own for flat, own in _CODEC.items()},
    others=("embed_text_tokens.", "backbone_model.layers.", "backbone_model.norm."),
)
"""The audio decoder (``decoder/csm_audio``): codec, audio embedding, codebook-0 head, depth decoder."""


def decoder_key(key: str) -> str | None:
    """The ``decoder/csm_audio`` state-dict name of checkpoint tensor ``key`` (:data:`DECODER` read
    backwards, the longest prefix first: ``codec.*`` for ``codec_model.*`` in either Mimi layout,
    ``code_embed.weight`` for :data:`AUDIO_EMBED`, ``lm_head.*`` and ``depth_decoder.*`` as they
    are); None for the foundation's parts."""
    renames = DECODER.renames()
    hits = [old for old in renames if key.startswith(old)]
    if hits:
        old = max(hits, key=len)
        return renames[old] + key[len(old) :]
    own = [ours for ours, theirs in DECODER.parts.items() if ours == theirs and key.startswith(ours)]
    return key if own else None
