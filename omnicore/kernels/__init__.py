"""Built-in kernels, one module per op, and the varlen helpers kernels share.

* :mod:`~omnicore.kernels.attention`: ``sdpa``, ``eager`` (transformers' attention registry);
* :mod:`~omnicore.kernels.attention_varlen`: ``sdpa_varlen`` (per packed sample, no mask);
* :mod:`~omnicore.kernels.cross_entropy`: ``torch_cross_entropy``, ``chunked_cross_entropy``;
* :mod:`~omnicore.kernels.rmsnorm`: ``torch_rms_norm``;
* :mod:`~omnicore.kernels.varlen`: ``cu_seqlens`` from ``position_ids``, grouping samples into
  batched calls, the varlen marker;
* :mod:`~omnicore.kernels.common`: the availability check of GPU kernels, DTensor weights.

The contract every kernel implements is :class:`omnicore.components.Kernel`. Submodules import torch
inside their functions; importing this package is cheap.
"""
