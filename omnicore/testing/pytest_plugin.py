"""pytest plugin (entry point ``pytest11``) with fixtures for plugin authors.

Fixtures:
    ``omnicore_registry``: a fresh :class:`omnicore.registry.Registry` discovered from the installed
    entry points; nothing process-wide is shared between tests.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def omnicore_registry():
    from omnicore.registry import Registry

    return Registry.discover()
