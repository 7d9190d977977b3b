"""The language model ``foundation/csm`` gives omnicore: CSM's backbone with its text embedding, and a
fixed text head.

CSM's backbone (transformers' ``CsmBackboneModel``: Llama-style decoder layers) takes input
embeddings: ``embed_text_tokens`` rows at text positions, and at a frame's position the sum of its
``K`` codes' rows of the audio embedding (the decoder's ``code_embed``). Its hidden state before a
frame scores that frame's codebook 0 (``lm_head``, the decoder's head here). CSM has **no text
head**: it never predicts text. omnicore's foundation needs one, to score the text targets a chat
sample has (the ``<|end_of_text|>`` that opens the audio, the turn's end) and to choose the first
token in generation. :class:`FixedTextHead` is that head: not trained, not saved, not exported.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.csm.modeling_csm import CsmBackboneModel, CsmPreTrainedModel

OTHER_LOGIT = -30.0
"""The fixed head's logit of every token but ``<|end_of_text|>`` (whose logit is 0)."""


class FixedTextHead(nn.Module):
    """A text head that gives the same logits whatever the hidden state: 0 for the start token
    (``<|end_of_text|>``, after which CSM's audio starts) and :data:`OTHER_LOGIT` for every other
    token (``exp(-30)``: with CSM's 128256 text tokens, ``<|end_of_text|>`` has probability
    ``1 - 1.2e-8``, so greedy and sampled generation alike open the audio right after the text).

    ``weight`` (zeros ``[V, H]``) and ``bias`` (``[V]``) are non-persistent buffers: no gradient,
    no optimizer state, not in state dicts or exports. The text loss part is therefore a constant
    (about 0 per ``<|end_of_text|>`` target, 30 per ``<|begin_of_text|>`` one) that trains nothing.

    Args:
        hidden_size: ``H``; vocab_size: ``V``, the text vocabulary; start_id: the id of ``<|end_of_text|>``.
    """

    def __init__(self, hidden_size: int, vocab_size: int, start_id: int) -> None:
        super().__init__()
        if not 0 <= int(start_id) < int(vocab_size):
            raise ValueError(f"start token id {start_id} is outside the text vocabulary of {vocab_size}")
        self.start_id = int(start_id)
        self.register_buffer("weight", torch.zeros(int(vocab_size), int(hidden_size)), persistent=False)
        bias = torch.full((int(vocab_size),), OTHER_LOGIT)
        bias[self.start_id] = 0.0
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> ``[..., V]`` logits (the same row for every position)."""
        return nn.functional.linear(hidden, self.weight.to(hidden.dtype), self.bias.to(hidden.dtype))


class CsmTextBackbone(CsmBackboneModel):
    """``CsmBackboneModel`` whose ``embed_tokens`` is CSM's text embedding (``embed_text_tokens``,
    ``[rows, H]``): omnicore scatters the frames' audio embeddings into its output at the frame
    placeholders, as ``CsmForConditionalGeneration._merge_input_ids_with_input_values`` does."""

    def __init__(self, config: Any, rows: int) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(int(rows), config.hidden_size)


class CsmTextLM(CsmPreTrainedModel):
    """The causal LM of ``foundation/csm``: :class:`CsmTextBackbone` under :class:`FixedTextHead`.

    Args:
        config: the checkpoint's ``CsmConfig`` (its ``tie_word_embeddings`` is set false here:
            nothing of this model is tied).
        rows: text embedding rows (the tokenizer's vocabulary with omnicore's tokens, at least the
            checkpoint's ``text_vocab_size``).
        start_id: the id of ``<|end_of_text|>`` (:class:`FixedTextHead`).

    Attributes:
        model: the backbone (``base_model``); lm_head: the fixed text head.
    """

    base_model_prefix = "model"
    _tied_weights_keys = None

    def __init__(self, config: Any, rows: int, start_id: int) -> None:
        config.tie_word_embeddings = False
        super().__init__(config)
        self.model = CsmTextBackbone(config, rows)
        self.lm_head = FixedTextHead(config.hidden_size, rows, start_id)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The text embedding (``embed_text_tokens``)."""
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        """The fixed text head."""
        return self.lm_head

    def get_decoder(self) -> nn.Module:
        return self.model

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Text ids ``[B, T]`` (or ``inputs_embeds`` ``[B, T, H]``) -> the fixed head's logits ``[B, T, V]``."""
        if inputs_embeds is None:
            inputs_embeds = self.model.embed_tokens(input_ids)
        out = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return CausalLMOutputWithPast(logits=self.lm_head(out.last_hidden_state), cache=getattr(out, "cache", None))
