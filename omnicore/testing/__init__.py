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
    * the contract suites, one per component kind (see :mod:`omnicore.testing.contracts`).
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

__all__ = [
    "FakeDistribution",
    "write_fake_distribution",
    "forget_modules_under",
    "installed_fake_distribution",
    "isolated_registry",
    "plugin_env_vars",
    "EncoderContract",
    "DecoderContract",
    "FoundationContract",
    "KernelContract",
    "ParallelStrategyContract",
    "LoggerContract",
    "sample_media",
]

_CONTRACTS = {
    "EncoderContract",
    "DecoderContract",
    "FoundationContract",
    "KernelContract",
    "ParallelStrategyContract",
    "LoggerContract",
    "sample_media",
}


def __getattr__(name: str) -> Any:  # PEP 562: the contract suites import torch, so load them lazily
    if name in _CONTRACTS:
        from omnicore.testing import contracts

        return getattr(contracts, name)
    raise AttributeError(f"module 'omnicore.testing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
