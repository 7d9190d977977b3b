"""``foundation/csm``: a published CSM checkpoint's text embedding and backbone as omnicore's LM.

The LM is :class:`~omnicore_family_csm.model.CsmTextLM` (CSM's ``CsmBackboneModel`` with
``embed_text_tokens`` as its input embedding, under a fixed text head), read from the checkpoint's
``embed_text_tokens.*`` and ``backbone_model.*`` tensors through the core's strict plan. The
tokenizer is the checkpoint's, with omnicore's rendering of CSM's segments as its chat template
(:data:`CHAT_TEMPLATE`). The rest of the checkpoint (audio embedding, codebook-0 head, depth
decoder, Mimi codec) is ``decoder/csm_audio``, configured beside it;
:meth:`CsmFoundation.export_pretrained` writes both back in the published layout, which
``CsmForConditionalGeneration.from_pretrained`` loads.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from omnicore_family_csm.loading import LM
from omnicore_family_csm.plugin import MODEL_TYPES
from omnicore_family_csm.processor import PLACEHOLDER, START, WHAT_TO_PUT, CsmFoundationOptions
from omnicore_family_kit.foundation import WHAT, FamilyFoundation

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set after = loop.first or messages[loop.index0 - 1]['role'] == 'assistant' -%}"
    "{%- if message['role'] == 'user' and after -%}"
    "{%- if loop.first -%}{{ bos_token }}{%- endif -%}{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' and not after -%}"
    "{{ message['content'] }}{{ bos_token }}"
    "{%- else -%}"
    "{{ raise_exception('CSM samples alternate user messages (a speaker\\'s text, e.g. [0]Hello) and assistant messages "
    "(that speaker\\'s audio), starting with a user message; no system message') }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
"""How omnicore renders a CSM sample (``data.chat_template: auto``; the checkpoint's own template,
whose roles are speaker ids, is restored on export). A user message is a speaker's text, written
as ``CsmProcessor`` takes it (``[0]Hello``); the assistant message after it is that speaker's audio.
The first segment opens with ``<|begin_of_text|>``, each audio reply is followed by the next
segment's ``<|begin_of_text|>`` (the end of the assistant turn); the decoder writes
``<|end_of_text|>`` and the frame placeholders itself. So ``[0]Hello`` + audio is
``<|begin_of_text|>[0]Hello<|end_of_text|><|AUDIO|> x (F + 1)<|begin_of_text|>``: CSM's ids up to
the last frame (README.md)."""


class CsmFoundation(FamilyFoundation):
    """The :class:`omnicore.api.Foundation` of a CSM checkpoint (reads no weights until
    :meth:`build_model`'s plan is filled). It brings no encoder: the audio side is
    ``decoder/csm_audio``, configured beside it.

    Args:
        options: :class:`~omnicore_family_csm.processor.CsmFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a CSM one (naming the field).
    """

    family = "csm"
    model_types = MODEL_TYPES
    what_to_put = WHAT_TO_PUT
    options_model = CsmFoundationOptions
    lm_keys = LM
    part_prefixes = {
        "embed_text_tokens": ["lm.model.embed_tokens."],
        "backbone_model": ["lm.model.layers.", "lm.model.norm.", "decoders.audio.code_embed."],
        "lm_head": ["decoders.audio.lm_head."],
        "depth_decoder": ["decoders.audio.depth_decoder."],
        "codec_model": ["decoders.audio.codec."],
    }
    """CSM's module names: ``backbone_model`` holds the audio embedding too (the depth decoder's as
    well); ``codec_model`` is frozen; the audio decoder sits under the key ``audio``."""

    def build_tokenizer(self) -> Any:
        """The checkpoint's tokenizer with :data:`CHAT_TEMPLATE` as its chat template; a tokenizer
        without a pad token gets ``<|end_of_text|>`` (omnicore never pads with it, and the
        vocabulary stays as published).

        Raises:
            ValueError: the tokenizer lacks ``<|end_of_text|>``, ``<|begin_of_text|>`` or ``<|AUDIO|>``.
        """
        tok = self.source_tokenizer()
        vocab = tok.get_vocab()
        lacking = [t for t in (START, PLACEHOLDER) if t not in vocab] + ([] if tok.bos_token else ["a bos token"])
        if lacking:
            raise ValueError(f"{WHAT}: the tokenizer of {self.folder} lacks {lacking}, which CSM's segments are written with")
        if tok.pad_token is None:
            tok.pad_token = START
        tok.chat_template = CHAT_TEMPLATE
        return tok

    def build_lm(self, config: Any, vocab_size: int, dtype: Any) -> Any:
        """:class:`~omnicore_family_csm.model.CsmTextLM` on the meta device: ``max(text_vocab_size,
        vocab_size)`` rows, parameters in ``dtype`` (default float32; rotary tables stay float32),
        nothing tied."""
        import torch

        from omnicore.api import on_meta
        from omnicore_family_csm.model import CsmTextLM

        rows = max(int(config.text_vocab_size), int(vocab_size))
        start_id = int(self.source_tokenizer().convert_tokens_to_ids(START))
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype or torch.float32)
        try:
            with on_meta():
                return CsmTextLM(config, rows, start_id)
        finally:
            torch.set_default_dtype(old)

    def grow(self, model: Any) -> tuple[str, ...]:
        """The text embedding alone (the fixed text head holds no tensor)."""
        return ("model.embed_tokens.weight",)

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors of the LM and the audio
        decoder under ``CsmForConditionalGeneration``'s names (:data:`~omnicore_family_csm.loading.LM`,
        :data:`~omnicore_family_csm.loading.DECODER`), written by its own ``save_pretrained``
        (``config.json`` with the trained ``text_vocab_size``, the safetensors under transformers'
        own names), ``CsmProcessor``'s files with the tokenizer under the checkpoint's own chat
        template and special tokens (:meth:`export_processor`), and the checkpoint's
        ``generation_config.json`` (:meth:`~omnicore_family_kit.foundation.FamilyFoundation.write_export`).

        Raises:
            ValueError: not exactly one ``decoder/csm_audio``; RuntimeError: the tensors do not fill the class.
        """
        from transformers import CsmForConditionalGeneration

        from omnicore_family_csm.decoder import CsmAudioDecoder
        from omnicore_family_csm.loading import DECODER

        dec = self.one_module(model.decoders, CsmAudioDecoder, "decoder/csm_audio")
        config = self.config()
        config.text_vocab_size = int(model.lm.get_input_embeddings().weight.shape[0])
        parts = [(model.lm, LM), (dec, DECODER)]
        processor = self.export_processor(tokenizer)
        self.write_export(folder, model, CsmForConditionalGeneration, config, parts, tokenizer=None, processor=processor)

    def export_processor(self, tokenizer: Any) -> Any:
        """``CsmProcessor(feature extractor, tokenizer, chat template)`` of the checkpoint: the
        trained vocabulary, the checkpoint's own special tokens and chat template."""
        from transformers import AutoProcessor, CsmProcessor, EncodecFeatureExtractor

        source = self.source_tokenizer()
        tok = copy.deepcopy(tokenizer)
        tok.chat_template = source.chat_template
        for attr in ("bos_token", "eos_token", "pad_token"):
            setattr(tok, attr, getattr(source, attr))
        try:
            published = AutoProcessor.from_pretrained(str(self.folder))
            fe, template = published.feature_extractor, published.chat_template
        except (OSError, ValueError):  # a checkpoint without processor files: the codec's rate, the tokenizer's template
            rate = int(self.config().codec_config.sampling_rate)
            fe, template = EncodecFeatureExtractor(feature_size=1, sampling_rate=rate, padding_value=0.0), source.chat_template
        return CsmProcessor(feature_extractor=fe, tokenizer=tok, chat_template=template)


def build(options: dict[str, Any]) -> CsmFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/csm``)."""
    return CsmFoundation(options)
