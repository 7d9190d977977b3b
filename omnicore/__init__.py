"""omnicore: PyTorch-native training of omni-modal models, built around a plugin registry.

Importing this package is torch-free and cheap; heavy parts (model, data, training) live in
subpackages that import torch themselves.
"""

from omnicore.components import KINDS, ComponentSpec
from omnicore.hookspecs import hookimpl

__version__ = "0.1.0"
CORE_API_VERSION = "1.3"
"""Version of the plugin-facing API (hook specs, contracts and :mod:`omnicore.api`), separate from the
package version. 1.1 added omnicore.api and the complete parallel-strategy and kernel contracts
(all additions: plugins written for 1.0 keep working). 1.2 added processors apart from weights
(``ComponentSpec.processor``, :class:`omnicore.components.Processor`,
``Registry.build_processor``); a plugin written for 1.1 keeps working as its own processor. 1.3 added
the sixth kind, loggers (``omnicore_loggers``, :class:`omnicore.components.Logger`)."""

__all__ = ["KINDS", "ComponentSpec", "hookimpl", "__version__", "CORE_API_VERSION"]
