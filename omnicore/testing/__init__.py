"""Helpers for testing omnicore and its plugins (also a pytest plugin: :mod:`omnicore.testing.pytest_plugin`)."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_fake_distribution(root: Path, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str] | None = None) -> Path:
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
