"""Hook module (entry point ``liger`` in the group ``omnicore``).

Imports nothing heavy (no torch, no liger_kernel). Each spec declares ``requires=("cuda",
"liger_kernel")``, so the registry lists the kernels ``unavailable``, with the reason, where either is
missing, without importing anything.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl

_REQUIRES = ("cuda", "liger_kernel")


@hookimpl
def omnicore_kernels() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="liger_rmsnorm",
            target="omnicore_kernels_liger.kernels:LigerRMSNorm",
            description="Liger (Triton) RMSNorm patched into the foundation (GPU only)",
            requires=_REQUIRES,
        ),
        ComponentSpec(
            name="liger_swiglu",
            target="omnicore_kernels_liger.kernels:LigerSwiGLU",
            description="Liger (Triton) fused SwiGLU MLP patched into the foundation (GPU only)",
            requires=_REQUIRES,
        ),
        ComponentSpec(
            name="liger_fused_linear_cross_entropy",
            target="omnicore_kernels_liger.kernels:LigerFusedLinearCrossEntropy",
            description="Liger fused lm_head + cross-entropy (no [T, vocab] logits materialised; GPU only)",
            requires=_REQUIRES,
        ),
    ]
