"""Helpers for testing omnicore and its plugins (also a pytest plugin: :mod:`omnicore.testing.pytest_plugin`).

Torch-free at import time: pytest loads this package through the ``pytest11`` entry point in every
test session. The contract suites (:mod:`omnicore.testing.contracts`, which import torch) are
loaded on first use of their names::

    from omnicore.testing import EncoderContract

What is here:
    * :func:`write_fake_distribution`: write a fake installed distribution (``.dist-info`` with
      entry points, plus modules) under a folder;
    * :func:`installed_fake_distribution`: the same, put on ``sys.path`` for the duration of a
      ``with`` block, with import caches invalidated and its modules forgotten afterwards;
    * :func:`isolated_registry`: a :class:`~omnicore.registry.Registry` built only from the given
      plugin objects (and optionally the built-ins), nothing from the installed entry points;
    * the contract suites, one per component kind (see :mod:`omnicore.testing.contracts`);
    * :class:`FamilyParitySuite`: the parity tests a published family's ``test_model.py``
      subclasses (ids, logits, packed row, loss, export and mRoPE positions against its
      transformers class, and 2 FSDP2 processes against one; loaded on first use; see
      :mod:`omnicore.testing.family`);
    * the core's run path, for a plugin's integration tests (loaded on first use, like the
      suites): :class:`Config` and :func:`train` (a run from a config, as ``omnicore train``
      does), :func:`cli_main` (``omnicore ...`` in process), :func:`build_omni_model`,
      :func:`init_parallel_state` and :func:`parallelize` (a model distributed as a run does),
      the data path (:func:`read_jsonl`, :class:`SampleError`, :class:`ChatProcessor`,
      :func:`encoder_token`, :func:`prepare_tokenizer`, :func:`collate`, :class:`MicroBatch`),
      :func:`generate_batch` (greedy or sampled generation, as ``omnicore generate`` runs it),
      :func:`mrope_positions` and :func:`sdpa_varlen_attention_forward` (references to compare
      a kernel or strategy with).

A plugin's own code imports :mod:`omnicore.api` only; its tests may import this package too (the
names here are versioned with the core API, so a plugin's tests need no internal module).
"""

from __future__ import annotations

from typing import Any

from omnicore.testing.fakes import (
    FakeDistribution,
    forget_modules_under,
    installed_fake_distribution,
    isolated_registry,
    plugin_env_vars,
    write_fake_distribution,
)

_RUN_PATH: dict[str, tuple[str, str]] = {
    "Config": ("omnicore.config", "Config"),
    "train": ("omnicore.train.loop", "train"),
    "cli_main": ("omnicore.cli", "main"),
    "build_omni_model": ("omnicore.model.build", "build_omni_model"),
    "init_parallel_state": ("omnicore.parallel.state", "init_parallel_state"),
    "parallelize": ("omnicore.parallel.parallelize", "parallelize"),
    "read_jsonl": ("omnicore.data.jsonl", "read_jsonl"),
    "SampleError": ("omnicore.data.jsonl", "SampleError"),
    "ChatProcessor": ("omnicore.data.chat", "ChatProcessor"),
    "encoder_token": ("omnicore.data.chat", "encoder_token"),
    "prepare_tokenizer": ("omnicore.model.build", "prepare_tokenizer"),
    "collate": ("omnicore.data.packing", "collate"),
    "generate_batch": ("omnicore.model.generation", "generate_batch"),
    "MicroBatch": ("omnicore.data.packing", "MicroBatch"),
    "mrope_positions": ("omnicore.data.positions", "mrope_positions"),
    "sdpa_varlen_attention_forward": ("omnicore.kernels.attention_varlen", "sdpa_varlen_attention_forward"),
    "FamilyParitySuite": ("omnicore.testing.family", "FamilyParitySuite"),
}
"""The core's run path for integration tests, and the family parity suite that runs a family through
it: public name -> (home module, attribute)."""

_CONTRACTS: tuple[str, ...] = (
    "EncoderContract",
    "DecoderContract",
    "FoundationContract",
    "KernelContract",
    "ParallelStrategyContract",
    "LoggerContract",
    "sample_media",
)
"""The names of :mod:`omnicore.testing.contracts` (torch), loaded on first use."""

__all__ = [
    "FakeDistribution",
    "write_fake_distribution",
    "forget_modules_under",
    "installed_fake_distribution",
    "isolated_registry",
    "plugin_env_vars",
    *_CONTRACTS,
    *_RUN_PATH,
]


def __getattr__(name: str) -> Any:  # PEP 562: the contract suites import torch, so load them lazily
    if name in _CONTRACTS:
        from omnicore.testing import contracts

        return getattr(contracts, name)
    if name in _RUN_PATH:
        import importlib

        module, attr = _RUN_PATH[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'omnicore.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
