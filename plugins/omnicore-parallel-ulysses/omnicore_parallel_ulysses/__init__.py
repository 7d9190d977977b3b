"""omnicore-parallel-ulysses: Ulysses and Async-Ulysses sequence parallelism (parallel strategies
``ulysses`` and ``async_ulysses``). The hook module is :mod:`omnicore_parallel_ulysses.plugin`;
the strategies live in :mod:`omnicore_parallel_ulysses.strategy`."""
