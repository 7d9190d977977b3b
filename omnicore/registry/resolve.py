"""Resolving and building components, and deciding which ones this machine can run.

Lookup (:meth:`~omnicore.registry.Registry.resolve`): ``kind/name`` resolves only when exactly one
available provider offers it; otherwise the error lists the candidates and how to pick one
(``provider:name`` in config; ``omnicore:name`` picks the built-in). Nothing here imports torch;
:meth:`~omnicore.registry.Registry.build` imports the component's own module, which may.

``unavailable``: the component registered fine but its ``ComponentSpec.requires`` are not met on this
machine (:func:`missing_requirements`). This is decided without importing torch or the required
packages: a requirement that is a module name is looked up with :func:`importlib.util.find_spec`
(never imported), and ``"cuda"`` is a heuristic, an NVIDIA driver being present
(``/proc/driver/nvidia/version`` exists or ``nvidia-smi`` is on ``PATH``). The heuristic can be
wrong (a driver without a CUDA build of torch, say); the kernel's own ``available()``, checked when a
run builds the model, is authoritative. Resolving or building an unavailable component raises
:class:`~omnicore.registry.RegistryError` with the reason, so a run that chooses one fails before
training.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterable
from typing import Any

from omnicore.components import KINDS, ComponentSpec
from omnicore.registry.rows import BUILTIN_PROVIDER, RegistryError, Row

NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"


def cuda_present() -> bool:
    """Torch-free guess whether CUDA can run here: an NVIDIA driver is present.

    True when ``/proc/driver/nvidia/version`` exists or ``nvidia-smi`` is on ``PATH``. This is a
    heuristic for listings; a component's own check at build time (a kernel's ``available()``) is
    authoritative.
    """
    return os.path.exists(NVIDIA_DRIVER_FILE) or shutil.which("nvidia-smi") is not None


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package, or an odd name
        return False


def missing_requirements(requires: Iterable[str], install: dict[str, str] | None = None) -> str:
    """Why ``requires`` are not met on this machine, in one line, or ``""`` when they all are.

    Each requirement is ``"cuda"`` (checked with :func:`cuda_present`) or an importable module name
    (checked with :func:`importlib.util.find_spec`, without importing it). Nothing heavy is imported.
    ``install`` maps a module name to how to get it; the default hint is ``pip install <name>`` with
    ``_`` written ``-`` (plus ``on a CUDA machine`` when ``cuda`` is also required), e.g.
    ``"needs CUDA (no NVIDIA driver found) and the flash_attn package (pip install flash-attn on a
    CUDA machine)"``.
    """
    reqs = list(requires)
    needs_cuda = "cuda" in reqs
    missing = []
    for req in reqs:
        if req == "cuda":
            if not cuda_present():
                missing.append("CUDA (no NVIDIA driver found)")
        elif not _module_present(req):
            hint = (install or {}).get(req) or ("pip install " + req.replace("_", "-") + (" on a CUDA machine" if needs_cuda else ""))
            missing.append(f"the {req} package ({hint})")
    if not missing:
        return ""
    return "needs " + (missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1])


def import_target(target: str) -> Any:
    """Import ``"module:attr"`` (dotted attr allowed) and return the object.

    Raises:
        RegistryError: naming the target, if the module or attribute is missing.
    """
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegistryError(f"cannot import {module_name!r} (target {target!r}): {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise RegistryError(f"module {module_name!r} has no attribute {attr!r} (target {target!r})") from exc
    return obj


def component_rows(rows: Iterable[Row], kind: str | None = None) -> list[Row]:
    """The rows that describe components (not plugins that registered none), optionally of one kind."""
    return [r for r in rows if r.spec is not None and (kind is None or r.kind == kind)]


def find_component(rows: list[Row], kind: str, name: str) -> ComponentSpec:
    """The one component ``kind/name`` among ``rows``; ``name`` may be ``provider:name``.

    This is :meth:`~omnicore.registry.Registry.resolve` on a registry's rows.

    Raises:
        RegistryError: if none or several match; the message says what to choose.
    """
    if kind not in KINDS:
        raise RegistryError(f"unknown component kind {kind!r}; kinds are {', '.join(KINDS)}")
    provider, _, bare = name.rpartition(":")
    candidates = [r for r in component_rows(rows, kind) if r.name == bare and (not provider or r.provider == provider)]
    usable = [r for r in candidates if r.status in ("available", "conflict")]
    if len(usable) == 1:
        return usable[0].spec  # type: ignore[return-value]
    if len(usable) > 1:
        options = ", ".join(f"'{r.provider}:{r.name}'" for r in usable)
        hint = f" ('{BUILTIN_PROVIDER}:{bare}' is the built-in)" if any(r.provider == BUILTIN_PROVIDER for r in usable) else ""
        raise RegistryError(f"{kind}/{bare} is offered by several plugins; choose one in config: {options}{hint}")
    if candidates:
        r = candidates[0]
        raise RegistryError(f"{kind}/{bare} from {r.provider} is {r.status}: {r.reason}")
    raise RegistryError(_not_found(rows, kind, name, bare))


def _not_found(rows: list[Row], kind: str, name: str, bare: str) -> str:
    """The message for a ``kind/name`` nobody offers: the valid names, the closest one, and the
    plugins that failed, are incompatible or are disabled (they might have offered it)."""
    import difflib  # only for this message: not at import, for the listing's start-up time

    valid = sorted({r.name for r in component_rows(rows, kind)})
    close = difflib.get_close_matches(bare, valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    extra = ""
    for status, text in (("failed", "failed to load"), ("incompatible", "are incompatible"), ("disabled", "are disabled")):
        found = [r for r in rows if r.status == status]
        if found:
            extra += f" Plugins that {text} (see `omnicore plugins`): " + ", ".join(f"{r.provider} ({r.name})" for r in found) + "."
    known = ", ".join(valid) or "none installed"
    return f"no {kind} named {name!r}{hint} Known {kind}s: {known}.{extra}"


def build_component(spec: ComponentSpec, options: dict[str, Any] | None = None, /, **kwargs: Any) -> Any:
    """Validate ``options`` with ``spec``'s options model and call its factory with them and ``kwargs``.

    This is :meth:`~omnicore.registry.Registry.build` once the spec is resolved.

    Raises:
        RegistryError: if the options model or the target cannot be imported, or if ``options``
            fail validation (the message names the component and the offending field; one line). A
            factory's own errors propagate (:func:`omnicore.model.build.build_omni_model` names
            the config field of a ``ValueError`` or ``OSError``).
    """
    opts = validate_options(spec, options)
    factory: Callable[..., Any] = import_target(spec.target)
    return factory(opts, **kwargs)


def validate_options(spec: ComponentSpec, options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` validated (and completed with defaults) by ``spec``'s options model; a copy of
    them when it has none.

    Raises:
        RegistryError: if the options model cannot be imported or ``options`` fail it (the message
            names the component and the offending field; one line).
    """
    opts = dict(options or {})
    if spec.options_model:
        model_cls = import_target(spec.options_model)
        from pydantic import ValidationError

        try:
            opts = model_cls.model_validate(opts).model_dump()
        except ValidationError as exc:
            raise RegistryError(f"options of {spec.key}: {_format_validation(exc, model_cls)}") from exc
    return opts


