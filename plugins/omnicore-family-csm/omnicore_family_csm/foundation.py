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
import shutil
from pathlib import Path
from typing import Any

from omnicore.api import on_meta, plan_checkpoint
from omnicore_family_csm.loading import LM
from omnicore_family_csm.processor import PLACEHOLDER, START, CsmFoundationOptions, checkpoint_folder, read_config

WHAT = "model.foundation.options.checkpoint"

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


class CsmFoundation:
    """The :class:`omnicore.api.Foundation` of a CSM checkpoint (reads no weights until
    :meth:`build_model`'s plan is filled).

    Args:
        options: :class:`~omnicore_family_csm.processor.CsmFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a CSM one (naming the field).
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = CsmFoundationOptions.model_validate(dict(options or {}))
        self.folder = checkpoint_folder(self.options.checkpoint, WHAT)

    def config(self) -> Any:
        """The checkpoint's ``CsmConfig``."""
        return read_config(self.folder)

    def source_tokenizer(self) -> Any:
        """The checkpoint's tokenizer as published (``AutoTokenizer.from_pretrained``)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.folder))

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

    def build_model(self, vocab_size: int, dtype: Any = None) -> Any:
        """:class:`~omnicore_family_csm.model.CsmTextLM` on the meta device with the plan that reads
        the checkpoint's ``embed_text_tokens.*`` and ``backbone_model.*`` after sharding.

        Args:
            vocab_size: input embeddings needed; the model has ``max(text_vocab_size, vocab_size)``
                rows (rows beyond the checkpoint's get the mean of its rows).
            dtype: floating-point dtype of the parameters (default float32; rotary tables stay float32).

        Raises:
            LoadError: (``ValueError``) the checkpoint's tensors do not fit.
        """
        import torch

        from omnicore_family_csm.model import CsmTextLM

        config = self.config()
        rows = max(int(config.text_vocab_size), int(vocab_size))
        start_id = int(self.source_tokenizer().convert_tokens_to_ids(START))
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype or torch.float32)
        try:
            with on_meta():
                model = CsmTextLM(config, rows, start_id)
        finally:
            torch.set_default_dtype(old)
        model.omnicore_pending_load = plan_checkpoint(
            model, self.folder, renames=LM.renames(), other_parts=LM.other_parts(), what=WHAT, grow=("model.embed_tokens.weight",)
        )
        return model

    def part_names(self) -> dict[str, list[str]]:
        """CSM's module names for ``train.freeze`` / ``train.lr_multipliers``: ``embed_text_tokens``,
        ``backbone_model`` (its layers and norm, and the audio embedding, which is the depth
        decoder's too), ``lm_head``, ``depth_decoder`` and ``codec_model`` (frozen), with the audio
        decoder under the key ``audio``."""
        return {
            "embed_text_tokens": ["lm.model.embed_tokens."],
            "backbone_model": ["lm.model.layers.", "lm.model.norm.", "decoders.audio.code_embed."],
            "lm_head": ["decoders.audio.lm_head."],
            "depth_decoder": ["decoders.audio.depth_decoder."],
            "codec_model": ["decoders.audio.codec."],
        }

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors of the LM and the audio
        decoder under ``CsmForConditionalGeneration``'s names (:data:`~omnicore_family_csm.loading.LM`,
        :data:`~omnicore_family_csm.loading.DECODER`), written by its own ``save_pretrained``
        (:func:`omnicore_family_kit.export.save_through_class`: ``config.json`` with the trained
        ``text_vocab_size``, the safetensors under transformers' own names), the tokenizer with the
        checkpoint's own chat template and special tokens, ``CsmProcessor``'s files, and the
        checkpoint's ``generation_config.json``.

        Args:
            model: an unsharded CPU OmniModel (LoRA merged) with one ``decoder/csm_audio``.

        Raises:
            ValueError: the model has no CSM audio decoder, or more than one; RuntimeError: the
                tensors do not fill the class (strict, both ways).
        """
        from transformers import CsmForConditionalGeneration

        from omnicore_family_csm.decoder import CsmAudioDecoder
        from omnicore_family_csm.loading import DECODER
        from omnicore_family_kit.export import class_state, save_through_class

        decoders = [d for d in model.decoders.values() if isinstance(d, CsmAudioDecoder)]
        if len(decoders) != 1:
            raise ValueError(f"csm export: the model needs exactly one decoder/csm_audio (model.decoders.audio), found {len(decoders)}")
        dec, lm = decoders[0], model.lm
        folder = Path(folder)
        config = self.config()
        config.text_vocab_size = int(lm.get_input_embeddings().weight.shape[0])
        state = class_state([(lm, LM), (dec, DECODER)])
        save_through_class(CsmForConditionalGeneration, config, state, folder, dtype=lm.get_input_embeddings().weight.dtype)
        self._write_processor(tokenizer, folder)
        source = self.folder / "generation_config.json"
        if source.is_file() and self.folder.resolve() != folder.resolve():
            shutil.copyfile(source, folder / "generation_config.json")

    def _write_processor(self, tokenizer: Any, folder: Path) -> None:
        """``CsmProcessor(feature extractor, tokenizer, chat template)`` of the checkpoint into
        ``folder``: the trained vocabulary, the checkpoint's own special tokens and chat template."""
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
        CsmProcessor(feature_extractor=fe, tokenizer=tok, chat_template=template).save_pretrained(folder)


def build(options: dict[str, Any]) -> CsmFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/csm``)."""
    return CsmFoundation(options)
