"""Built-in attention kernels through transformers' attention-function registry: ``sdpa`` and
``eager`` (op ``attention``). The varlen kernel ``sdpa_varlen`` lives in
:mod:`omnicore.kernels.attention_varlen`."""

from __future__ import annotations

from typing import Any


class _TransformersAttention:
    op = "attention"
    implementation = ""

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def available(self) -> tuple[bool, str]:
        return True, "pure PyTorch; runs on CPU and GPU"

    def activate(self, model: Any) -> None:
        """Switch a transformers model (and its sub-models) to this attention implementation."""
        model.set_attn_implementation(self.implementation)


class SDPAAttention(_TransformersAttention):
    """``torch.nn.functional.scaled_dot_product_attention``; packed samples are kept apart by the
    block-diagonal causal mask transformers builds from restarting ``position_ids``."""

    implementation = "sdpa"


class EagerAttention(_TransformersAttention):
    """transformers' eager attention (explicit matmul and softmax): the simplest reference."""

    implementation = "eager"
