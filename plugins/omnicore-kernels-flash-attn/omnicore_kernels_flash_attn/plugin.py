"""Hook module (entry point ``flash_attn`` in the group ``omnicore``).

``omnicore plugins`` imports this module, so it imports nothing heavy (no torch, no flash_attn). The
spec declares ``requires=("cuda", "flash_attn")``: the registry marks the kernel ``unavailable``, with
the reason, on a machine without an NVIDIA driver or without the ``flash_attn`` package, without
importing either.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_kernels() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="flash_attn",
            target="omnicore_kernels_flash_attn.kernel:FlashAttnVarlen",
            description="varlen FlashAttention (flash_attn_varlen_func); packed samples split by restarting position_ids (GPU only)",
            requires=("cuda", "flash_attn"),
        )
    ]
