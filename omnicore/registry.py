"""The component registry: discovery from entry points, per-plugin isolation, statuses, lookup.

Discovery (``Registry.discover``):

1. the built-in plugin :mod:`omnicore.builtins` is registered first, through the same hooks as
   any other plugin (as pytest does with its own built-in plugins); built-ins are never disabled;
2. every entry point of the group ``omnicore`` is then considered in a fixed order (distribution,
   then entry-point name), so the order in which ``importlib.metadata`` lists them never matters.
   From metadata alone, *before anything is imported*, it becomes ``disabled`` (named in a disable
   list, or missing from an allow-list) or ``incompatible`` (its declared core API range excludes
   :data:`omnicore.CORE_API_VERSION`). Otherwise its hook module is loaded inside its own ``try``: a
   plugin that fails to import, fails pluggy's hook validation, raises from a hook or returns something
   that is not a :class:`~omnicore.components.ComponentSpec` of the hook's kind becomes one ``failed``
   row whose reason names the distribution, its version and the entry point; its partial
   registrations are dropped (all-or-nothing per plugin), and the other plugins load as usual;
3. a ``kind/name`` offered by several providers (a built-in included) marks all of them ``conflict``.

Statuses (``Row.status``), each with a one-line ``reason`` (empty when ``available``):
``available``, ``unavailable``, ``disabled``, ``failed``, ``incompatible``, ``conflict``.

``unavailable``: the component registered fine but its ``ComponentSpec.requires`` are not met on this
machine (:func:`missing_requirements`). This is decided without importing torch or the required
packages: a requirement that is a module name is looked up with :func:`importlib.util.find_spec`
(never imported), and ``"cuda"`` is a heuristic, an NVIDIA driver being present
(``/proc/driver/nvidia/version`` exists or ``nvidia-smi`` is on ``PATH``). The heuristic can be
wrong (a driver without a CUDA build of torch, say); the kernel's own ``available()``, checked when a
run builds the model, is authoritative. Resolving or building an unavailable component raises
:class:`RegistryError` with the reason, so a run that chooses one fails before training.

Core API range: a distribution declares which core API versions its plugins support with one
keyword in its core metadata (``Keywords``), read through :mod:`importlib.metadata` without importing
anything of the plugin::

    [project]
    keywords = ["omnicore-api >=1.0,<2"]

The text after ``omnicore-api`` is a PEP 440 specifier set (:class:`packaging.specifiers.SpecifierSet`)
that must contain :data:`omnicore.CORE_API_VERSION`. A distribution without the keyword is assumed
compatible; an unparsable range makes its entry points ``failed``. (An entry-point group such as
``omnicore.api`` cannot carry the range: setuptools only accepts ``module:attr`` values there.)

Lookup (``Registry.resolve``): ``kind/name`` resolves only when exactly one available provider
offers it; otherwise the error lists the candidates and how to pick one (``provider:name`` in config;
``omnicore:name`` picks the built-in). Nothing here imports torch; :meth:`Registry.build` imports the
component's own module, which may.

Environment (merged with the arguments of :meth:`Registry.discover`, i.e. with the config's
``plugins`` section through :func:`registry_for`):
    ``OMNICORE_DISABLE_PLUGINS``: comma-separated entry-point or distribution names not to load.
    ``OMNICORE_ALLOW_PLUGINS``: comma-separated entry-point or distribution names; when set, only
    these plugins load (built-ins stay on).
    ``OMNICORE_STRICT``: ``1`` turns every ``failed`` or ``incompatible`` plugin into an error (for CI).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Iterable

import pluggy

from omnicore import CORE_API_VERSION, hookspecs
from omnicore.components import KINDS, ComponentSpec

ENTRY_POINT_GROUP = "omnicore"
BUILTIN_PROVIDER = "omnicore"
API_KEYWORD = "omnicore-api"
"""The ``Keywords`` entry that declares a distribution's supported core API range."""
STATUSES: tuple[str, ...] = ("available", "unavailable", "disabled", "failed", "incompatible", "conflict")
ENV_DISABLE, ENV_ALLOW, ENV_STRICT = "OMNICORE_DISABLE_PLUGINS", "OMNICORE_ALLOW_PLUGINS", "OMNICORE_STRICT"


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


@dataclass
class EntryPointInfo:
    """What metadata alone says about one ``omnicore`` entry point (nothing is imported).

    ``status`` is ``""`` (would be loaded), ``disabled``, ``incompatible`` or ``failed`` (the
    declared API range does not parse); ``reason`` says why, in one line.
    """

    name: str
    value: str
    provider: str
    version: str
    api: str
    status: str = ""
    reason: str = ""
    entry_point: metadata.EntryPoint | None = field(default=None, repr=False, compare=False)

    @property
    def where(self) -> str:
        return f"entry point '{self.name} = {self.value}' of {self.provider} {self.version}"

    def as_dict(self) -> dict[str, str]:
        """JSON-ready strings (``omnicore plugins --no-load --json``)."""
        return {
            "name": self.name,
            "provider": self.provider,
            "version": self.version,
            "value": self.value,
            "api": self.api,
            "status": self.status or "not loaded",
            "reason": self.reason,
        }


