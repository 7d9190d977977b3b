"""Hook module (entry point ``comet`` in the group ``omnicore``).

``omnicore plugins`` imports this module, so it imports nothing heavy: the spec names its factory as
a string and the registry imports it only when a run builds the strategy.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_parallel_strategies() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="comet_ep",
            target="omnicore_parallel_comet.strategy:CometExpertParallel",
            description="expert parallelism over ep with COMET-style overlap: token chunks' all-to-alls run while the experts compute",
        )
    ]
