"""Hook module (entry point ``encoder_balance`` in the group ``omnicore``).

``omnicore plugins`` imports this module, so it imports nothing heavy: the spec names its factory as
a string and the registry imports it only when a run builds the strategy.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_parallel_strategies() -> list[ComponentSpec]:
    """Register ``parallel/encoder_balance``."""
    return [
        ComponentSpec(
            name="encoder_balance",
            target="omnicore_parallel_encoder_balance.strategy:EncoderBalance",
            options_model="omnicore_parallel_encoder_balance.strategy:EncoderBalanceOptions",
            description="encoder items moved over the dp ranks so each encodes about the same cost; rows and gradients sent back",
        )
    ]