@dataclass(frozen=True)
class PluginPolicy:
    """Which plugins may load: the ``disable``/``allow``/``strict`` arguments merged with the env.

    Each name is an entry-point name or a distribution name. ``allow`` is None when no allow-list is
    set; otherwise only the plugins it names load (built-ins always do). ``sources`` maps
    ``"disable"``/``"allow"`` to where each name came from, for reasons.
    """

    disable: dict[str, str]
    allow: dict[str, str] | None
    strict: bool

    @classmethod
    def make(cls, disable: Iterable[str] | None = None, allow: Iterable[str] | None = None, strict: bool | None = None) -> "PluginPolicy":
        """Merge arguments (the config's ``plugins`` section) with the environment.

        ``disable`` and ``allow`` are unions of both sources; ``strict`` is on when either asks.
        """
        dis = {_canon(n): "config plugins.disable" for n in disable or ()}
        dis.update({_canon(n): ENV_DISABLE for n in _env_list(ENV_DISABLE)})
        allowed: dict[str, str] | None = None
        env_allow = _env_list(ENV_ALLOW)
        if allow is not None or env_allow:
            allowed = {_canon(n): "config plugins.allow" for n in allow or ()}
            allowed.update({_canon(n): ENV_ALLOW for n in env_allow})
        return cls(dis, allowed, bool(strict) or os.environ.get(ENV_STRICT) == "1")

    def blocked(self, ep_name: str, provider: str) -> str:
        """Why this plugin must not load (``"disabled by ..."``), or ``""`` when it may."""
        for n in (ep_name, provider):
            if _canon(n) in self.disable:
                return f"disabled by {self.disable[_canon(n)]}"
        if self.allow is not None and _canon(ep_name) not in self.allow and _canon(provider) not in self.allow:
            sources = " and ".join(sorted(set(self.allow.values()))) or "config plugins.allow"
            listed = ", ".join(sorted(self.allow)) or "nothing"
            return f"not in the allow-list ({sources}: {listed})"
        return ""


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _env_list(var: str) -> list[str]:
    return [x.strip() for x in os.environ.get(var, "").split(",") if x.strip()]


def api_range(dist: Any) -> str:
    """The core API range a distribution declares (``">=1.0,<2"``), or ``""``; reads metadata only.

    The declaration is the keyword ``omnicore-api <specifiers>``. Core metadata joins keywords with
    commas, so the clauses after it that start with an operator belong to the range.
    """
    if dist is None:
        return ""
    keywords = ",".join(dist.metadata.get_all("Keywords") or [])
    parts = [p.strip() for p in keywords.split(",")]
    for i, part in enumerate(parts):
        if part == API_KEYWORD or part.startswith(API_KEYWORD + " "):
            clauses = [part[len(API_KEYWORD) :].strip()]
            for p in parts[i + 1 :]:
                if not p or p[0] not in "<>=!~":
                    break
                clauses.append(p)
            return ",".join(c for c in clauses if c)
    return ""


def api_compatible(spec: str) -> bool:
    """Whether :data:`omnicore.CORE_API_VERSION` lies in ``spec`` (an empty range allows all).

    Raises:
        ValueError: if ``spec`` is not a valid PEP 440 specifier set.
    """
    if not spec:
        return True
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(spec).contains(CORE_API_VERSION, prereleases=True)
    except InvalidSpecifier as exc:
        raise ValueError(str(exc)) from exc


