"""The component registry: discovery from entry points, per-plugin isolation, statuses, lookup.

Nothing here imports torch; :meth:`Registry.build` imports the component's own module, which may.
The package is split by job, and every public name is importable from ``omnicore.registry``:

* :mod:`omnicore.registry.policy`: which plugins may load, from metadata alone (allow and disable
  lists, ``OMNICORE_STRICT``, the core API range a distribution declares in its keywords);
* :mod:`omnicore.registry.discovery`: :class:`Registry` and :func:`registry_for`, which load the
  built-ins and each entry point in isolation and record statuses and conflicts;
* :mod:`omnicore.registry.resolve`: lookup and building (:meth:`Registry.resolve`,
  :meth:`Registry.build`, :func:`import_target`) and the torch-free requirement checks
  (:func:`missing_requirements`, :func:`cuda_present`);
* :mod:`omnicore.registry.check`: ``omnicore plugins --check``, each plugin imported in a subprocess;
* :mod:`omnicore.registry.rows`: what they share (:class:`Row`, :class:`RegistryError`, statuses).

Statuses (``Row.status``), each with a one-line ``reason`` (empty when ``available``):
``available``, ``unavailable``, ``disabled``, ``failed``, ``incompatible``, ``conflict``.
"""

from typing import TYPE_CHECKING, Any

from omnicore.registry.discovery import Registry, registry_for
from omnicore.registry.policy import (
    API_KEYWORD,
    ENTRY_POINT_GROUP,
    ENV_ALLOW,
    ENV_DISABLE,
    ENV_STRICT,
    EntryPointInfo,
    PluginPolicy,
    api_compatible,
    api_range,
    entry_points_info,
)
from omnicore.registry.resolve import NVIDIA_DRIVER_FILE, cuda_present, import_target, missing_requirements
from omnicore.registry.rows import BUILTIN_PROVIDER, STATUSES, RegistryError, Row

if TYPE_CHECKING:
    from omnicore.registry.check import CheckResult, check_import, check_plugins

_LAZY = ("CheckResult", "check_import", "check_plugins")
"""Names of :mod:`omnicore.registry.check`, imported on first use: only ``--check`` needs them, and
``omnicore plugins`` is kept fast to start."""


def __getattr__(name: str) -> Any:
    """The names of :data:`_LAZY`, from :mod:`omnicore.registry.check` (PEP 562).

    Raises:
        AttributeError: any other missing name.
    """
    if name in _LAZY:
        from omnicore.registry import check

        return getattr(check, name)
    raise AttributeError(f"module 'omnicore.registry' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "API_KEYWORD",
    "BUILTIN_PROVIDER",
    "ENTRY_POINT_GROUP",
    "ENV_ALLOW",
    "ENV_DISABLE",
    "ENV_STRICT",
    "NVIDIA_DRIVER_FILE",
    "STATUSES",
    "CheckResult",
    "EntryPointInfo",
    "PluginPolicy",
    "Registry",
    "RegistryError",
    "Row",
    "api_compatible",
    "api_range",
    "check_import",
    "check_plugins",
    "cuda_present",
    "entry_points_info",
    "import_target",
    "missing_requirements",
    "registry_for",
]
