"""Varlen FlashAttention for packed sequences, installed through transformers' attention registry.

Packed micro-batches carry several samples in one row; their ``position_ids`` restart at 0 at each
sample start. :func:`cu_seqlens_from_position_ids` turns that into the cumulative sequence lengths
``flash_attn_varlen_func`` wants, so samples never attend to each other and no ``[T, T]`` mask is
ever built. ``flash_attn`` is imported lazily (only when the kernel is activated or called): this
module imports on machines without it.
"""

from __future__ import annotations

from typing import Any

IMPLEMENTATION = "omnicore_fa_varlen"
"""The name registered in transformers' ``AttentionInterface`` and ``AttentionMaskInterface``."""


def cu_seqlens_from_position_ids(position_ids: Any) -> tuple[Any, int]:
    """``(cu_seqlens int32 [n+1], max_seqlen)`` for the flattened ``[B, T]`` ``position_ids``.

    A sample starts wherever the position is 0 (and at the start of every row).
    """
    import torch

    pos = position_ids.reshape(position_ids.shape[0], -1)
    starts = pos == 0
    starts[:, 0] = True
    flat = starts.reshape(-1)
    idx = torch.nonzero(flat, as_tuple=False).flatten().to(torch.int32)
    total = torch.tensor([flat.numel()], dtype=torch.int32, device=idx.device)
    cu = torch.cat([idx, total])
    max_len = int((cu[1:] - cu[:-1]).max().item())
    return cu, max_len


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
        from omnicore.builtin.kernels import cuda_and_package

        return cuda_and_package("flash_attn", "flash-attn")

    def activate(self, model: Any) -> None:
        """Register the varlen function and switch ``model`` (a transformers model) to it."""
        register()
        model.set_attn_implementation(IMPLEMENTATION)
