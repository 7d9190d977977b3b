"""What every registry module shares: the statuses, the built-in provider's name, the error type and
:class:`Row`, one line of ``omnicore plugins``."""

from __future__ import annotations

from dataclasses import dataclass

from omnicore.components import ComponentSpec

BUILTIN_PROVIDER = "omnicore"
STATUSES: tuple[str, ...] = ("available", "unavailable", "disabled", "failed", "incompatible", "conflict")


class RegistryError(Exception):
    """A component could not be found, chosen or built; the message says what to do."""


@dataclass
class Row:
    """One line of ``omnicore plugins``: a component, or a plugin that registered none.

    ``status`` is one of :data:`STATUSES`; ``reason`` is one line (empty when available). Plugins
    that are disabled, incompatible or failed have ``kind == "-"`` and ``name`` = the entry-point
    name. ``api`` is the core API range the distribution declares (empty when undeclared).
    """

    kind: str
    name: str
    provider: str
    version: str
    status: str
    reason: str = ""
    description: str = ""
    entry_point: str = ""
    spec: ComponentSpec | None = None
    api: str = ""

    def as_dict(self) -> dict[str, str]:
        """The row as JSON-ready strings (the ``--json`` form)."""
        return {
            "kind": self.kind,
            "name": self.name,
            "provider": self.provider,
            "version": self.version,
            "status": self.status,
            "reason": self.reason,
            "description": self.description,
            "entry_point": self.entry_point,
            "target": self.spec.target if self.spec else "",
            "api": self.api,
        }
