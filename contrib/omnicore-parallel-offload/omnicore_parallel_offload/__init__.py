"""omnicore-parallel-offload: the ``fsdp2_offload`` parallel strategy.

Importing this package is torch-free; the strategy lives in :mod:`omnicore_parallel_offload.strategy`.
"""

__version__ = "0.1.0"
