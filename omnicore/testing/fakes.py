"""Fake installed distributions and isolated registries, for tests of the registry and of plugins.

Torch-free. Re-exported by :mod:`omnicore.testing`; the contract suites use them from here.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any


def write_fake_distribution(
    root: Path, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str] | None = None
) -> Path:
    """Install a fake distribution under ``root`` (put ``root`` on ``sys.path`` to use it).

    Writes ``<root>/<module>.py`` for each of ``modules`` (source, dedented) and a real
    ``<dist>-<version>.dist-info`` folder (``METADATA`` and ``entry_points.txt`` with the group
    ``omnicore``), so ``importlib.metadata`` finds its entry points as it finds installed ones.
    Returns the ``.dist-info`` folder.
    """
    root.mkdir(parents=True, exist_ok=True)
    for mod, src in (modules or {}).items():
        (root / f"{mod}.py").write_text(textwrap.dedent(src))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    eps = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[omnicore]\n{eps}")
    return info


@dataclass(frozen=True)
class FakeDistribution:
    """A fake distribution written by :func:`installed_fake_distribution`.

    Attributes:
        name: the distribution name (``METADATA``'s ``Name``).
        version: its version.
        root: the folder on ``sys.path`` that holds its modules and its ``.dist-info``.
        info: the ``.dist-info`` folder.
    """

    name: str
    version: str
    root: Path
    info: Path

    def entry_points(self) -> list[metadata.EntryPoint]:
        """This distribution's ``omnicore`` entry points only, as ``importlib.metadata`` reads them.

        Pass them to ``Registry.discover(entry_points=...)`` for a registry of the built-ins plus this
        distribution, unaffected by whatever else is installed.
        """
        dist = metadata.PathDistribution(self.info)
        return [ep for ep in dist.entry_points if ep.group == "omnicore"]


@contextlib.contextmanager
def installed_fake_distribution(
    root: Path,
    dist: str,
    version: str = "1.0",
    entry_points: dict[str, str] | None = None,
    modules: dict[str, str] | None = None,
) -> Iterator[FakeDistribution]:
    """Write a fake distribution under ``root`` and make it importable and discoverable inside the block.

    ``root`` is prepended to ``sys.path`` and the import system's caches are invalidated, so both
    ``import`` and ``importlib.metadata.entry_points(group="omnicore")`` see it at once. On exit
    ``root`` leaves ``sys.path`` and every module imported from under it leaves ``sys.modules``
    (a later test may write a module of the same name), and caches are invalidated again.

    Args:
        root: an empty or new folder (one distribution per folder keeps teardown exact).
        dist, version, entry_points, modules: as :func:`write_fake_distribution`.
    """
    root = Path(root)
    info = write_fake_distribution(root, dist, version, entry_points or {}, modules)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield FakeDistribution(dist, version, root, info)
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(root))
        forget_modules_under(root)
        importlib.invalidate_caches()


def forget_modules_under(root: Path) -> list[str]:
    """Remove from ``sys.modules`` every module whose file lies under ``root``; returns their names."""
    base = os.path.realpath(root) + os.sep
    gone = []
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if file and os.path.realpath(file).startswith(base):
            del sys.modules[name]
            gone.append(name)
    return gone


def plugin_env_vars() -> list[str]:
    """Names of the environment variables that change which plugins load (``OMNICORE_*PLUGIN*``,
    ``OMNICORE_STRICT``, ...) and are set in this process; isolated registries run without them."""
    return [k for k in os.environ if k.startswith("OMNICORE_") and any(w in k for w in ("PLUGIN", "STRICT", "ALLOW", "DISABLE"))]


def isolated_registry(plugins: Iterable[Any] = (), *, builtins: bool = False) -> Any:
    """A :class:`~omnicore.registry.Registry` of exactly ``plugins`` (plus the built-ins if asked).

    Nothing comes from the installed entry points. Each item is a plugin object (a module or any
    object with :data:`omnicore.hookimpl` functions), a ``(plugin, provider)`` pair, or the dotted
    name of a module to import. The provider of an unnamed plugin is its module's name.
    """
    from omnicore.registry import Registry

    pairs = []
    for item in plugins:
        if isinstance(item, tuple):
            obj, provider = item
        else:
            obj = importlib.import_module(item) if isinstance(item, str) else item
            provider = getattr(obj, "__name__", type(obj).__name__)
        if isinstance(obj, str):
            obj = importlib.import_module(obj)
        pairs.append((obj, provider))
    return Registry.from_plugins(pairs, builtins=builtins)
