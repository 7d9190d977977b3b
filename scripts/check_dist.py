"""Check the wheels and sdists that ``scripts/build_dist.sh`` built: one of each per project, complete metadata.

    python scripts/check_dist.py DIST PROJECT...    # exit 1, naming each distribution and what it lacks

``PROJECT`` is a folder holding a ``pyproject.toml`` (``.``, ``plugins/omnicore-audio-whisper``, ...).
For each one, ``DIST`` must hold exactly one wheel and one sdist of its name and version, and the
wheel's ``METADATA`` must carry

- ``Name`` and ``Version`` as the pyproject states them (the core's also equal to
  ``omnicore.__version__``, which ``omnicore --version`` prints);
- ``License-Expression`` (or ``License``) and every ``License-File`` it names inside the wheel;
- ``Summary``, and the long description: the project's readme, ``text/markdown``;
- ``Classifier`` lines for each supported Python version (:data:`PYTHONS`), and ``Requires-Python``
  admitting each of them;
- for a plugin, the core API range twice: the keyword ``omnicore-api`` (what the registry reads before
  importing anything, through :func:`omnicore.registry.policy.api_range`) equal to :data:`API_RANGE`, and
  the dependency ``omnicore`` with exactly the specifiers :data:`CORE_RANGE`, plus at least one
  entry point of the group ``omnicore``.

The sdist must hold ``PKG-INFO``, ``pyproject.toml``, the readme and the licence files; a wheel
whose metadata says ``Typing :: Typed`` must hold its package's ``py.typed``.

The API range as a dependency: a plugin written for core API 2.x states ``omnicore-api >=2.0,<3``.
The core 0.1.x is the first release to provide API 2.0, so the same promise, in the terms pip
resolves, is ``omnicore>=0.1,<0.2``. The checker verifies the mapping against the tree too:
``omnicore.CORE_API_VERSION`` must lie in :data:`API_RANGE` and ``omnicore.__version__`` in
:data:`CORE_RANGE`. A core release that provides another API range changes both constants here and
every plugin's pyproject (CHANGELOG.md says which core versions provide which API).

Standard library plus ``packaging`` (a dependency of the core) and ``tomllib`` (``tomli`` on Python
3.10, which ``build`` depends on there).
"""

from __future__ import annotations

import argparse
import ast
import email.message
import email.parser
import re
import sys
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: build depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
CORE = "omnicore"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
"""The Python versions every distribution supports: each has its classifier and lies in Requires-Python."""
API_RANGE = SpecifierSet(">=2.0,<3")
"""The core API range every first-party plugin declares (the ``omnicore-api`` keyword)."""
CORE_RANGE = SpecifierSet(">=0.1,<0.2")
"""The core releases that provide :data:`API_RANGE`: the dependency every first-party plugin states."""


def core_versions(init: Path = ROOT / "omnicore" / "__init__.py") -> tuple[str, str]:
    """``(__version__, CORE_API_VERSION)`` read from ``omnicore/__init__.py`` without importing it.

    Raises:
        ValueError: when either is not assigned a string literal there.
    """
    found: dict[str, str] = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("__version__", "CORE_API_VERSION"):
                    found[target.id] = node.value.value
    missing = {"__version__", "CORE_API_VERSION"} - set(found)
    if missing:
        raise ValueError(f"{init}: {' and '.join(sorted(missing))} must be assigned a string literal")
    return found["__version__"], found["CORE_API_VERSION"]


def _stem(name: str) -> str:
    """A distribution name as wheel and sdist file names spell it (PEP 427, PEP 625)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def check_project(dist: Path, project: Path) -> list[str]:
    """The problems of one project's built distributions, each a line naming the distribution."""
    meta = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8")).get("project", {})
    name, version = meta.get("name", project.name), str(meta.get("version", "?"))
    where = f"{project.relative_to(ROOT) if project.is_relative_to(ROOT) else project}/pyproject.toml"
    label = f"{name} {version}"
    wheels = sorted(dist.glob(f"{_stem(name)}-{version}-*.whl"))
    sdists = sorted(dist.glob(f"{_stem(name)}-{version}.tar.gz"))
    problems = []
    if len(wheels) != 1 or len(sdists) != 1:
        return [f"{label}: expected one wheel and one sdist in {dist}, found {[p.name for p in wheels + sdists] or 'none'}"]
    wheel, sdist = wheels[0], sdists[0]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"{_stem(name)}-{version}.dist-info"
        md = email.parser.Parser().parsestr(zf.read(f"{info}/METADATA").decode("utf-8"))
        entry_points = zf.read(f"{info}/entry_points.txt").decode("utf-8") if f"{info}/entry_points.txt" in names else ""
    problems += [f"{label} ({wheel.name}): {p} (fix {where})" for p in check_metadata(md, name, version, project, meta)]
    for lic in md.get_all("License-File") or []:
        if f"{info}/licenses/{lic}" not in names:
            problems.append(f"{label} ({wheel.name}): License-File {lic} is not in the wheel")
    if "Typing :: Typed" in (md.get_all("Classifier") or []):
        packages = {n.split("/")[0] for n in names if "/" in n and not n.startswith(info)}
        for pkg in sorted(packages):
            if f"{pkg}/py.typed" not in names:
                problems.append(f"{label} ({wheel.name}): says 'Typing :: Typed' but {pkg}/py.typed is not in the wheel (package-data)")
    if canonicalize_name(name) == CORE:
        if not re.search(r"^\[console_scripts\]\s*\nomnicore\s*=", entry_points, re.M):
            problems.append(f"{label} ({wheel.name}): no console script 'omnicore' (fix {where} [project.scripts])")
    elif not re.search(r"^\[omnicore\]\s*\n\S", entry_points, re.M):
        problems.append(f"{label} ({wheel.name}): no entry point of the group 'omnicore' (fix {where} [project.entry-points.omnicore])")
    with tarfile.open(sdist) as tf:
        members = {m.split("/", 1)[1] for m in tf.getnames() if "/" in m}
    readme = _readme_file(meta)
    for need in ["PKG-INFO", "pyproject.toml", readme, *(md.get_all("License-File") or [])]:
        if need and need not in members:
            problems.append(f"{label} ({sdist.name}): {need} is not in the sdist")
    return problems