def build_processor_of(spec: ComponentSpec, options: dict[str, Any] | None = None) -> Any:
    """Validate ``options`` with ``spec``'s options model and call its ``processor`` factory.

    This is :meth:`~omnicore.registry.Registry.build_processor` for a spec that names a processor.

    Raises:
        RegistryError: if the spec names no processor, the options model or the processor factory
            cannot be imported, or ``options`` fail validation. The factory's own errors propagate.
    """
    if spec.processor is None:
        raise RegistryError(f"{spec.key} registers no processor (ComponentSpec.processor is None)")
    opts = validate_options(spec, options)
    factory: Callable[..., Any] = import_target(spec.processor)
    return factory(opts)


def _format_validation(exc: Any, model_cls: Any) -> str:
    import difflib

    parts = []
    fields = list(getattr(model_cls, "model_fields", {}))
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = " ".join(str(err["msg"]).split())  # a validator's message may span lines
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(err["loc"][-1]), fields, n=1)
            hint = (
                f"; did you mean {close[0]!r}?"
                if close
                else (f"; valid keys: {', '.join(fields)}" if fields else "; this component takes no options")
            )
            msg = "unknown key" + hint
        parts.append(f"{loc}: {msg}" if loc else msg)  # a model-level check has no field
    return "; ".join(parts)
