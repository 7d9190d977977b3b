"""The component registry: discovery from entry points, per-plugin isolation, statuses, lookup.

Discovery (``Registry.discover``):

1. the built-in plugin :mod:`omnicore.builtin.plugin` is registered first, through the same hooks as
   any other plugin (as pytest does with its own built-in plugins);
2. every entry point of the group ``omnicore`` is loaded inside its own ``try``: a plugin that fails
   to import, fails pluggy's hook validation, raises from a hook or returns something that is not a
   :class:`~omnicore.components.ComponentSpec` of the hook's kind becomes one ``failed`` row whose
   reason names the distribution and the entry point; its partial registrations are dropped
   (all-or-nothing per plugin), and the other plugins load as usual.

Lookup (``Registry.resolve``): ``kind/name`` resolves only when exactly one available provider
offers it; otherwise the error lists the candidates and how to pick one
(``provider:name`` in config). Nothing here imports torch; :meth:`Registry.build` imports the
component's own module, which may.

Environment:
    ``OMNICORE_DISABLE_PLUGINS``: comma-separated entry-point or distribution names not to load.
    ``OMNICORE_STRICT``: ``1`` turns every plugin failure into an error (for CI).
"""

from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Iterable

import pluggy

from omnicore import hookspecs
from omnicore.components import KINDS, ComponentSpec

ENTRY_POINT_GROUP = "omnicore"
BUILTIN_PROVIDER = "omnicore"


class RegistryError(Exception):
    """A component could not be found, chosen or built; the message says what to do."""


