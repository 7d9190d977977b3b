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
        from omnicore.builtin.kernels import cuda_and_package

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
    op = "cross_entropy"
    flag = "fused_linear_cross_entropy"
