"""Hook module of omnicore-parallel-ulysses (entry point ``ulysses`` in the group ``omnicore``).

Torch-free on purpose: ``omnicore plugins`` imports every hook module. The specs name their
factories as strings; :mod:`omnicore_parallel_ulysses.strategy` (torch) is imported only when a
strategy is built.
"""

from __future__ import annotations

from omnicore.api import ComponentSpec, hookimpl


@hookimpl
def omnicore_parallel_strategies() -> list[ComponentSpec]:
    """Register ``parallel/ulysses`` and ``parallel/async_ulysses``."""
    return [
        ComponentSpec(
            name="ulysses",
            target="omnicore_parallel_ulysses.strategy:Ulysses",
            options_model="omnicore_parallel_ulysses.strategy:UlyssesOptions",
            description="Ulysses sequence parallelism over sp: all-to-all sequence->heads around the foundation's attention and back",
        ),
        ComponentSpec(
            name="async_ulysses",
            target="omnicore_parallel_ulysses.strategy:AsyncUlysses",
            options_model="omnicore_parallel_ulysses.strategy:UlyssesOptions",
            description="Ulysses with the all-to-alls of q, k and v overlapping the k and v projections (same numbers)",
        ),
    ]