def _readme_file(meta: dict) -> str:
    readme = meta.get("readme", "")
    return readme.get("file", "") if isinstance(readme, dict) else readme


def check_metadata(md: email.message.Message, name: str, version: str, project: Path, meta: dict) -> list[str]:
    """What the wheel's ``METADATA`` lacks or gets wrong, one phrase each (see the module docstring)."""
    out = []
    if canonicalize_name(md.get("Name", "")) != canonicalize_name(name):
        out.append(f"Name is {md.get('Name')!r}, not {name!r}")
    if md.get("Version") != version:
        out.append(f"Version is {md.get('Version')!r}, not {version!r}")
    if canonicalize_name(name) == CORE and md.get("Version") != core_versions()[0]:
        out.append(
            f"Version {md.get('Version')!r} differs from omnicore.__version__ {core_versions()[0]!r} (what omnicore --version prints)"
        )
    if not (md.get("License-Expression") or md.get("License")):
        out.append("no License-Expression (set license = 'SPDX expression')")
    if not md.get("License-File"):
        out.append("no License-File (set license-files)")
    if not (md.get("Summary") or "").strip():
        out.append("no Summary (set description)")
    body = (md.get_payload() or "").strip()
    readme = _readme_file(meta)
    if not body:
        out.append("no long description (set readme)")
    elif readme and body != (project / readme).read_text(encoding="utf-8").strip():
        out.append(f"the long description is not {readme}")
    if md.get("Description-Content-Type", "").split(";")[0] != "text/markdown":
        out.append(f"Description-Content-Type is {md.get('Description-Content-Type')!r}, not 'text/markdown'")
    classifiers = md.get_all("Classifier") or []
    if not classifiers:
        out.append("no Classifier (set classifiers)")
    for py in PYTHONS:
        if f"Programming Language :: Python :: {py}" not in classifiers:
            out.append(f"no Classifier 'Programming Language :: Python :: {py}'")
    requires_python = md.get("Requires-Python")
    if not requires_python:
        out.append("no Requires-Python (set requires-python)")
    else:
        outside = [py for py in PYTHONS if not SpecifierSet(requires_python).contains(py)]
        if outside:
            out.append(f"Requires-Python {requires_python!r} excludes Python {', '.join(outside)}")
    if canonicalize_name(name) != CORE:
        out += _check_api_range(md)
    return out


def _check_api_range(md: email.message.Message) -> list[str]:
    """A plugin's core API range: as the keyword the registry reads, and as the dependency on the core."""
    from omnicore.registry.policy import api_range

    out = []
    declared = api_range(SimpleNamespace(metadata=md))
    if not declared:
        out.append(f"no keyword 'omnicore-api {API_RANGE}' (the core API range the registry reads)")
    elif SpecifierSet(declared) != API_RANGE:
        out.append(f"keyword omnicore-api {declared!r}, not {str(API_RANGE)!r} (core API 2.x)")
    cores = [r for r in map(Requirement, md.get_all("Requires-Dist") or []) if canonicalize_name(r.name) == CORE and not r.marker]
    if not cores:
        out.append(f"no dependency 'omnicore{CORE_RANGE}' (the core API range as a dependency)")
    elif any(r.specifier != CORE_RANGE for r in cores):
        out.append(
            f"depends on {', '.join(str(r) for r in cores)}, not omnicore{CORE_RANGE} (the core 0.1.x provides API {API_RANGE}; CHANGELOG.md)"
        )
    return out


def check_mapping() -> list[str]:
    """The tree's core must provide the API range the plugins declare, in the releases they depend on."""
    version, api = core_versions()
    out = []
    if not API_RANGE.contains(api, prereleases=True):
        out.append(f"omnicore.CORE_API_VERSION {api!r} is outside {API_RANGE}: update API_RANGE here and every plugin's keywords")
    if not CORE_RANGE.contains(version, prereleases=True):
        out.append(f"omnicore.__version__ {version!r} is outside {CORE_RANGE}: update CORE_RANGE here and every plugin's dependency")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dist", type=Path, help="the folder holding the wheels and sdists")
    p.add_argument("projects", type=Path, nargs="+", metavar="PROJECT", help="a folder with a pyproject.toml")
    args = p.parse_args(argv)
    problems = check_mapping()
    for project in args.projects:
        problems += check_project(args.dist, project.resolve())
    for line in problems:
        print(f"check_dist: {line}", file=sys.stderr)
    if problems:
        print(f"check_dist: {len(problems)} problem(s) in {args.dist}", file=sys.stderr)
        return 1
    print(f"check_dist: {len(args.projects)} distributions, a wheel and an sdist each, metadata complete")
    return 0


if __name__ == "__main__":
    sys.exit(main())
