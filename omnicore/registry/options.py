"""A component's options, read from its options model: what ``omnicore plugins --options NAME`` lists.

A component declares its options as a pydantic model (``ComponentSpec.options_model``,
``"module:Class"``); every field carries its type, default and ``description``, and the contract
suite checks that each has one. This module imports that one model (never the component's own
module) and turns each field into an :class:`OptionInfo`: dotted name (a nested model's fields
follow it as ``parent.field``), type, default and description. The options module is the plugin's:
a plugin that defines its options next to its processor may import torch with it.
"""

from __future__ import annotations

import types
import typing
from dataclasses import asdict, dataclass
from typing import Any

from omnicore.components import KINDS, ComponentSpec
from omnicore.registry.resolve import component_rows, find_component, import_target
from omnicore.registry.rows import RegistryError, Row


@dataclass(frozen=True)
class OptionInfo:
    """One option of a component, as config readers write it.

    Attributes:
        name: the key under ``options`` (``chunk_seconds``); a nested model's field is dotted
            (``depth.num_layers``).
        type: ``float``, ``str | null``, ``"mean" | "max"`` (a choice), ``dict[str, any]``, with its
            bounds (``int, >= 1``).
        default: in YAML (``3.0``, ``null``, ``{}``), or ``required``.
        description: the field's ``description``.
    """

    name: str
    type: str
    default: str
    description: str

    def as_dict(self) -> dict[str, str]:
        """The option as JSON-ready strings (the ``--json`` form)."""
        return asdict(self)


def find_named(rows: list[Row], name: str, kind: str | None = None) -> ComponentSpec:
    """The component called ``name`` (``whisper``, ``encoder/whisper``, ``provider:name``), of
    ``kind`` when given, else of whichever kind has one by that name.

    Raises:
        RegistryError: no component has that name (the message lists the close and the known
            names), several kinds have one (it lists them: give ``kind/name`` or ``--kind``), or it
            is not available (:func:`omnicore.registry.resolve.find_component`).
    """
    head, sep, bare = name.partition("/")
    if sep and head in KINDS:
        kind, name = head, bare
    if kind is not None:
        return find_component(rows, kind, name)
    wanted = name.rpartition(":")[2]
    kinds = sorted({r.kind for r in component_rows(rows) if r.name == wanted}, key=KINDS.index)
    if len(kinds) > 1:
        raise RegistryError(f"{', '.join(f'{k}/{wanted}' for k in kinds)} share the name {wanted!r}; give one of them, or add --kind")
    if not kinds:
        import difflib

        known = sorted({r.name for r in component_rows(rows)})
        close = difflib.get_close_matches(wanted, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise RegistryError(f"no component named {wanted!r}{hint} Known components: {', '.join(known) or 'none installed'}")
    return find_component(rows, kinds[0], name)


def describe_options(spec: ComponentSpec) -> list[OptionInfo] | None:
    """Every option of ``spec``'s options model, in declaration order (a nested model's fields after
    its own row); an empty list for a model without fields (``NoOptions``: any key is refused); None
    when the spec declares no options model (its options then go to its factory unchecked).

    Raises:
        RegistryError: the options model cannot be imported (the message names the target).
    """
    if not spec.options_model:
        return None
    return _fields(import_target(spec.options_model), "")


def refuses_unknown_keys(spec: ComponentSpec) -> bool:
    """Whether ``spec``'s options model refuses keys it does not declare (``extra="forbid"``)."""
    return bool(spec.options_model) and import_target(spec.options_model).model_config.get("extra") == "forbid"


def _fields(model: Any, prefix: str) -> list[OptionInfo]:
    out = []
    for name, field in model.model_fields.items():
        bounds = _bounds(field.metadata)
        out.append(
            OptionInfo(
                prefix + name,
                type_name(field.annotation) + (f", {bounds}" if bounds else ""),
                _default(field),
                " ".join((field.description or "").split()),
            )
        )
        for nested in _models_in(field.annotation):
            out += _fields(nested, f"{prefix}{name}.")
    return out


def is_model(tp: Any) -> bool:
    """Whether ``tp`` is a pydantic model class (also used by ``scripts/gen_reference.py``)."""
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _models_in(tp: Any) -> list[type]:
    """The pydantic models a field holds directly or as one branch of a union (``DepthOptions | None``)."""
    if is_model(tp):
        return [tp]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if is_model(a)]
    return []


def type_name(tp: Any) -> str:
    """A field type as config readers know it: ``int``, ``str | null``, ``list[str]``, a model's name
    (the one spelling of types for ``omnicore plugins --options`` and the generated config reference)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _bounds(metadata: list[Any]) -> str:
    """A field's numeric bounds (``>= 1``, ``> 0, <= 1``)."""
    parts = []
    for m in metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if getattr(m, attr, None) is not None:
                parts.append(f"{sym} {getattr(m, attr)}")
    return ", ".join(parts)


def _default(field: Any) -> str:
    """A field's default in YAML flow style, or ``required``."""
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        return _yaml(field.default_factory())
    return "required" if field.default is PydanticUndefined else _yaml(field.default)


def _yaml(value: Any) -> str:
    if is_model(type(value)):
        value = value.model_dump()
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value if value.isidentifier() and value not in ("null", "true", "false") else repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple, set)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return repr(value)
