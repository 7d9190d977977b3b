"""omnicore: PyTorch-native training of omni-modal models, built around a plugin registry.

Importing this package is torch-free and cheap; heavy parts (model, data, training) live in
subpackages that import torch themselves. Plugins import from :mod:`omnicore.api` only.
"""

__version__ = "0.1.0"
CORE_API_VERSION = "2.0"
"""Version of the plugin-facing API (hook specs, contracts and :mod:`omnicore.api`), separate from the
package version: a plugin declares the range it supports (``keywords = ["omnicore-api >=2.0,<3"]``),
read from its metadata before it is imported. 2.0 is the first release's API; CHANGELOG.md says what
changed from 1.x for plugin authors."""

__all__ = ["__version__", "CORE_API_VERSION"]