def entry_points_info(entry_points: Iterable[metadata.EntryPoint] | None = None, policy: PluginPolicy | None = None) -> list[EntryPointInfo]:
    """Every ``omnicore`` entry point with what metadata says about it, in the fixed load order.

    Imports no plugin code (this is what ``omnicore plugins --no-load`` prints). ``policy`` defaults
    to the environment's.
    """
    policy = policy or PluginPolicy.make()
    eps = list(entry_points) if entry_points is not None else list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    out = []
    for ep in eps:
        dist = getattr(ep, "dist", None)
        md = dist.metadata if dist is not None else None
        provider = md["Name"] if md is not None else "unknown"
        version = md["Version"] if md is not None else "?"
        info = EntryPointInfo(ep.name, ep.value, provider, version, api_range(dist), entry_point=ep)
        blocked = policy.blocked(ep.name, provider)
        if blocked:
            info.status, info.reason = "disabled", f"{info.where}: {blocked}"
        else:
            try:
                ok = api_compatible(info.api)
            except ValueError as exc:
                info.status = "failed"
                info.reason = f"{info.where} declares an invalid core API range {info.api!r} ({API_KEYWORD} keyword): {exc}"
            else:
                if not ok:
                    from omnicore import __version__

                    info.status = "incompatible"
                    info.reason = (
                        f"{info.where} requires omnicore API {info.api}; omnicore {__version__} provides API {CORE_API_VERSION}"
                    )
        out.append(info)
    out.sort(key=lambda i: (i.provider, i.name, i.value))
    return out


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
    ) -> "Registry":
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
                reg.rows.append(Row("-", info.name, info.provider, info.version, "disabled", info.reason, entry_point=info.value, api=info.api))
                continue
            try:
                obj = info.entry_point.load()  # type: ignore[union-attr]
            except Exception as exc:  # any import-time error of a plugin must not take the listing down
                reg._fail(info.name, info.provider, info.version, info.value, f"{info.where} failed to import: {type(exc).__name__}: {_one_line(exc)}", api=info.api)
                continue
            reg.add_plugin(obj, provider=info.provider, version=info.version, entry_point=info.value, ep_name=info.name, api=info.api)
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
        except Exception as exc:
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
                    for spec in result or []:
                        if not isinstance(spec, ComponentSpec) or spec.kind != kind:
                            raise TypeError(
                                f"hook {hookspecs.HOOK_FOR_KIND[kind]} returned {spec!r}; expected ComponentSpec(kind={kind!r}, ...)"
                            )
                        collected.append(spec)
        except Exception as exc:
            self._unregister(obj)
            self._fail(label, provider, version, entry_point, f"{where} raised in registration: {type(exc).__name__}: {_one_line(exc)}", api=api)
            return False
        for spec in collected:
            why = missing_requirements(spec.requires, spec.extra.get("install")) if spec.requires else ""
            status = "unavailable" if why else "available"
            self.rows.append(Row(spec.kind, spec.name, provider, version, status, why, spec.description, entry_point, spec, api))
        return True

    def _unregister(self, obj: Any) -> None:
        if self.pm.is_registered(obj):
            self.pm.unregister(obj)

    def _fail(self, name: str, provider: str, version: str, entry_point: str, reason: str, *, status: str = "failed", api: str = "") -> None:
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
        return [r for r in self.rows if r.spec is not None and (kind is None or r.kind == kind)]

    def resolve(self, kind: str, name: str) -> ComponentSpec:
        """Find the one component ``kind/name``; ``name`` may be ``provider:name`` to pick a provider.

        Raises:
            RegistryError: if none matches (the message lists the valid names and the closest one,
                and plugins that failed, were disabled or are incompatible and might have provided
                it), or if several providers offer it (the message lists ``provider:name`` choices).
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
            hint = f" ('{BUILTIN_PROVIDER}:{bare}' is the built-in)" if any(r.provider == BUILTIN_PROVIDER for r in usable) else ""
            raise RegistryError(f"{kind}/{bare} is offered by several plugins; choose one in config: {options}{hint}")
        if candidates:
            r = candidates[0]
            raise RegistryError(f"{kind}/{bare} from {r.provider} is {r.status}: {r.reason}")
        valid = sorted({r.name for r in self.components(kind)})
        close = difflib.get_close_matches(bare, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        extra = ""
        for status, text in (("failed", "failed to load"), ("incompatible", "are incompatible"), ("disabled", "are disabled")):
            rows = [r for r in self.rows if r.status == status]
            if rows:
                extra += f" Plugins that {text} (see `omnicore plugins`): " + ", ".join(f"{r.provider} ({r.name})" for r in rows) + "."
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


def registry_for(cfg: Any) -> Registry:
    """The registry a run uses: :meth:`Registry.discover` with the config's ``plugins`` section.

    ``cfg`` is an :class:`omnicore.config.Config` (or anything with a ``plugins`` attribute holding
    ``disable``, ``allow`` and ``strict``); the environment variables are merged in as documented
    in this module.

    Raises:
        RegistryError: in strict mode, on the first failed or incompatible plugin.
    """
    p = getattr(cfg, "plugins", None)
    if p is None:
        return Registry.discover()
    return Registry.discover(disable=p.disable, allow=p.allow, strict=p.strict)


# ---- omnicore plugins --check --------------------------------------------------------------------

_CHECK_SCRIPT = r"""
import importlib, json, sys, time
hook, targets = sys.argv[1], sys.argv[2:]
out = {"hook_s": 0.0, "targets_s": 0.0, "hook_torch": False, "torch": False, "error": ""}
try:
    t = time.perf_counter()
    importlib.import_module(hook)
    out["hook_s"] = time.perf_counter() - t
    out["hook_torch"] = "torch" in sys.modules
    t = time.perf_counter()
    for mod in targets:
        importlib.import_module(mod)
    out["targets_s"] = time.perf_counter() - t
