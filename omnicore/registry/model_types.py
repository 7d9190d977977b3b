"""Which installed foundation serves a checkpoint, answered from the components' specs.

A published model *family* names the transformers model types it reads in its foundation spec,
``ComponentSpec.extra["model_types"]`` (a tuple of ``config.json`` ``model_type`` values); a
*generic* family names ``("*",)``: it serves any model type that no family names. The config entry
``model.foundation: {name: auto, options: {checkpoint: ...}}`` is resolved here, before anything is
built: the checkpoint's ``config.json`` is read (JSON only, torch-free) and its ``model_type`` picks
the foundation, so no family keeps a hand table of the others.

Resolution order for a model type ``t``: the foundations whose ``model_types`` hold ``t`` (exactly
one, or an error listing them with ``provider:name`` choices); else the generic foundations (those
holding ``"*"``: exactly one); else an error naming ``t`` and the model types the installed
families serve.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omnicore.registry.rows import RegistryError, Row

AUTO = "auto"
"""The foundation name that picks the family from the checkpoint's ``model_type``."""
MODEL_TYPES_KEY = "model_types"
"""The key of ``ComponentSpec.extra`` that lists the model types a foundation serves."""
ANY_MODEL_TYPE = "*"
"""The model type a generic foundation lists: it serves any model type no family names."""


def spec_model_types(row: Row) -> tuple[str, ...]:
    """The model types a foundation row's spec names (``()`` for none)."""
    spec = row.spec
    values = (spec.extra or {}).get(MODEL_TYPES_KEY, ()) if spec is not None else ()
    return tuple(str(v) for v in values)


def checkpoint_model_type(folder: str | Path, what: str = "model.foundation.options.checkpoint") -> str:
    """The ``model_type`` of a checkpoint folder's ``config.json``.

    Raises:
        RegistryError: naming ``what``: the folder has no ``config.json``, it is not JSON, or it
            names no ``model_type``.
    """
    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        raise RegistryError(
            f"{what}: {str(folder)!r} has no config.json; point it at a folder written by save_pretrained (or a Hub id in the cache)"
        )
    try:
        model_type = json.loads(cfg.read_text()).get("model_type")
    except (ValueError, OSError) as exc:
        raise RegistryError(f"{what}: {cfg} is not valid JSON ({exc}); write it again with save_pretrained") from exc
    if not isinstance(model_type, str) or not model_type:
        raise RegistryError(f"{what}: {cfg} names no model_type; write it again with the model class's save_pretrained")
    return model_type


def served_model_types(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """``model type -> usable foundation rows that name it`` (``"*"`` for the generic ones)."""
    out: dict[str, list[Row]] = {}
    for row in rows:
        if row.kind != "foundation" or row.status not in ("available", "conflict"):
            continue
        for t in spec_model_types(row):
            out.setdefault(t, []).append(row)
    return out


def foundation_for(rows: Iterable[Row], model_type: str, what: str = "model.foundation") -> str:
    """The foundation name (``provider:name`` when needed to be unique) that serves ``model_type``.

    Raises:
        RegistryError: naming ``what``: several families name the model type (choose one by name),
            or none does and no generic family is installed (the message lists the served types and
            what to install).
    """
    served = served_model_types(rows)
    for key in (model_type, ANY_MODEL_TYPE):
        found = served.get(key, [])
        if len(found) == 1:
            return found[0].name
        if len(found) > 1:
            names = ", ".join(f"'{r.provider}:{r.name}'" for r in found)
            whose = f"model type {model_type!r}" if key == model_type else "any model type (generic families)"
            raise RegistryError(f"{what}: name auto: several foundations serve {whose}: {names}; name one instead of auto")
    known = ", ".join(sorted(t for t in served if t != ANY_MODEL_TYPE)) or "none"
    raise RegistryError(
        f"{what}: name auto: no installed family serves model type {model_type!r} (served: {known}) and no generic family is "
        "installed; pip install omnicore-family-kit (the generic family) or the family plugin for this model"
    )


def resolve_auto(rows: Iterable[Row], name: str, options: dict[str, Any], what: str = "model.foundation") -> str:
    """``name`` itself, or for :data:`AUTO` the foundation that serves ``options["checkpoint"]``'s
    model type (:func:`foundation_for`).

    Raises:
        RegistryError: ``auto`` without a ``checkpoint`` option, or as :func:`checkpoint_model_type`
            and :func:`foundation_for`.
    """
    if name != AUTO:
        return name
    checkpoint = (options or {}).get("checkpoint")
    if not checkpoint:
        raise RegistryError(f"{what}: name auto needs options.checkpoint (a folder or a Hub id in the cache) to read its model_type")
    return foundation_for(list(rows), checkpoint_model_type(checkpoint, f"{what}.options.checkpoint"), what)
