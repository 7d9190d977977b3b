"""The text decoder of a composite class under its LM head, built alone.

Where transformers has a causal-LM class for the text config whose decoder is the composite's
decoder class (``LlamaForCausalLM`` for LLaVA-1.5's Llama, ``Gemma3ForCausalLM`` for Gemma 3's
text config), that class is used as it is, so every kernel and strategy that serves
``hf_causal_lm`` serves it too. Otherwise the decoder class is put under a linear head
(:func:`decoder_lm_class`), with the names ``model.*`` and ``lm_head.*`` all the same.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from torch import nn


@functools.cache
def decoder_lm_class(decoder_cls: type) -> type:
    """A causal-LM class whose ``model`` is ``decoder_cls`` and whose head is ``lm_head``
    (``[B, T] -> [B, T, V]`` logits; no loss: omnicore computes it)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    base = next(c for c in decoder_cls.__mro__[1:] if "PreTrainedModel" in c.__name__)

    class DecoderCausalLM(base):  # type: ignore[misc, valid-type]
        """The decoder (``model``) under a linear LM head (``lm_head``)."""

        base_model_prefix = "model"
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

        def __init__(self, config: Any):
            super().__init__(config)
            self.model = decoder_cls(config)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        def get_output_embeddings(self) -> nn.Module:
            return self.lm_head

        def set_output_embeddings(self, new: nn.Module) -> None:
            self.lm_head = new

        def forward(self, input_ids: Any = None, position_ids: Any = None, inputs_embeds: Any = None, **kwargs: Any) -> Any:
            out = self.model(input_ids=input_ids, position_ids=position_ids, inputs_embeds=inputs_embeds, **kwargs)
            return CausalLMOutputWithPast(logits=self.lm_head(out.last_hidden_state), past_key_values=getattr(out, "past_key_values", None))

    DecoderCausalLM.__name__ = DecoderCausalLM.__qualname__ = decoder_cls.__name__.replace("Model", "") + "ForCausalLM"
    return DecoderCausalLM


def text_config_of(config: Any, vocab_size: int) -> Any:
    """A copy of the composite's text config with at least ``vocab_size`` rows and the composite's
    ``tie_word_embeddings``."""
    text = copy.deepcopy(config.get_text_config())
    text.vocab_size = max(int(text.vocab_size), int(vocab_size))
    tie = getattr(config, "tie_word_embeddings", None)
    if tie is not None and text is not config:
        text.tie_word_embeddings = bool(tie)
    return text


def build_text_lm(config: Any, decoder: Any, vocab_size: int, dtype: Any = None) -> Any:
    """The causal LM over the composite's text decoder, on the meta device (buffers real).

    Args:
        config: the composite config.
        decoder: the composite's decoder instance (its class picks the LM class).
        vocab_size: the least number of embedding rows.
        dtype: parameters' dtype (default float32).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from omnicore.api import on_meta

    text = text_config_of(config, vocab_size)
    mapping = AutoModelForCausalLM._model_mapping
    cls = mapping[type(text)] if type(text) in mapping else None
    with on_meta():
        if cls is not None:
            model = cls._from_config(text, dtype=dtype or torch.float32)
            if type(model.model) is type(decoder):
                return model.train()
        lm_cls = decoder_lm_class(type(decoder))
        lm_cls.config_class = type(text)
        model = lm_cls._from_config(text, dtype=dtype or torch.float32)
    return model.train()
