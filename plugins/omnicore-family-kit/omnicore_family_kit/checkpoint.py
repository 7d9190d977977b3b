"""A family's checkpoint folder, its ``model_type``, and which installed family serves another one.

Every family checks that its ``options.checkpoint`` is a folder of a model type it reads, and says
what to use instead when it is not. The answer to "who reads model type ``t``" comes from the
installed foundations' specs (``ComponentSpec.extra["model_types"]``, read by
:meth:`omnicore.api.Registry.foundation_for`), so no family keeps a table of the others.

Torch-free: data workers call it when they build a processor.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any


def read_model_type(folder: Path) -> Any:
    """``config.json``'s ``model_type`` of ``folder`` (None when it names none).

    Raises:
        ValueError: ``config.json`` is not valid JSON.
    """
    try:
        return json.loads((Path(folder) / "config.json").read_text()).get("model_type")
    except json.JSONDecodeError as exc:
        raise ValueError(f"{Path(folder) / 'config.json'} is not valid JSON ({exc}); write it again with save_pretrained") from exc


@functools.cache
def _installed_rows() -> tuple[Any, ...]:
    """The rows of the installed plugins (discovered once per process, torch-free)."""
    from omnicore.api import Registry

    return tuple(Registry.discover().rows)


def serving_family(model_type: str) -> str | None:
    """The name of the installed foundation that serves ``model_type`` (a family that names it,
    else the generic ``auto`` family), or None when none does or discovery fails."""
    from omnicore.api import Registry, RegistryError

    registry = Registry()
    registry.rows = list(_installed_rows())
    try:
        return registry.foundation_for(model_type)
    except RegistryError:
        return None


def checkpoint_folder(checkpoint: str, what: str, model_types: tuple[str, ...], what_to_put: str) -> Path:
    """``checkpoint`` as a folder whose ``config.json`` names one of ``model_types``.

    Args:
        checkpoint: the option's value (the core has already resolved a Hub id to its cached folder).
        what: the config field, for messages (``model.foundation.options.checkpoint``).
        model_types: the ``model_type`` values the family reads.
        what_to_put: the end of the message: what a valid folder is (the family's published names).

    Raises:
        ValueError: naming ``what``: the folder or its ``config.json`` is missing, or its model type
            is not one of ``model_types`` (naming the installed foundation that serves it, if any,
            and ``name: auto``).
    """
    folder = Path(checkpoint).expanduser()
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise ValueError(f"{what}: {str(folder)!r} has no config.json; {what_to_put}")
    model_type = read_model_type(folder)
    if model_type not in model_types:
        raise ValueError(
            f"{what}: {cfg} has model_type {model_type!r}, not one of {', '.join(model_types)}{family_hint(model_type, what)}; otherwise {what_to_put}"
        )
    return folder


def family_hint(model_type: Any, what: str) -> str:
    """``"; model type 't' is served by foundation/<name>: ..."`` for a model type another installed
    family (or the generic family) serves, ``""`` otherwise (no model type, or none serves it).

    For ``model.foundation...`` it says to set ``model.foundation.name`` to that foundation (or
    ``auto``); for another field (an encoder's or decoder's ``checkpoint``) it says to point
    ``model.foundation`` at the checkpoint instead of that field, since only foundations name the
    model types they serve.
    """
    if not isinstance(model_type, str):
        return ""
    name = serving_family(model_type)
    if name is None:
        return ""
    field = what.split(".options")[0]
    served = f"; model type {model_type!r} is served by foundation/{name}"
    if field == "model.foundation":
        return f"{served}: set model.foundation.name to {name} (or auto)"
    return f"{served}: point model.foundation (name: {name}, or auto) at it, not {field}"
