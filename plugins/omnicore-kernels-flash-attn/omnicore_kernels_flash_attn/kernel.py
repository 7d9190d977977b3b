"""Varlen FlashAttention for packed sequences, installed through transformers' attention registry.

Packed micro-batches carry several samples in one row; their ``position_ids`` restart at 0 at each
sample start. :func:`omnicore.kernels.varlen.cu_seqlens_from_position_ids` (core, shared with the
CPU kernel ``sdpa_varlen``) turns that into the cumulative sequence lengths
``flash_attn_varlen_func`` wants, so samples never attend to each other and no ``[T, T]`` mask is
ever built. ``flash_attn`` is imported lazily (only when the kernel is activated or called): this
module imports on machines without it.
"""

from __future__ import annotations

from typing import Any

from omnicore.api import cu_seqlens_from_position_ids, mark_varlen

__all__ = ["IMPLEMENTATION", "FlashAttnVarlen", "cu_seqlens_from_position_ids", "register", "varlen_attention_forward"]

IMPLEMENTATION = "omnicore_fa_varlen"
"""The name registered in transformers' ``AttentionInterface`` and ``AttentionMaskInterface``."""


def varlen_attention_forward(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None, dropout: float = 0.0, **kwargs: Any
) -> tuple[Any, None]:
    """transformers attention function: ``query`` ``[B, Hq, T, D]``, ``key``/``value`` ``[B, Hkv, T, D]``;
    returns ``([B, T, Hq, D], None)``. Uses ``kwargs["position_ids"]`` (else one sample per row)."""
    import torch
    from flash_attn import flash_attn_varlen_func

    b, hq, t, d = query.shape
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        position_ids = torch.arange(t, device=query.device).expand(b, t)
    cu, max_len = cu_seqlens_from_position_ids(position_ids)
    cu = cu.to(query.device)
    q = query.transpose(1, 2).reshape(b * t, hq, d)
    k = key.transpose(1, 2).reshape(b * t, key.shape[1], d)
    v = value.transpose(1, 2).reshape(b * t, value.shape[1], d)
    out = flash_attn_varlen_func(
        q, k, v, cu, cu, max_len, max_len,
        dropout_p=dropout if getattr(module, "training", False) else 0.0,
        softmax_scale=scaling,
        causal=getattr(module, "is_causal", True),
    )
    return out.reshape(b, t, hq, d), None


mark_varlen(varlen_attention_forward)  # takes the samples from position_ids: Ulysses passes the global ones


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
