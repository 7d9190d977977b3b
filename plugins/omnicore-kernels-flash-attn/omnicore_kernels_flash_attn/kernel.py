"""Varlen FlashAttention for packed sequences, installed through transformers' attention registry.

Packed micro-batches carry several samples in one row; their ``position_ids`` restart at 0 at each
sample start. omnicore builds the cumulative sequence lengths (``cu_seqlens``) that
``flash_attn_varlen_func`` wants once, at collate, and passes them to the attention function as
transformers' ``cu_seq_lens_q``/``max_length_q`` keyword arguments; :func:`omnicore.api.varlen_from_kwargs`
reads them (or derives them from ``position_ids`` when a caller passed none). Samples never attend
to each other and no ``[T, T]`` mask is ever built. ``flash_attn`` is imported lazily (only when the kernel is activated or called): this
module imports on machines without it.
"""

from __future__ import annotations

from typing import Any

from omnicore.api import cu_seqlens_from_position_ids, mark_varlen, varlen_from_kwargs

__all__ = ["IMPLEMENTATION", "FlashAttnVarlen", "cu_seqlens_from_position_ids", "register", "varlen_attention_forward"]

IMPLEMENTATION = "omnicore_fa_varlen"
"""The name registered in transformers' ``AttentionInterface`` and ``AttentionMaskInterface``."""


def varlen_attention_forward(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None, dropout: float = 0.0, **kwargs: Any
) -> tuple[Any, None]:
    """transformers attention function: ``query`` ``[B, Hq, T, D]``, ``key``/``value`` ``[B, Hkv, T, D]``;
    returns ``([B, T, Hq, D], None)``. Samples from ``kwargs["cu_seq_lens_q"]`` (passed by OmniModel),
    else ``kwargs["position_ids"]``, else one sample per row."""
    import torch
    from flash_attn import flash_attn_varlen_func

    b, hq, t, d = query.shape
    default = None if kwargs.get("position_ids") is not None else torch.arange(t, device=query.device).expand(b, t)
    cu, max_len = varlen_from_kwargs(kwargs, default)
    cu = cu.to(query.device)
    q = query.transpose(1, 2).reshape(b * t, hq, d)
    k = key.transpose(1, 2).reshape(b * t, key.shape[1], d)
    v = value.transpose(1, 2).reshape(b * t, value.shape[1], d)
    out = flash_attn_varlen_func(
        q,
        k,
        v,
        cu,
        cu,
        max_len,
        max_len,
        dropout_p=dropout if getattr(module, "training", False) else 0.0,
        softmax_scale=scaling,
        causal=getattr(module, "is_causal", True),
    )
    return out.reshape(b, t, hq, d), None


mark_varlen(varlen_attention_forward)  # takes the samples from cu_seqlens / position_ids: under Ulysses, the global ones


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Mask function: varlen FlashAttention needs no mask (samples are split by ``cu_seqlens``)."""
    return None


def register() -> None:
    """Register :data:`IMPLEMENTATION` in transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, varlen_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, _no_mask)


class FlashAttnVarlen:
    """The ``flash_attn`` kernel (op ``attention``)."""

    op = "attention"

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def available(self) -> tuple[bool, str]:
        from omnicore.api import cuda_and_package

        return cuda_and_package("flash_attn", "flash-attn")

    def activate(self, model: Any) -> None:
        """Register the varlen function and switch ``model`` (a transformers model) to it."""
        register()
        model.set_attn_implementation(IMPLEMENTATION)
