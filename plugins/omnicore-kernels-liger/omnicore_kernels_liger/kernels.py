"""Liger kernels as omnicore kernels. ``liger_kernel`` is imported lazily (only in ``activate``), so
this module imports on machines without it; ``available()`` is the authoritative check at build time."""

from __future__ import annotations

from typing import Any


class _Liger:
    op = ""
    flag = ""
    """The keyword of ``liger_kernel.transformers.apply_liger_kernel_to_instance`` this kernel turns on."""

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def available(self) -> tuple[bool, str]:
        from omnicore.api import cuda_and_package

        return cuda_and_package("liger_kernel", "liger-kernel")

    def activate(self, model: Any) -> None:
        """Patch ``model`` (a transformers model) in place through liger's public API, turning on only
        this kernel's patch."""
        from liger_kernel.transformers import apply_liger_kernel_to_instance

        flags = {"rope": False, "rms_norm": False, "swiglu": False, "cross_entropy": False, "fused_linear_cross_entropy": False}
        flags[self.flag] = True
        apply_liger_kernel_to_instance(model=model, **flags)


class LigerRMSNorm(_Liger):
    op = "rmsnorm"
    flag = "rms_norm"


class LigerSwiGLU(_Liger):
    op = "swiglu"
    flag = "swiglu"


class LigerFusedLinearCrossEntropy(_Liger):
    """omnicore's text loss through Liger's fused linear cross-entropy (Hsu et al. 2024, "Liger
    Kernel", arXiv:2410.10989): the LM head and the loss in chunks, in Triton, never the whole
    ``[N, V]`` logits. ``model.kernels.cross_entropy: liger_fused_linear_cross_entropy``."""

    op = "cross_entropy"
    flag = "fused_linear_cross_entropy"

    def activate(self, model: Any) -> None:
        """Nothing to patch: OmniModel computes its loss from the hidden states and calls
        :meth:`linear_cross_entropy_sum` (patching the HF model's own forward would not be used)."""

    def linear_cross_entropy_sum(self, hidden: Any, weight: Any, labels: Any, ignore_index: int = -100, bias: Any = None) -> Any:
        """Sum over targets of the cross-entropy of ``hidden @ weight.T + bias`` (see
        :meth:`omnicore.kernels.cross_entropy.TorchCrossEntropy.linear_cross_entropy_sum`: ``hidden``
        ``[N, H]``, ``weight`` ``[V, H]``, ``labels`` ``[N]`` long; returns an fp32 scalar), through
        liger's public ``LigerFusedLinearCrossEntropyLoss(reduction="sum")`` (CUDA tensors)."""
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        from omnicore.api import plain_weight

        loss_fn = LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index, reduction="sum")
        return loss_fn(plain_weight(weight), hidden, labels, bias).float()
