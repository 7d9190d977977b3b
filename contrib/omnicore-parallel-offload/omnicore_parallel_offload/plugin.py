"""Hook module (entry point ``offload`` in the group ``omnicore``).

``omnicore plugins`` imports this module, so it imports nothing heavy: the spec names its factory and
options model as strings, and the registry imports them only when a run builds the strategy.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_parallel_strategies() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="fsdp2_offload",
            target="omnicore_parallel_offload.strategy:FSDP2Offload",
            options_model="omnicore_parallel_offload.strategy:OffloadOptions",
            description="FSDP2 per block, then the root, over the fsdp dim; each block's saved activations kept on CPU",
        )
    ]
