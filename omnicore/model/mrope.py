"""Language models with multi-dimensional rotary positions (mRoPE), without their vision towers.

transformers builds Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen2.5-Omni's thinker only whole (vision tower,
audio tower, language model, LM head; they are not ``AutoModelForCausalLM`` types). In omnicore the
towers are encoder plugins, so the foundation is the library's own *text* model class
(``Qwen2VLTextModel``, ``Qwen2_5_VLTextModel``, ``Qwen3VLTextModel``, ``Qwen2_5OmniThinkerTextModel``:
the decoder layers and the mRoPE rotary embedding; Qwen3-VL's interleaves the three axes' frequencies
and takes DeepStack rows as ``visual_pos_masks`` / ``deepstack_visual_embeds``) under an LM head, built by :func:`build_mrope_lm`: no vision or
audio tower is ever built. The text model takes ``position_ids`` ``[4, B, T]``: the plain 1-D
positions (which keep packed samples apart), then the time, height and width rows
(:mod:`omnicore.data.positions` computes them per sample).

Parameter names are ``model.embed_tokens.weight``, ``model.layers.N...``, ``model.norm.weight``
and ``lm_head.weight``: those of the published Qwen2-VL / Qwen2.5-VL checkpoints' language model
(whose vision tower, ``visual.*``, the strict key plan reports as unused unless listed in
``ignore_unused``). ``save_pretrained`` writes the text config (``model_type`` ``qwen2_vl_text`` and
so on), which :class:`omnicore.model.foundation.HFCausalLM` builds again from a checkpoint folder.
"""

from __future__ import annotations

import copy
import functools
import importlib
from typing import Any

from torch import nn

TEXT_MODELS: dict[str, tuple[str, str]] = {
    "qwen2_vl": ("qwen2_vl", "Qwen2VLTextModel"),
    "qwen2_vl_text": ("qwen2_vl", "Qwen2VLTextModel"),
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLTextModel"),
    "qwen2_5_vl_text": ("qwen2_5_vl", "Qwen2_5_VLTextModel"),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLTextModel"),
    "qwen3_vl_text": ("qwen3_vl", "Qwen3VLTextModel"),
    "qwen2_5_omni_thinker": ("qwen2_5_omni", "Qwen2_5OmniThinkerTextModel"),
    "qwen2_5_omni_text": ("qwen2_5_omni", "Qwen2_5OmniThinkerTextModel"),
}
"""model type (whole or text config) -> (transformers models module, its text model class)."""


def is_mrope_type(config: Any) -> bool:
    """Whether ``config`` (a transformers config) is one of :data:`TEXT_MODELS`' model types."""
    return getattr(config, "model_type", None) in TEXT_MODELS


def mrope_text_config(config: Any, vocab_size: int | None = None) -> Any:
    """A copy of ``config``'s text config, checked, with ``vocab_size`` at least the given one and
    ``tie_word_embeddings`` taken from the whole config.

    Raises:
        ValueError: the rope parameters' ``mrope_section`` (default ``[16, 24, 24]``, for head
            dim 128) does not sum to half the head dim; the message gives a section that fits.
    """
    text = copy.deepcopy(config.get_text_config())
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    params = dict(getattr(text, "rope_parameters", None) or {})
    section = list(params.get("mrope_section") or [16, 24, 24])
    if len(section) != 3 or sum(section) != head_dim // 2:
        third = head_dim // 2 // 4
        fits = [head_dim // 2 - 3 * third, (3 * third + 1) // 2, 3 * third // 2]
        raise ValueError(
            f"rope_parameters.mrope_section {section} must be 3 ints summing to head_dim / 2 = {head_dim // 2} "
            f"(hidden_size {text.hidden_size} / num_attention_heads {text.num_attention_heads}); e.g. set it to {fits}"
        )
    if vocab_size is not None:
        text.vocab_size = max(int(text.vocab_size), int(vocab_size))
    text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    return text


@functools.cache
def _lm_class(model_type: str) -> type:
    """The causal LM class over ``model_type``'s text model (one class per text model class)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    module, name = TEXT_MODELS[model_type]
    text_cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    base = next(c for c in text_cls.__mro__[1:] if "PreTrainedModel" in c.__name__)

    class MRopeCausalLM(base):  # type: ignore[misc, valid-type]
        """``text_cls`` (``model``) under an LM head (``lm_head``)."""

        base_model_prefix = "model"
        _no_split_modules = [n for n in base._no_split_modules if "Vision" not in n]
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

        def __init__(self, config: Any):
            super().__init__(config)
            self.model = text_cls(config)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.post_init()

        def get_output_embeddings(self) -> nn.Module:
            return self.lm_head

        def set_output_embeddings(self, new: nn.Module) -> None:
            self.lm_head = new

        def forward(self, input_ids: Any = None, position_ids: Any = None, inputs_embeds: Any = None, **kwargs: Any) -> Any:
            """Logits ``[B, T, V]`` (no loss: omnicore computes it); ``position_ids`` ``[B, T]``,
            ``[3, B, T]`` or ``[4, B, T]`` as the text model takes them."""
            out = self.model(input_ids=input_ids, position_ids=position_ids, inputs_embeds=inputs_embeds, **kwargs)
            return CausalLMOutputWithPast(logits=self.lm_head(out.last_hidden_state), past_key_values=getattr(out, "cache", None))

    MRopeCausalLM.__name__ = MRopeCausalLM.__qualname__ = name.replace("TextModel", "TextForCausalLM")
    return MRopeCausalLM


def build_mrope_lm(config: Any, vocab_size: int | None = None, dtype: Any = None) -> Any:
    """The text model and LM head of an mRoPE model type (:data:`TEXT_MODELS`), randomly initialised
    by transformers, parameters in ``dtype``.

    Args:
        config: the whole config (``qwen2_vl``) or its text config (``qwen2_vl_text``).
        vocab_size: the least vocabulary size (omnicore's tokenizer with its special tokens).

    Raises:
        ValueError: see :func:`mrope_text_config`.
    """
    import torch

    text = mrope_text_config(config, vocab_size)
    cls = _lm_class(config.model_type)
    cls.config_class = type(text)
    with _default_dtype(dtype or torch.float32):
        model = cls(text)
    return model.train()


class _default_dtype:
    """``torch.set_default_dtype`` for a block (the class builds its parameters in it)."""

    def __init__(self, dtype: Any):
        self.dtype = dtype

    def __enter__(self) -> None:
        import torch

        self.before = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.set_default_dtype(self.before)
