"""Discovery: the built-ins and every ``omnicore`` entry point, each plugin loaded in isolation.

Discovery (``Registry.discover``):

1. the built-in plugin :mod:`omnicore.builtins` is registered first, through the same hooks as
   any other plugin (as pytest does with its own built-in plugins); built-ins are never disabled;
2. every entry point of the group ``omnicore`` is then considered in a fixed order (distribution,
   then entry-point name), so the order in which ``importlib.metadata`` lists them never matters.
   From metadata alone, *before anything is imported*, it becomes ``disabled`` (named in a disable
   list, or missing from an allow-list) or ``incompatible`` (its declared core API range excludes
   :data:`omnicore.CORE_API_VERSION`; see :mod:`omnicore.registry.policy`). Otherwise its hook
   module is loaded inside its own ``try``: a plugin that fails to import, fails pluggy's hook
   validation, raises from a hook (``SystemExit`` and other ``BaseException`` included; only
   ``KeyboardInterrupt`` propagates, as the user's) or returns something that is not a
   :class:`~omnicore.components.ComponentSpec` of the hook's kind becomes one ``failed`` row whose
   reason names the distribution, its version and the entry point; its partial registrations are
   dropped (all-or-nothing per plugin), and the other plugins load as usual;
3. a ``kind/name`` offered by several providers (a built-in included) marks all of them ``conflict``.

A component whose ``requires`` are not met here is ``unavailable`` (:mod:`omnicore.registry.resolve`).
Lookup and building are :mod:`omnicore.registry.resolve`'s; :class:`Registry` delegates to it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pluggy

from omnicore import CORE_API_VERSION, hookspecs
from omnicore.components import KINDS, ComponentSpec
from omnicore.registry.policy import ENV_STRICT, PluginPolicy, entry_points_info
from omnicore.registry.resolve import build_component, build_processor_of, component_rows, find_component, missing_requirements
from omnicore.registry.rows import BUILTIN_PROVIDER, RegistryError, Row

if TYPE_CHECKING:
    from importlib import metadata  # imported where used (omnicore.registry.distinfo says why)


class Registry:
    """All components known to this process, and the rows ``omnicore plugins`` prints.

    Build one with :meth:`discover` (entry points), :func:`registry_for` (a run config) or
    :meth:`from_plugins` (explicit plugin objects, used by tests). Instances are independent:
    nothing is process-wide.
    """

    def __init__(self, policy: PluginPolicy | None = None) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.rows: list[Row] = []
        self.policy = policy or PluginPolicy.make()

    # ---- discovery ---------------------------------------------------------------------------

    @classmethod
    def discover(
        cls,
        *,
        entry_points: Iterable[metadata.EntryPoint] | None = None,
        builtins: bool = True,
        disable: Iterable[str] | None = None,
        allow: Iterable[str] | None = None,
        strict: bool | None = None,
    ) -> Registry:
        """Registry of the built-ins plus every installed ``omnicore`` entry point.

        Args:
            entry_points: override the installed entry points (tests pass fakes). Their order does
                not matter: they are loaded sorted by distribution and entry-point name.
            builtins: register :mod:`omnicore.builtins` first.
            disable: entry-point or distribution names not to load (added to
                ``OMNICORE_DISABLE_PLUGINS``); they are not imported.
            allow: when given (or when ``OMNICORE_ALLOW_PLUGINS`` is set), only the plugins named
                here or there load; built-ins stay on.
            strict: turn every failed or incompatible plugin into an error (also ``OMNICORE_STRICT=1``).

        Raises:
            RegistryError: only in strict mode, on the first failed or incompatible plugin.
        """
        reg = cls(PluginPolicy.make(disable, allow, strict))
        if builtins:
            from omnicore import builtins as builtin_plugin

            reg.add_plugin(builtin_plugin, provider=BUILTIN_PROVIDER, version=_version(BUILTIN_PROVIDER), entry_point="builtin")
            for row in reg.rows:
                row.api = f"=={CORE_API_VERSION}"
        for info in entry_points_info(entry_points, reg.policy):
            if info.status in ("failed", "incompatible"):
                reg._fail(info.name, info.provider, info.version, info.value, info.reason, status=info.status, api=info.api)
                continue
            if info.status == "disabled":
                reg.rows.append(
                    Row("-", info.name, info.provider, info.version, "disabled", info.reason, entry_point=info.value, api=info.api)
                )
                continue
            try:
                obj = info.entry_point.load()  # type: ignore[union-attr]
            except KeyboardInterrupt:
                raise  # the user's Ctrl-C (or SIGINT) still stops discovery
            except BaseException as exc:  # noqa: BLE001 - SystemExit or any other import-time escape must not take the listing down
                reg._fail(
                    info.name,
                    info.provider,
                    info.version,
                    info.value,
                    f"{info.where} failed to import: {type(exc).__name__}: {_one_line(exc)}",
                    api=info.api,
                )
                continue
            reg.add_plugin(obj, provider=info.provider, version=info.version, entry_point=info.value, ep_name=info.name, api=info.api)
        reg._mark_conflicts()
        return reg

    @classmethod
    def from_plugins(cls, plugins: Iterable[tuple[Any, str]], *, builtins: bool = False) -> Registry:
        """Registry from explicit ``(plugin_object, provider_name)`` pairs (for tests and embedding)."""
        reg = cls.discover(entry_points=[], builtins=builtins)
        for obj, provider in plugins:
            reg.add_plugin(obj, provider=provider, version="0", entry_point=provider)
        reg._mark_conflicts()
        return reg

    def add_plugin(self, obj: Any, *, provider: str, version: str, entry_point: str, ep_name: str | None = None, api: str = "") -> bool:
        """Register one plugin object and collect its components, all-or-nothing.

        Returns True when the plugin registered (or was already registered: loading the same object
        twice is harmless); on failure a ``failed`` row is recorded instead.

        Raises:
            RegistryError: in strict mode, instead of recording a ``failed`` row.
        """
        label = ep_name or provider
        where = f"entry point '{label} = {entry_point}' of {provider} {version}"
        if self.pm.is_registered(obj):
            return True
        try:
            self.pm.register(obj, name=f"{provider}:{label}")
            self.pm.check_pending()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit and the like from plugin code are a failed row too
            self._unregister(obj)
            self._fail(label, provider, version, entry_point, f"{where} failed validation: {_one_line(exc)}", api=api)
            return False
        collected: list[ComponentSpec] = []
        try:
            for kind in KINDS:
                hook = getattr(self.pm.hook, hookspecs.HOOK_FOR_KIND[kind])
                for impl in hook.get_hookimpls():
                    if impl.plugin is not obj:
                        continue
                    result = impl.function()
                    if not isinstance(result, (list, tuple)):
                        raise TypeError(f"hook {hookspecs.HOOK_FOR_KIND[kind]} returned {result!r}; expected a list[ComponentSpec]")
                    for spec in result:
                        if not isinstance(spec, ComponentSpec):
                            raise TypeError(
                                f"hook {hookspecs.HOOK_FOR_KIND[kind]} returned {spec!r}; expected ComponentSpec(name=..., target=...)"
                            )
                        collected.append(spec.of_kind(kind))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit and the like from plugin code are a failed row too
            self._unregister(obj)
            hint = ""
            if isinstance(exc, TypeError) and "'kind'" in str(exc):
                hint = " (core API 2.0: ComponentSpec takes no kind=, the hook states it; drop it)"
            self._fail(
                label,
                provider,
                version,
                entry_point,
                f"{where} raised in registration: {type(exc).__name__}: {_one_line(exc)}{hint}",
                api=api,
            )
            return False
        for spec in collected:
            why = missing_requirements(spec.requires, spec.extra.get("install")) if spec.requires else ""
            status = "unavailable" if why else "available"
            self.rows.append(Row(spec.kind, spec.name, provider, version, status, why, spec.description, entry_point, spec, api))
        return True

    def _unregister(self, obj: Any) -> None:
        if self.pm.is_registered(obj):
            self.pm.unregister(obj)

    def _fail(
        self, name: str, provider: str, version: str, entry_point: str, reason: str, *, status: str = "failed", api: str = ""
    ) -> None:
        if self.policy.strict:
            why = "OMNICORE_STRICT=1" if os.environ.get(ENV_STRICT) == "1" else "plugins.strict"
            raise RegistryError(f"{reason} (strict mode: {why})")
        self.rows.append(Row("-", name, provider, version, status, reason, entry_point=entry_point, api=api))

    def _mark_conflicts(self) -> None:
        by_key: dict[str, list[Row]] = {}
        for row in self.rows:
            if row.spec is not None and row.status in ("available", "conflict"):
                by_key.setdefault(row.spec.key, []).append(row)
        for key, rows in by_key.items():
            if len(rows) > 1:
                names = ", ".join(sorted(r.provider for r in rows))
                builtin = any(r.provider == BUILTIN_PROVIDER for r in rows)
                for r in rows:
                    r.status = "conflict"
                    r.reason = f"{key} is offered by {names}; pick one in config as '{r.provider}:{r.name}'"
                    if builtin and r.provider != BUILTIN_PROVIDER:
                        r.reason += f" (or '{BUILTIN_PROVIDER}:{r.name}' to keep the built-in)"
                    elif builtin:
                        r.reason += " (the built-in; a plugin never replaces it without that choice)"

    # ---- lookup ------------------------------------------------------------------------------

    def components(self, kind: str | None = None) -> list[Row]:
        """Rows that describe components (not plugins that registered none), optionally of one kind."""
        return component_rows(self.rows, kind)

    def resolve(self, kind: str, name: str) -> ComponentSpec:
        """Find the one component ``kind/name``; ``name`` may be ``provider:name`` to pick a provider.

        Raises:
            RegistryError: if none matches (the message lists the valid names and the closest one,
                and plugins that failed, were disabled or are incompatible and might have provided
                it), or if several providers offer it (the message lists ``provider:name`` choices).
        """
        return find_component(self.rows, kind, name)

    def foundation_for(self, model_type: str) -> str:
        """The name of the installed foundation that serves checkpoints of ``model_type`` (a family
        naming it in ``ComponentSpec.extra["model_types"]``, else the generic family); see
        :mod:`omnicore.registry.model_types`.

        Raises:
            RegistryError: several serve it, or none does.
        """
        from omnicore.registry.model_types import foundation_for

        return foundation_for(self.rows, model_type)

    def build(self, kind: str, name: str, options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """Resolve ``kind/name``, validate ``options`` with its options model, and call its factory.
        A foundation named ``auto`` is the installed family that serves ``options["checkpoint"]``'s
        model type (:meth:`foundation_for`).

        Raises:
            RegistryError: if the component cannot be resolved or imported, or if ``options`` fail
                validation (the message names the component and the offending field).
        """
        if kind == "foundation":
            from omnicore.registry.model_types import resolve_auto

            name = resolve_auto(self.rows, name, options or {})
        return build_component(self.resolve(kind, name), options, **kwargs)

    def build_processor(self, kind: str, name: str, options: dict[str, Any] | None = None) -> Any:
        """The data side (:class:`~omnicore.components.Processor`) of encoder or decoder ``name``,
        from its options alone: no ``nn.Module`` is built and no weights are read.

        Resolves ``kind/name``, validates ``options`` with its options model and calls the factory
        named by ``ComponentSpec.processor`` (every encoder and decoder spec names one).

        Args:
            kind: ``"encoder"`` or ``"decoder"``.
            name: as in config (``provider:name`` works).
            options: the component's options, as for :meth:`build`.

        Raises:
            RegistryError: ``kind`` is not encoder or decoder, or as :meth:`build` raises (unknown
                component, import failure, invalid options).
        """
        if kind not in ("encoder", "decoder"):
            raise RegistryError(f"only encoders and decoders have processors, not {kind!r} components ({kind}/{name})")
        return build_processor_of(self.resolve(kind, name), options)


def registry_for(cfg: Any) -> Registry:
    """The registry a run uses: :meth:`Registry.discover` with the config's ``plugins`` section.

    ``cfg`` is an :class:`omnicore.config.Config` (or anything with a ``plugins`` attribute holding
    ``disable``, ``allow`` and ``strict``); the environment variables are merged in as documented
    in :mod:`omnicore.registry.policy`.

    Raises:
        RegistryError: in strict mode, on the first failed or incompatible plugin.
    """
    p = getattr(cfg, "plugins", None)
    if p is None:
        return Registry.discover()
    return Registry.discover(disable=p.disable, allow=p.allow, strict=p.strict)


# ---- helpers ---------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _version(dist: str) -> str:
    from omnicore.registry import distinfo

    fast = distinfo.version(dist)
    if fast is not None:
        return fast
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        from omnicore import __version__

        return __version__
