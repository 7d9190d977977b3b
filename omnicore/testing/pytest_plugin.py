"""pytest plugin (entry point ``pytest11``) with fixtures for plugin authors.

Loaded in every pytest session where omnicore is installed; importing it stays torch-free.

Fixtures:
    ``omnicore_registry``: a fresh :class:`omnicore.registry.Registry` discovered from the installed
        entry points; nothing process-wide is shared between tests.
    ``isolated_registry``: a factory ``isolated_registry(*plugins, builtins=False)`` returning a
        registry of exactly those plugin objects (modules, objects, ``(plugin, provider)`` pairs or
        dotted module names), with the plugin-selecting ``OMNICORE_*`` environment variables unset.
    ``fake_distribution``: a factory ``fake_distribution(dist, version="1.0", entry_points=...,
        modules=...)`` that writes a fake installed distribution under the test's ``tmp_path``,
        puts it on ``sys.path`` (import caches invalidated) and returns a
        :class:`omnicore.testing.FakeDistribution`; everything is undone after the test.

The contract suites are base classes, not fixtures: ``from omnicore.testing import EncoderContract``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

# the suites' asserts get pytest's detail (the compared values) whatever imports them first
pytest.register_assert_rewrite("omnicore.testing.contracts", "omnicore.testing.family")

from omnicore import testing  # noqa: E402


@pytest.fixture
def omnicore_registry():
    """A registry of the built-ins and every installed ``omnicore`` entry point."""
    from omnicore.registry import Registry

    return Registry.discover()


@pytest.fixture
def isolated_registry(monkeypatch):
    """Factory: ``isolated_registry(*plugins, builtins=False)`` -> a Registry of only those plugins."""
    for var in testing.plugin_env_vars():
        monkeypatch.delenv(var)

    def make(*plugins: Any, builtins: bool = False) -> Any:
        return testing.isolated_registry(plugins, builtins=builtins)

    return make


@pytest.fixture
def fake_distribution(tmp_path):
    """Factory: write and install a fake distribution for this test (undone afterwards)."""
    with contextlib.ExitStack() as stack:
        count = 0

        def make(dist: str, version: str = "1.0", entry_points: dict[str, str] | None = None, modules: dict[str, str] | None = None):
            nonlocal count
            count += 1
            root = tmp_path / f"site-{count}-{dist}"
            return stack.enter_context(testing.installed_fake_distribution(root, dist, version, entry_points, modules))

        yield make


def pytest_configure(config) -> None:
    """Register the markers that the contract and family suites put on their tests (``cli``: the
    hook-module import check runs a fresh interpreter; ``multiprocess`` and ``slow``: the family
    suite's FSDP2 test), so that a plugin's own suite runs under ``--strict-markers`` and can leave
    them out with ``-m "not cli and not multiprocess"``."""
    config.addinivalue_line("markers", "cli: runs a subprocess (the omnicore command line, a script, pip or a venv)")
    config.addinivalue_line("markers", "multiprocess: starts processes of its own (the family suite's FSDP2 test)")
    config.addinivalue_line("markers", "slow: takes more than about 2 s on a 2-core CPU machine")


def pytest_report_header(config) -> str | None:
    """One header line naming the omnicore that the contract suites test against."""
    from omnicore import __version__

    return f"omnicore: {__version__} (omnicore.testing fixtures: omnicore_registry, isolated_registry, fake_distribution)"