except BaseException as exc:
    out["error"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")
out["torch"] = "torch" in sys.modules
sys.stdout.flush()
print("\n@@omnicore-check@@" + json.dumps(out))
"""


@dataclass
class CheckResult:
    """Outcome of importing one plugin in a fresh subprocess (``omnicore plugins --check``).

    ``import_s`` is the time to import the hook module plus every component's target module, in
    seconds; ``torch`` says whether torch was imported by then (``hook_torch``: already by the hook
    module, which breaks the hook-module contract). ``ok`` is False when an import raised, the
    process crashed or it timed out; ``error`` then says which, in one line.
    """

    ok: bool
    import_s: float = 0.0
    torch: bool = False
    hook_torch: bool = False
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"ok": self.ok, "import_s": round(self.import_s, 4), "torch": self.torch, "hook_torch": self.hook_torch, "error": self.error}

    def summary(self) -> str:
        """One line for the table: ``ok 0.012s`` / ``ok 3.1s torch`` / ``FAILED: ...``."""
        if not self.ok:
            return f"FAILED: {self.error}"
        note = " torch (in hook module!)" if self.hook_torch else (" torch" if self.torch else "")
        return f"ok {self.import_s:.3f}s{note}"


def check_import(hook_module: str, targets: Iterable[str] = (), timeout: float = 60.0) -> CheckResult:
    """Import ``hook_module`` then each target module in a fresh Python subprocess and report.

    A crash inside the imports (an exception, ``os._exit``, a segfault, a hang past ``timeout``
    seconds) only makes the result ``ok=False`` with the reason; it never raises.
    """
    import json
    import signal
    import subprocess
    import sys

    cmd = [sys.executable, "-c", _CHECK_SCRIPT, hook_module, *sorted(set(targets))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return CheckResult(False, timeout, error=f"import timed out after {timeout:g}s")
    marker = "@@omnicore-check@@"
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(marker)), None)
    if line is None or proc.returncode != 0:
        if proc.returncode < 0:
            try:
                how = f"killed by {signal.Signals(-proc.returncode).name}"
            except ValueError:
                how = f"killed by signal {-proc.returncode}"
        else:
            how = f"exited with status {proc.returncode}"
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        return CheckResult(False, error=f"import process {how} before reporting" + (f": {tail}" if tail else ""))
    data = json.loads(line[len(marker) :])
    return CheckResult(
        not data["error"], data["hook_s"] + data["targets_s"], data["torch"], data["hook_torch"], data["error"]
    )


def check_plugins(
    reg: Registry, timeout: float = 60.0, workers: int | None = None, only: Iterable[tuple[str, str]] | None = None
) -> dict[tuple[str, str], CheckResult]:
    """Run :func:`check_import` once per plugin of ``reg`` that is not disabled or incompatible.

    Returns results keyed by ``(provider, entry_point)``, the two fields every row carries; ``only``
    restricts the check to those keys (``omnicore plugins --check --kind encoder``). The
    targets checked are the plugin's components' ``target`` and ``options_model`` modules (none for
    a plugin that failed to register). Plugins are checked concurrently (``workers`` processes,
    default: the CPU count, at most 4).
    """
    from concurrent.futures import ThreadPoolExecutor

    plugins: dict[tuple[str, str], set[str]] = {}
    keep = None if only is None else set(only)
    for row in reg.rows:
        if row.status in ("disabled", "incompatible") or (keep is not None and (row.provider, row.entry_point) not in keep):
            continue
        mods = plugins.setdefault((row.provider, row.entry_point), set())
        if row.spec is not None:
            mods.add(row.spec.target.partition(":")[0])
            if row.spec.options_model:
                mods.add(row.spec.options_model.partition(":")[0])
    hook_of = {key: ("omnicore.builtins" if key[1] == "builtin" else key[1].partition(":")[0]) for key in plugins}
    workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(check_import, hook_of[key], mods, timeout) for key, mods in plugins.items()}
        return {key: f.result() for key, f in futures.items()}


# ---- helpers ---------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _format_validation(exc: Any, model_cls: Any) -> str:
    parts = []
    fields = list(getattr(model_cls, "model_fields", {}))
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(err["loc"][-1]), fields, n=1)
            msg = "unknown key" + (f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(fields)}")
        parts.append(f"{loc}: {msg}" if loc else msg)  # a model-level check has no field
    return "; ".join(parts)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        from omnicore import __version__

        return __version__