@dataclass
class Row:
    """One line of ``omnicore plugins``: a component, or a plugin that failed before registering any.

    ``status`` is ``available``, ``disabled``, ``failed`` or ``conflict``; ``reason`` is one line.
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
        }


def _env_list(var: str) -> set[str]:
    return {x.strip() for x in os.environ.get(var, "").split(",") if x.strip()}


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


class Registry:
    """All components known to this process, and the rows ``omnicore plugins`` prints.

    Build one with :meth:`discover` (entry points) or :meth:`from_plugins` (explicit plugin objects,
    used by tests). Instances are independent: nothing is process-wide.
    """

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.rows: list[Row] = []

    # ---- discovery ---------------------------------------------------------------------------

    @classmethod
    def discover(cls, *, entry_points: Iterable[metadata.EntryPoint] | None = None, builtins: bool = True) -> "Registry":
        """Registry of the built-ins plus every installed ``omnicore`` entry point.

        Args:
            entry_points: override the installed entry points (tests pass fakes).
            builtins: register :mod:`omnicore.builtin.plugin` first.

        Raises:
            RegistryError: only in strict mode (``OMNICORE_STRICT=1``), on the first failed plugin.
        """
        reg = cls()
        if builtins:
            from omnicore.builtin import plugin as builtin_plugin

            reg.add_plugin(builtin_plugin, provider=BUILTIN_PROVIDER, version=_version(BUILTIN_PROVIDER), entry_point="builtin")
        eps = list(entry_points) if entry_points is not None else list(metadata.entry_points(group=ENTRY_POINT_GROUP))
        disabled = _env_list("OMNICORE_DISABLE_PLUGINS")
        for ep in sorted(eps, key=lambda e: (_dist_name(e), e.name)):
            provider, version = _dist_name(ep), _dist_version(ep)
            where = f"entry point '{ep.name} = {ep.value}' of {provider} {version}"
            if ep.name in disabled or provider in disabled:
                reg.rows.append(Row("-", ep.name, provider, version, "disabled", f"{where}: disabled by OMNICORE_DISABLE_PLUGINS", entry_point=ep.value))
                continue
            try:
                obj = ep.load()
            except Exception as exc:  # any import-time error of a plugin must not take the listing down
                reg._fail(ep.name, provider, version, ep.value, f"{where} failed to import: {type(exc).__name__}: {exc}")
                continue
            reg.add_plugin(obj, provider=provider, version=version, entry_point=ep.value, ep_name=ep.name)
        reg._mark_conflicts()
        return reg

    @classmethod
    def from_plugins(cls, plugins: Iterable[tuple[Any, str]], *, builtins: bool = False) -> "Registry":
        """Registry from explicit ``(plugin_object, provider_name)`` pairs (for tests and embedding)."""
        reg = cls.discover(entry_points=[], builtins=builtins)
        for obj, provider in plugins:
            reg.add_plugin(obj, provider=provider, version="0", entry_point=provider)
        reg._mark_conflicts()
        return reg

    def add_plugin(self, obj: Any, *, provider: str, version: str, entry_point: str, ep_name: str | None = None) -> bool:
        """Register one plugin object and collect its components, all-or-nothing.

        Returns True when the plugin registered; on failure a ``failed`` row is recorded instead
        (or, in strict mode, :class:`RegistryError` is raised).
        """
        label = ep_name or provider
        where = f"entry point '{label} = {entry_point}' of {provider} {version}"
        if self.pm.is_registered(obj):
            return True  # loading the same plugin object twice is harmless
        try:
            self.pm.register(obj, name=f"{provider}:{label}")
            self.pm.check_pending()
        except Exception as exc:
            self._unregister(obj)
            self._fail(label, provider, version, entry_point, f"{where} failed validation: {exc}")
            return False
        collected: list[ComponentSpec] = []
        try:
            for kind in KINDS:
                hook = getattr(self.pm.hook, hookspecs.HOOK_FOR_KIND[kind])
                for impl in hook.get_hookimpls():
                    if impl.plugin is not obj:
                        continue
                    result = impl.function()
                    for spec in result or []:
                        if not isinstance(spec, ComponentSpec) or spec.kind != kind:
                            raise TypeError(
                                f"hook {hookspecs.HOOK_FOR_KIND[kind]} returned {spec!r}; expected ComponentSpec(kind={kind!r}, ...)"
                            )
                        collected.append(spec)
        except Exception as exc:
            self._unregister(obj)
            self._fail(label, provider, version, entry_point, f"{where} raised in registration: {type(exc).__name__}: {exc}")
            return False
        for spec in collected:
            self.rows.append(Row(spec.kind, spec.name, provider, version, "available", "", spec.description, entry_point, spec))
        return True

    def _unregister(self, obj: Any) -> None:
        if self.pm.is_registered(obj):
            self.pm.unregister(obj)

    def _fail(self, name: str, provider: str, version: str, entry_point: str, reason: str) -> None:
        if os.environ.get("OMNICORE_STRICT") == "1":
            raise RegistryError(f"{reason} (strict mode: OMNICORE_STRICT=1)")
        self.rows.append(Row("-", name, provider, version, "failed", reason, entry_point=entry_point))

    def _mark_conflicts(self) -> None:
        by_key: dict[str, list[Row]] = {}
        for row in self.rows:
            if row.spec is not None and row.status in ("available", "conflict"):
                by_key.setdefault(row.spec.key, []).append(row)
        for key, rows in by_key.items():
            if len(rows) > 1:
                names = ", ".join(sorted(r.provider for r in rows))
                for r in rows:
                    r.status = "conflict"
                    r.reason = f"{key} is offered by {names}; pick one in config as '{r.provider}:{r.name}'"

    # ---- lookup ------------------------------------------------------------------------------

    def components(self, kind: str | None = None) -> list[Row]:
        """Rows that describe components (not failed plugins), optionally of one kind."""
        return [r for r in self.rows if r.spec is not None and (kind is None or r.kind == kind)]

    def resolve(self, kind: str, name: str) -> ComponentSpec:
        """Find the one component ``kind/name``; ``name`` may be ``provider:name`` to pick a provider.

        Raises:
            RegistryError: if none matches (the message lists the valid names and the closest one,
                and failed plugins that might have provided it), or if several providers offer it.
        """
        if kind not in KINDS:
            raise RegistryError(f"unknown component kind {kind!r}; kinds are {', '.join(KINDS)}")
        provider, _, bare = name.rpartition(":")
        candidates = [r for r in self.components(kind) if r.name == bare and (not provider or r.provider == provider)]
        usable = [r for r in candidates if r.status in ("available", "conflict")]
        if len(usable) == 1:
            return usable[0].spec  # type: ignore[return-value]
        if len(usable) > 1:
            options = ", ".join(f"'{r.provider}:{r.name}'" for r in usable)
            raise RegistryError(f"{kind}/{bare} is offered by several plugins; choose one in config: {options}")
        if candidates:
            r = candidates[0]
            raise RegistryError(f"{kind}/{bare} from {r.provider} is {r.status}: {r.reason}")
        valid = sorted({r.name for r in self.components(kind)})
        close = difflib.get_close_matches(bare, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        failed = [r for r in self.rows if r.status == "failed"]
        extra = ""
        if failed:
            extra = " Plugins that failed to load (see `omnicore plugins`): " + ", ".join(f"{r.provider} ({r.name})" for r in failed) + "."
        known = ", ".join(valid) or "none installed"
        raise RegistryError(f"no {kind} named {name!r}{hint} Known {kind}s: {known}.{extra}")

    def build(self, kind: str, name: str, options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """Resolve ``kind/name``, validate ``options`` with its options model, and call its factory.

        Raises:
            RegistryError: if the component cannot be resolved or imported, or if ``options`` fail
                validation (the message names the component and the offending field).
        """
        spec = self.resolve(kind, name)
        opts = dict(options or {})
        if spec.options_model:
            model_cls = import_target(spec.options_model)
            from pydantic import ValidationError

            try:
                opts = model_cls.model_validate(opts).model_dump()
            except ValidationError as exc:
                raise RegistryError(f"options of {spec.key}: {_format_validation(exc, model_cls)}") from exc
        factory: Callable[..., Any] = import_target(spec.target)
        return factory(opts, **kwargs)


def _format_validation(exc: Any, model_cls: Any) -> str:
    parts = []
    fields = list(getattr(model_cls, "model_fields", {}))
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(err["loc"][-1]), fields, n=1)
            msg = "unknown key" + (f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(fields)}")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def _dist_name(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.metadata["Name"] if dist is not None else "unknown"


def _dist_version(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.version if dist is not None else "?"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        from omnicore import __version__

        return __version__
