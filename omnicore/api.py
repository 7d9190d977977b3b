"""The public API for plugin authors: everything a plugin may import from omnicore, in one place.

A plugin imports from three modules only: :mod:`omnicore.components` (the contracts and
``ComponentSpec``), :mod:`omnicore.hookspecs` (``hookimpl``) and this one; tests may also use the
testing kit :mod:`omnicore.testing`. Every other module of omnicore is internal and may change
between releases; ``tests/test_public_api.py`` fails when a first-party plugin imports one.

Importing this module is cheap and torch-free: each name is imported from its home module on first
use (PEP 562 module ``__getattr__``), so a hook module may import it too.

What is here, by topic:

* **Registration**: :data:`hookimpl`, :class:`ComponentSpec`, :data:`CORE_API_VERSION`;
  :class:`Registry` (``Registry.discover().build(kind, name, options)`` builds any installed
  component, as a run does) and :class:`RegistryError`.
* **Data**: :data:`IGNORE_INDEX` (the label of positions that are not trained), :class:`Audio`,
  :func:`load_audio`, :func:`load_image`, :func:`resample`, :class:`Video`, :func:`load_video`.
* **Varlen (packed samples)**: :func:`cu_seqlens_from_position_ids`, :func:`plan_varlen`,
  :func:`mark_varlen`, :func:`is_varlen`, :data:`CU_SEQLENS_KWARGS`, :func:`varlen_from_kwargs`.
* **Kernels**: :func:`cuda_and_package` (the build-time check of a GPU kernel), :func:`plain_weight`
  (a DTensor weight as a plain tensor), :class:`TorchCrossEntropy` (the reference text loss),
  :func:`rms_norm_modules` (the foundation's RMSNorm modules).
* **Parallel strategies**: :class:`Violation`, :class:`StrategyPlan`, :data:`PHASES`,
  :class:`FSDP2` and :class:`NoParallel` (to compose rather than copy), :class:`BlockStrategy`
  (base of per-block strategies), :func:`checkpoint_module`.
* **Expert parallelism**: :class:`ExpertParallel`, :class:`EPContext`, :func:`all_to_all`,
  :func:`regroup`, :func:`local_experts_forward`.
* **Foundations and weights**: :func:`byte_tokenizer`, :func:`load_hf_pretrained`,
  :func:`save_extra_weights`, :func:`load_extra_weights`.
* **Training**: :func:`warmup_cosine` (the LR schedule of the training loop, for a plugin's own
  fits).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # registration
    "hookimpl": "omnicore.hookspecs",
    "ComponentSpec": "omnicore.components",
    "CORE_API_VERSION": "omnicore",
    "Registry": "omnicore.registry",
    "RegistryError": "omnicore.registry",
    # data
    "IGNORE_INDEX": "omnicore.data.chat",
    "Audio": "omnicore.data.media",
    "load_audio": "omnicore.data.media",
    "load_image": "omnicore.data.media",
    "Video": "omnicore.data.media",
    "load_video": "omnicore.data.media",
    "resample": "omnicore.data.media",
    # varlen
    "cu_seqlens_from_position_ids": "omnicore.kernels.varlen",
    "plan_varlen": "omnicore.kernels.varlen",
    "mark_varlen": "omnicore.kernels.varlen",
    "is_varlen": "omnicore.kernels.varlen",
    "CU_SEQLENS_KWARGS": "omnicore.kernels.varlen",
    "varlen_from_kwargs": "omnicore.kernels.varlen",
    # kernels
    "cuda_and_package": "omnicore.kernels.common",
    "plain_weight": "omnicore.kernels.common",
    "TorchCrossEntropy": "omnicore.kernels.cross_entropy",
    "rms_norm_modules": "omnicore.kernels.rmsnorm",
    # parallel strategies
    "Violation": "omnicore.components",
    "StrategyPlan": "omnicore.components",
    "PHASES": "omnicore.components",
    "FSDP2": "omnicore.parallel.fsdp",
    "NoParallel": "omnicore.parallel.fsdp",
    "BlockStrategy": "omnicore.parallel.block",
    "checkpoint_module": "omnicore.parallel.checkpointing",
    # expert parallelism
    "ExpertParallel": "omnicore.parallel.expert",
    "EPContext": "omnicore.parallel.expert",
    "all_to_all": "omnicore.parallel.expert",
    "regroup": "omnicore.parallel.expert",
    "local_experts_forward": "omnicore.parallel.expert",
    # foundations and weights
    "byte_tokenizer": "omnicore.model.foundation",
    "load_hf_pretrained": "omnicore.model.weights",
    "save_extra_weights": "omnicore.model.weights",
    "load_extra_weights": "omnicore.model.weights",
    # training
    "warmup_cosine": "omnicore.train.optim",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its home module on first use (then cache it in this module)."""
    home = _EXPORTS.get(name)
    if home is None:
        raise AttributeError(f"omnicore.api has no {name!r}; the public names are: {', '.join(__all__)}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
