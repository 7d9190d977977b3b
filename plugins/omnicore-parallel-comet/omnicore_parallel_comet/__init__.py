"""omnicore-parallel-comet: the ``comet_ep`` parallel strategy (expert parallelism whose token
all-to-alls overlap the experts' computation, after COMET, Zhang et al. 2025).

Importing this package is torch-free; the strategy lives in :mod:`omnicore_parallel_comet.strategy`.
"""

__version__ = "0.1.0"
