"""The plugin-facing API: first-party plugins, contrib packages and the template import from
omnicore only ``omnicore.api`` (and, in their tests, the testing kit ``omnicore.testing``).
Everything else in omnicore is internal."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {"omnicore.api"}
TESTING = {"omnicore.testing"}
PLUGIN_DIRS = sorted(p for p in [*(ROOT / "plugins").iterdir(), *(ROOT / "contrib").iterdir()] if (p / "pyproject.toml").is_file())
TEMPLATE = ROOT / "contrib" / "omnicore-plugin-template" / "template"
_JINJA_IMPORT = re.compile(r"^\s*(?:from\s+(omnicore[\w.]*)\s+import\s+([\w, ]+)|import\s+(omnicore[\w.]*))", re.M)


def omnicore_imports(source: str, filename: str) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` for every import of an ``omnicore`` module in ``source`` (any
    depth: lazy imports inside functions count)."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module and node.module.split(".")[0] == "omnicore":
            out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "omnicore"]
    return out


def violations(files: list[Path], allowed: set[str], root: Path = ROOT) -> list[str]:
    bad = []
    for f in files:
        for line, module, names in omnicore_imports(f.read_text(), str(f)):
            # "from omnicore import api" names the module omnicore.api itself
            mods = {f"omnicore.{n}" for n in names} if module == "omnicore" and set(names) & {"api", "testing"} else {module}
            for m in mods:
                if m not in allowed and not any(m.startswith(a + ".") for a in allowed & TESTING):
                    bad.append(f"{f.relative_to(root)}:{line}: imports {m}")
    return bad


def plugin_test_files() -> list[Path]:
    """Every .py file under the ``tests`` folder of every first-party plugin and contrib package."""
    return sorted(f for d in PLUGIN_DIRS for f in d.rglob("*.py") if "tests" in f.relative_to(d).parts)


def plugin_package_files() -> list[Path]:
    """Every .py file of every first-party plugin distribution, its tests excepted."""
    return sorted(
        f
        for d in PLUGIN_DIRS
        for f in d.rglob("*.py")
        if "tests" not in f.relative_to(d).parts and "template" not in f.relative_to(d).parts
    )


def test_there_are_plugins_to_check():
    names = {d.name for d in PLUGIN_DIRS}
    assert {
        "omnicore-audio-whisper",
        "omnicore-parallel-ulysses",
        "omnicore-parallel-comet",
        "omnicore-kernels-liger",
        "omnicore-parallel-offload",
    } <= names
    assert len(plugin_package_files()) >= 20


@pytest.mark.slow
def test_plugins_import_only_the_public_api():
    assert violations(plugin_package_files(), PUBLIC) == []


def test_plugin_tests_import_only_the_public_api_and_the_testing_kit():
    files = plugin_test_files()
    assert len(files) >= 20
    assert violations(files, PUBLIC | TESTING) == []


def test_the_typing_block_declares_every_public_name_from_its_home():
    """Type checkers read api.py's ``if TYPE_CHECKING:`` block (the lazy ``__getattr__`` is opaque
    to them): it must import exactly the public names, each from the module ``_EXPORTS`` names, as
    an explicit re-export (``X as X``)."""
    import omnicore.api as api

    tree = ast.parse((ROOT / "omnicore" / "api.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    declared = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name} must be re-exported as 'X as X'"
            declared[alias.name] = node.module
    assert declared == api._EXPORTS
    assert (ROOT / "omnicore" / "py.typed").is_file()


def test_every_testing_kit_name_resolves_to_its_home():
    import importlib

    import omnicore.testing as testing
    from omnicore.testing import contracts, fakes

    for name in testing.__all__:
        if name in testing._RUN_PATH:
            module, attr = testing._RUN_PATH[name]
            home = getattr(importlib.import_module(module), attr)
        else:
            home = getattr(contracts if name in testing._CONTRACTS else fakes, name)
        assert getattr(testing, name) is home, name
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        testing.nope  # noqa: B018


def test_template_imports_only_the_public_api_and_the_testing_kit():
    bad = []
    files = sorted(TEMPLATE.rglob("*.jinja"))
    assert len(files) >= 8
    for f in files:
        for m in _JINJA_IMPORT.finditer(f.read_text()):
            module = m.group(1) or m.group(3)
            names = [n.strip() for n in (m.group(2) or "").split(",")]
            mods = {f"omnicore.{n}" for n in names} if module == "omnicore" and set(names) & {"api", "testing"} else {module}
            for mod in mods:
                if mod not in PUBLIC | TESTING:
                    bad.append(f"{f.relative_to(ROOT)}: imports {mod}")
    assert bad == []


def test_the_check_catches_a_private_import(tmp_path):
    f = tmp_path / "strategy.py"
    f.write_text(
        "from omnicore.api import FSDP2\n\ndef build():\n    from omnicore.parallel.fsdp import FSDP2\n    import omnicore.data.chat\n"
    )
    assert [v.split(": ", 1)[1] for v in violations([f], PUBLIC, root=tmp_path)] == [
        "imports omnicore.parallel.fsdp",
        "imports omnicore.data.chat",
    ]
    g = tmp_path / "plugin.py"
    g.write_text("from omnicore.components import ComponentSpec\nfrom omnicore.hookspecs import hookimpl\nfrom omnicore import testing\n")
    assert [v.split(": ", 1)[1] for v in violations([g], PUBLIC, root=tmp_path)] == [
        "imports omnicore.components",
        "imports omnicore.hookspecs",
        "imports omnicore.testing",
    ]
    assert [v.split(": ", 1)[1] for v in violations([g], PUBLIC | TESTING, root=tmp_path)] == [
        "imports omnicore.components",
        "imports omnicore.hookspecs",
    ]
    found = [(line, m) for line, m, _ in omnicore_imports(f.read_text(), str(f))]
    assert found == [(1, "omnicore.api"), (4, "omnicore.parallel.fsdp"), (5, "omnicore.data.chat")]


def test_every_api_name_resolves_to_its_home_module():
    import importlib

    import omnicore.api as api

    for name in api.__all__:
        home = importlib.import_module(api._EXPORTS[name])
        assert getattr(api, name) is getattr(home, name), name
    with pytest.raises(AttributeError, match="omnicore.api has no 'nope'; the public names are: "):
        api.nope  # noqa: B018


@pytest.mark.cli
def test_importing_the_api_is_torch_free():
    code = "import sys, omnicore.api; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
