"""Built-in attention kernels, installed through transformers' attention-function registry."""

from __future__ import annotations

from typing import Any


def cuda_and_package(module: str, pip_name: str) -> tuple[bool, str]:
    """``(ok, reason)`` for a GPU-only kernel: torch sees a CUDA device and ``module`` is installed.

    The authoritative build-time check behind a kernel's ``available()``; the registry's torch-free
    ``requires`` check only guesses from the driver. ``module`` is found without being imported.
    """
    import importlib.util

    try:
        import torch
    except ImportError:
        return False, "needs torch"
    if not torch.cuda.is_available():
        return False, "needs a CUDA GPU (torch.cuda.is_available() is False)"
    if importlib.util.find_spec(module) is None:
        return False, f"needs the {module} package (pip install {pip_name} on a CUDA machine)"
    return True, f"{module} on CUDA"


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
