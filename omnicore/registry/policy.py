"""Which plugins may load, decided from metadata alone, before anything of a plugin is imported.

An entry point of the group ``omnicore`` becomes ``disabled`` (named in a disable list, or missing
from an allow-list) or ``incompatible`` (its declared core API range excludes
:data:`omnicore.CORE_API_VERSION`); otherwise it would be loaded (:func:`entry_points_info`).

Core API range: a distribution declares which core API versions its plugins support with one
keyword in its core metadata (``Keywords``), read through :mod:`importlib.metadata` without importing
anything of the plugin::

    [project]
    keywords = ["omnicore-api >=2.0,<3"]

The text after ``omnicore-api`` is a PEP 440 specifier set (:class:`packaging.specifiers.SpecifierSet`)
that must contain :data:`omnicore.CORE_API_VERSION`. A distribution without the keyword is assumed
compatible; an unparsable range makes its entry points ``failed``. (An entry-point group such as
``omnicore.api`` cannot carry the range: setuptools only accepts ``module:attr`` values there.)

Environment (merged with the arguments of :meth:`~omnicore.registry.Registry.discover`, i.e. with
the config's ``plugins`` section through :func:`~omnicore.registry.registry_for`):
    ``OMNICORE_DISABLE_PLUGINS``: comma-separated entry-point or distribution names not to load.
    ``OMNICORE_ALLOW_PLUGINS``: comma-separated entry-point or distribution names; when set, only
    these plugins load (built-ins stay on).
    ``OMNICORE_STRICT``: ``1`` turns every ``failed`` or ``incompatible`` plugin into an error (for CI).
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omnicore import CORE_API_VERSION

if TYPE_CHECKING:
    from importlib import metadata  # imported where used: it costs more than the whole listing (omnicore.registry.distinfo)

ENTRY_POINT_GROUP = "omnicore"
API_KEYWORD = "omnicore-api"
"""The ``Keywords`` entry that declares a distribution's supported core API range."""
ENV_DISABLE, ENV_ALLOW, ENV_STRICT = "OMNICORE_DISABLE_PLUGINS", "OMNICORE_ALLOW_PLUGINS", "OMNICORE_STRICT"


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
        """The entry point as reasons name it: ``entry point 'name = value' of dist version``."""
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
    def make(cls, disable: Iterable[str] | None = None, allow: Iterable[str] | None = None, strict: bool | None = None) -> PluginPolicy:
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
    plain = _plain_contains(spec, CORE_API_VERSION)
    if plain is not None:
        return plain
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(spec).contains(CORE_API_VERSION, prereleases=True)
    except InvalidSpecifier as exc:
        raise ValueError(str(exc)) from exc


