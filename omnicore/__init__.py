"""omnicore: PyTorch-native training of omni-modal models, built around a plugin registry.

Importing this package is torch-free and cheap; heavy parts (model, data, training) live in
subpackages that import torch themselves.
"""

from omnicore.components import KINDS, ComponentSpec
from omnicore.hookspecs import hookimpl

__version__ = "0.1.0"
CORE_API_VERSION = "1.0"
"""Version of the plugin-facing API (hook specs and contracts), separate from the package version."""

__all__ = ["KINDS", "ComponentSpec", "hookimpl", "__version__", "CORE_API_VERSION"]
