"""Helpers every kernel may use (exported to plugins through :mod:`omnicore.api`).

torch is imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

from typing import Any


def cuda_and_package(module: str, pip_name: str) -> tuple[bool, str]:
    """``(ok, reason)`` for a GPU-only kernel: torch sees a CUDA device and ``module`` is installed.

    The authoritative build-time check behind a kernel's ``available()``; the registry's torch-free
    ``requires`` check only guesses from the driver. ``module`` is found without being imported.
    """
    import importlib.util

    try:
        import torch
    except ImportError:
        return False, "needs torch"
    if not torch.cuda.is_available():
        return False, "needs a CUDA GPU (torch.cuda.is_available() is False)"
    if importlib.util.find_spec(module) is None:
        return False, f"needs the {module} package (pip install {pip_name} on a CUDA machine)"
    return True, f"{module} on CUDA"


def plain_weight(weight: Any) -> Any:
    """A weight that may be a DTensor (a sharded LM head outside FSDP2's unshard) as a plain tensor,
    differentiably (``DTensor.full_tensor()``); inside FSDP2's forward the head's weight is already a
    plain, unsharded tensor and is returned as is.

    Args:
        weight: ``[V, H]`` (any shape) ``torch.Tensor`` or ``DTensor``.

    Returns:
        The same values as a plain ``torch.Tensor``.
    """
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return weight
    return weight.full_tensor() if isinstance(weight, DTensor) else weight