_PLAIN_CLAUSE = re.compile(r"\s*(==|!=|<=|>=|<|>)\s*([0-9]+(?:\.[0-9]+)*)\s*")
_PLAIN_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*")
_COMPARE = {"==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def _plain_contains(spec: str, version: str) -> bool | None:
    """``SpecifierSet(spec).contains(version, prereleases=True)`` without importing packaging, for
    the plain case: ``version`` is a final release (``2.0``) and every clause of ``spec`` is one of
    ``== != <= >= < >`` before a release number (``>=2.0,<3``). ``None`` for anything else (``~=``,
    wildcards, pre-releases, a clause that does not parse): packaging then decides, and words the
    error.

    For a final release against plain release numbers PEP 440 compares release tuples padded with
    zeros; the exclusions of ``<`` (pre-releases) and ``>`` (post-releases, local versions) cannot
    apply. ``tests/test_startup.py`` checks this against packaging.
    """
    if not _PLAIN_VERSION.fullmatch(version):
        return None
    clauses = [c for c in spec.split(",") if c.strip()]
    parsed = [_PLAIN_CLAUSE.fullmatch(c) for c in clauses]
    if not all(parsed):
        return None
    have = _release(version)
    return all(_COMPARE[m.group(1)](have, _release(m.group(2))) for m in parsed if m)


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of ``1.2.0`` without trailing zeros (``(1, 2)``): PEP 440's ordering key."""
    parts = [int(p) for p in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def entry_points_info(
    entry_points: Iterable[metadata.EntryPoint] | None = None, policy: PluginPolicy | None = None
) -> list[EntryPointInfo]:
    """Every ``omnicore`` entry point with what metadata says about it, in the fixed load order.

    Imports no plugin code (this is what ``omnicore plugins --no-load`` prints). ``policy`` defaults
    to the environment's. The installed entry points are read by :mod:`omnicore.registry.distinfo`
    where it gives ``importlib.metadata``'s answer, else by ``importlib.metadata``.
    """
    policy = policy or PluginPolicy.make()
    broken: list[EntryPointInfo] = []
    eps = list(entry_points) if entry_points is not None else _installed_entry_points(broken)
    out = broken
    for ep in eps:
        info = _metadata_info(ep)
        if info.status:
            out.append(info)
            continue
        blocked = policy.blocked(ep.name, info.provider)
        if blocked:
            info.status, info.reason = "disabled", f"{info.where}: {blocked}"
        else:
            _check_api(info)
        out.append(info)
    out.sort(key=lambda i: (i.provider, i.name, i.value))
    return out


def _installed_entry_points(broken: list[EntryPointInfo]) -> list[metadata.EntryPoint]:
    """The installed ``omnicore`` entry points. One distribution with unparsable metadata makes
    ``importlib.metadata.entry_points()`` raise for all of them; then the distributions are read one
    by one, and each one that cannot be read becomes a ``failed`` info appended to ``broken``."""
    from omnicore.registry import distinfo

    fast = distinfo.entry_points(ENTRY_POINT_GROUP)
    if fast is not None:
        return fast  # type: ignore[return-value]  # duck-typed EntryPoints (name, value, dist, load)
    from importlib import metadata

    try:
        return list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # noqa: BLE001 - a broken distribution; find it below
        pass
    eps: list[metadata.EntryPoint] = []
    seen: set[str] = set()
    for dist in metadata.distributions():
        name, version = _dist_label(dist)
        if _canon(name) in seen:
            continue  # the first distribution of a name on sys.path wins, as in entry_points()
        seen.add(_canon(name))
        try:
            eps += list(dist.entry_points.select(group=ENTRY_POINT_GROUP))
        except Exception as exc:  # noqa: BLE001 - any parse error of the metadata files
            where = str(getattr(dist, "_path", "")) or name
            reason = (
                f"distribution {name} {version} has unreadable entry points ({where}); none of them is loaded: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())}; reinstall or remove it"
            )
            broken.append(EntryPointInfo(name, "", name, version, "", status="failed", reason=reason))
    return eps


def _dist_label(dist: Any) -> tuple[str, str]:
    """``(name, version)`` of a distribution, ``("unknown", "?")`` where its metadata cannot say."""
    try:
        md = dist.metadata
        return str(md["Name"] or "unknown"), str(md["Version"] or "?")
    except Exception:  # noqa: BLE001 - a missing or unparsable METADATA file
        return "unknown", "?"


def _metadata_info(ep: metadata.EntryPoint) -> EntryPointInfo:
    """The info of one entry point from its distribution's metadata; ``failed`` when the metadata
    cannot be read."""
    dist = getattr(ep, "dist", None)
    provider, version = _dist_label(dist) if dist is not None else ("unknown", "?")
    info = EntryPointInfo(ep.name, ep.value, provider, version, "", entry_point=ep)
    try:
        info.api = api_range(dist)
    except Exception as exc:  # noqa: BLE001 - unparsable Keywords
        info.status, info.reason = "failed", f"{info.where} has unreadable metadata: {type(exc).__name__}: {exc}"
    return info


def _check_api(info: EntryPointInfo) -> None:
    """Mark ``info`` ``failed`` (unparsable range) or ``incompatible`` (range excludes the core API)."""
    try:
        ok = api_compatible(info.api)
    except ValueError as exc:
        info.status = "failed"
        info.reason = f"{info.where} declares an invalid core API range {info.api!r} ({API_KEYWORD} keyword): {exc}"
        return
    if not ok:
        from omnicore import __version__

        info.status = "incompatible"
        info.reason = f"{info.where} requires omnicore API {info.api}; omnicore {__version__} provides API {CORE_API_VERSION}"
        if _admits_api_1(info.api):
            info.reason += f"; {PORT_TO_2}"


PORT_TO_2 = (
    "to port a plugin written for API 1.x to 2.0: import every omnicore name from omnicore.api only; drop kind= from "
    "ComponentSpec (the hook states it); give every encoder and decoder spec processor='module:factory' and its module a "
    "processor attribute, and delete the preprocess/num_tokens/collate forwarders; rename a strategy's apply_with_state(model, "
    "state) to apply(model, state) (apply(model, mesh) now takes the state: the mesh is state.mesh); then declare "
    "keywords = ['omnicore-api >=2.0,<3'] and depend on omnicore>=0.1,<0.2 (CHANGELOG.md, 'Core API 2.0')"
)
"""What an ``incompatible`` row of a plugin written for core API 1.x says to change."""


def _admits_api_1(spec: str) -> bool:
    """Whether the range ``spec`` admits some API 1.x version (1.0 to 1.3): a plugin written for 1.x."""
    versions = ("1.0", "1.1", "1.2", "1.3")
    plain = [_plain_contains(spec, v) for v in versions]
    if None not in plain:
        return any(plain)
    from packaging.specifiers import SpecifierSet

    return any(SpecifierSet(spec).contains(v, prereleases=True) for v in versions)
