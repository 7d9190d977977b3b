"""The two test lanes: every test that starts processes carries a marker, so the quick lane skips it.

``bash scripts/test.sh --quick`` deselects the markers ``multiprocess``, ``cli`` and ``slow``
(registered in the root ``pyproject.toml``); ``bash scripts/test.sh`` runs everything. A test that
starts a process and is not marked would quietly slow the quick lane (each spawned torch process
costs seconds of start-up on a 2-core machine), so this module reads every test module's source
(stdlib ``ast`` only, no imports, no processes) and fails naming each unmarked test.

What counts as starting a process, by the dotted name a test reaches:
    ``multiprocess``: ``multiprocessing`` / ``torch.multiprocessing`` starters (``spawn``,
        ``start_processes``, ``Process``, ``Pool``, ...), ``omnicore.testing.distributed.run_distributed``,
        ``torch.distributed.run`` / ``launcher``, ``os.fork``, and ``"torchrun"`` or ``"torch.distributed.run"``
        as an element of a list (an argv) or as the first word of a string (a shell command).
    ``cli`` (or ``multiprocess``): ``subprocess`` starters (``run``, ``Popen``, ``check_output``, ...),
        ``os.system`` / ``os.popen`` / ``os.exec*`` / ``os.spawn*``, ``asyncio.create_subprocess_*``,
        ``venv.create`` / ``venv.EnvBuilder``, ``pty.spawn``.
A test reaches a name through its own body, the module-level functions, classes and constants it
uses (transitively), ``self.`` methods of its class, and the fixtures it takes or names in
``usefixtures`` (from its module or a ``conftest.py`` above it). A session-scoped fixture is not
followed: it runs once per session, not once per test (the digits data set is built that way).
A test is marked when it, its class, or its module (``pytestmark = ...``) carries the marker.
``slow`` is given by measurement (``--durations``), so it is not checked here.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MULTIPROCESS = "multiprocess"
CLI = "cli"

_MP_STARTERS = {"spawn", "start_processes", "Process", "Pool", "get_context", "ProcessContext", "SpawnContext"}
_LAUNCHERS = ("torchrun", "torch.distributed.run")
_SUBPROCESS_STARTERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}


def classify(dotted: str) -> str | None:
    """The marker that a reference to the fully qualified name ``dotted`` requires, or None.

    >>> classify("subprocess.run"), classify("torch.multiprocessing.spawn"), classify("subprocess.PIPE")
    ('cli', 'multiprocess', None)
    """
    parts = dotted.split(".")
    head, last = ".".join(parts[:-1]), parts[-1]
    if head in ("multiprocessing", "torch.multiprocessing") and last in _MP_STARTERS:
        return MULTIPROCESS
    if dotted == "omnicore.testing.distributed.run_distributed" or dotted == "concurrent.futures.ProcessPoolExecutor":
        return MULTIPROCESS
    if dotted.startswith(("torch.distributed.run", "torch.distributed.launcher", "torch.distributed.elastic")):
        return MULTIPROCESS
    if dotted in ("os.fork", "os.forkpty"):
        return MULTIPROCESS
    if head == "subprocess" and last in _SUBPROCESS_STARTERS:
        return CLI
    if head == "os" and (last in ("system", "popen", "posix_spawn", "posix_spawnp") or last.startswith(("exec", "spawn"))):
        return CLI
    if head == "asyncio" and last.startswith("create_subprocess"):
        return CLI
    if dotted in ("venv.create", "venv.EnvBuilder", "pty.spawn"):
        return CLI
    return None


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _imports_and_docstrings(tree: ast.Module) -> tuple[dict[str, str], set[int]]:
    """One walk over the module: local name -> fully qualified name from every import (any depth),
    and the ids of every docstring node (a docstring naming torchrun launches nothing)."""
    aliases: dict[str, str] = {}
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return aliases, docstrings


def _mark_names(expr: ast.AST) -> set[str]:
    """Marker names in a decorator or ``pytestmark`` value: ``pytest.mark.X``, ``mark.X``, ``pytest.mark.X(...)``,
    or a list/tuple of them. A mark nested in another mark's arguments (``pytest.param(marks=...)``) does not count."""
    if isinstance(expr, ast.List | ast.Tuple):
        return set().union(*(_mark_names(e) for e in expr.elts)) if expr.elts else set()
    if isinstance(expr, ast.Call):
        expr = expr.func
    name = _dotted(expr)
    if name and (name.startswith("pytest.mark.") or name.startswith("mark.")):
        return {name.rsplit(".", 1)[1]}
    return set()


def _is_fixture(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[bool, bool]:
    """(is a pytest fixture, is session-scoped)."""
    for d in fn.decorator_list:
        call = d if isinstance(d, ast.Call) else None
        name = _dotted(call.func if call else d)
        if name in ("pytest.fixture", "fixture"):
            session = any(
                k.arg == "scope" and isinstance(k.value, ast.Constant) and k.value.value in ("session", "package")
                for k in (call.keywords if call else [])
            )
            return True, session
    return False, False


@dataclass
class _Node:
    """One module-level function, class, constant, fixture or test: what it reaches directly."""

    label: str
    signals: dict[str, str] = field(default_factory=dict)  # MULTIPROCESS / CLI / _LAUNCHER -> first reason
    names: set[str] = field(default_factory=set)  # names it loads (module-level or imported ones matter)
    self_attrs: set[str] = field(default_factory=set)  # self.X it uses
    fixtures: set[str] = field(default_factory=set)  # fixture names it takes or names in usefixtures
    marks: set[str] = field(default_factory=set)
    constant: bool = False  # a module-level value (not a function or class called with arguments)


_LAUNCHER = "launcher"  # a torchrun argv: multiprocess where the test runs it as written, at least cli in a helper


def _merge(label: str, parts: list[_Node]) -> _Node:
    """One node reaching everything that ``parts`` reach (a helper class: all its methods)."""
    node = _Node(label)
    for part in parts:
        for kind, why in part.signals.items():
            node.signals.setdefault(kind, why)
        node.names |= part.names
        node.self_attrs |= part.self_attrs
    return node


def _scan(body: ast.AST, aliases: dict[str, str], label: str, docstrings: set[int]) -> _Node:
    node = _Node(label)
    for n in ast.walk(body):
        if isinstance(n, ast.Attribute | ast.Name) and isinstance(n.ctx, ast.Load):
            name = _dotted(n)
            if name:
                root, _, rest = name.partition(".")
                if root in aliases:
                    full = aliases[root] + ("." + rest if rest else "")
                    kind = classify(full)
                    if kind:
                        node.signals.setdefault(kind, f"{full}, line {n.lineno}")
            if isinstance(n, ast.Name):
                node.names.add(n.id)
            elif isinstance(n.value, ast.Name) and n.value.id == "self":
                node.self_attrs.add(n.attr)
        elif isinstance(n, ast.List):  # an argv: [..., "torchrun", ...] or [..., "-m", "torch.distributed.run", ...]
            for e in n.elts:
                if isinstance(e, ast.Constant) and e.value in _LAUNCHERS:
                    node.signals.setdefault(_LAUNCHER, f"{e.value!r} in an argv, line {e.lineno}")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
            if n.value.startswith(tuple(f"{launcher} " for launcher in _LAUNCHERS)):  # a shell command line
                node.signals.setdefault(_LAUNCHER, f"{n.value.split()[0]!r} command line, line {n.lineno}")
    if isinstance(body, ast.FunctionDef | ast.AsyncFunctionDef):  # its own arguments, not a nested function's
        node.fixtures.update(a.arg for a in body.args.args + body.args.kwonlyargs)
        node.fixtures -= {"self", "request"}
        for d in body.decorator_list:
            if isinstance(d, ast.Call) and _dotted(d.func) in ("pytest.mark.usefixtures", "mark.usefixtures"):
                node.fixtures.update(a.value for a in d.args if isinstance(a, ast.Constant))
        node.marks = set().union(*(_mark_names(d) for d in body.decorator_list)) if body.decorator_list else set()
    return node


@dataclass
class _Module:
    aliases: dict[str, str]  # local name -> imported dotted name
    defs: dict[str, _Node]  # module-level functions, classes, constants
    fixtures: dict[str, _Node]  # function-, class- and module-scoped fixtures (session ones left out, see above)
    tests: list[tuple[_Node, set[str], dict[str, _Node]]]  # (test, marks of its class, its class's methods)
    module_marks: set[str]


@functools.cache  # conftest.py and imported test modules are read by many modules
def _parse(source: str, name: str) -> _Module:
    tree = ast.parse(source, name)
    aliases, docs = _imports_and_docstrings(tree)
    defs: dict[str, _Node] = {}
    fixtures: dict[str, _Node] = {}
    tests: list[tuple[_Node, set[str], dict[str, _Node]]] = []
    module_marks: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            node = _scan(stmt, aliases, stmt.name, docs)
            is_fixture, session = _is_fixture(stmt)
            if is_fixture:
                if not session:
                    fixtures[stmt.name] = node
            elif stmt.name.startswith("test"):
                tests.append((node, set(), {}))
            else:
                defs[stmt.name] = node
        elif isinstance(stmt, ast.ClassDef):
            class_marks = set().union(*(_mark_names(d) for d in stmt.decorator_list)) if stmt.decorator_list else set()
            methods: dict[str, _Node] = {}
            class_tests: list[_Node] = []
            parts = [_scan(d, aliases, stmt.name, docs) for d in stmt.decorator_list + stmt.bases + stmt.keywords]
            for item in stmt.body:
                if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in item.targets):
                    class_marks |= _mark_names(item.value)
                if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    parts.append(_scan(item, aliases, stmt.name, docs))
                else:
                    node = _scan(item, aliases, f"{stmt.name}.{item.name}", docs)
                    parts.append(node)
                    is_fixture, session = _is_fixture(item)
                    if is_fixture:
                        if not session:
                            fixtures[item.name] = node
                    elif item.name.startswith("test") and (stmt.name.startswith("Test") or stmt.name.endswith("Contract")):
                        class_tests.append(node)
                    else:
                        methods[item.name] = node
            tests.extend((t, class_marks, methods) for t in class_tests)
            defs[stmt.name] = _merge(stmt.name, parts)  # a helper class used by name: everything in it counts
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if "pytestmark" in names and stmt.value is not None:
                module_marks |= _mark_names(stmt.value)
            elif stmt.value is not None:
                for n in names:
                    defs[n] = _scan(stmt.value, aliases, n, docs)
                    defs[n].constant = True
    return _Module(aliases, defs, fixtures, tests, module_marks)


def reached(
    source: str, name: str = "<test module>", conftests: tuple[str, ...] = (), siblings: dict[str, str] | None = None
) -> dict[str, tuple[dict[str, str], set[str]]]:
    """For each test in ``source`` (``test_x`` or ``TestClass.test_x``): the markers it needs, each with
    the first reason found (``{"cli": "subprocess.run, line 12"}``), and the markers it carries (its
    own, its class's and the module's).

    Names imported from a module in ``siblings`` (module name -> source: the other test modules and
    helpers that the test module imports by plain name, such as ``from test_train import _omnicore``)
    are followed into that module. Fixtures resolve from the module (its own, then imported ones),
    then from each ``conftests`` source in order (nearest first). A torchrun argv needs
    ``multiprocess`` where the test or a fixture holds it as written; inside a helper function, whose
    arguments may choose one process instead, it needs at least ``cli``, and the test's author adds
    ``multiprocess`` where it runs more than one.
    """
    siblings = siblings or {}
    parsed: dict[str, _Module] = {}

    def load(mod: str) -> _Module | None:
        if mod not in parsed and mod in siblings:
            parsed[mod] = _parse(siblings[mod], f"{mod}.py")
        return parsed.get(mod)

    module = _parse(source, name)
    scopes = [module] + [_parse(c, "conftest.py") for c in conftests]

    def imported(owner: _Module, local: str) -> tuple[_Module, str] | None:
        mod, _, attr = owner.aliases.get(local, "").rpartition(".")
        other = load(mod) if mod else None
        return (other, attr) if other is not None else None

    def fixture(owner: _Module, f: str) -> tuple[_Node, _Module] | None:
        for m in [owner, *scopes]:
            if f in m.fixtures:
                return m.fixtures[f], m
            hit = imported(m, f)
            if hit and hit[1] in hit[0].fixtures:
                return hit[0].fixtures[hit[1]], hit[0]
        return None

    out: dict[str, tuple[dict[str, str], set[str]]] = {}
    for test, class_marks, methods in module.tests:
        need: dict[str, str] = {}
        seen: set[tuple[int, bool]] = set()
        stack: list[tuple[_Node, _Module, dict[str, _Node], bool]] = [(test, module, methods, True)]
        while stack:
            node, owner, meths, direct = stack.pop()
            if (id(node), direct) in seen:
                continue
            seen.add((id(node), direct))
            for kind, why in node.signals.items():
                if kind == _LAUNCHER:
                    kind = MULTIPROCESS if direct else CLI
                need.setdefault(kind, why)
            for n in node.names:
                if n in owner.defs:
                    stack.append((owner.defs[n], owner, {}, direct and owner.defs[n].constant))
                elif (hit := imported(owner, n)) and hit[1] in hit[0].defs:
                    target = hit[0].defs[hit[1]]
                    stack.append((target, hit[0], {}, direct and target.constant))
            stack += [(meths[a], owner, meths, False) for a in node.self_attrs if a in meths]
            for f in node.fixtures:
                if found := fixture(owner, f):
                    stack.append((found[0], found[1], {}, True))
        out[test.label] = (need, test.marks | class_marks | module.module_marks)
    return out


def unmarked(
    source: str, name: str = "<test module>", conftests: tuple[str, ...] = (), siblings: dict[str, str] | None = None
) -> list[str]:
    """The tests in ``source`` that start processes without the marker that says so, one line each:
    ``"name::test_x starts a subprocess (subprocess.run, line 12): mark it cli"``. A test that starts
    a process group needs ``multiprocess``; one that only runs a subprocess needs ``cli`` (or
    ``multiprocess``). See :func:`reached` for how a test reaches a process start."""
    problems: list[str] = []
    for label, (need, marks) in reached(source, name, conftests, siblings).items():
        if MULTIPROCESS in need and MULTIPROCESS not in marks:
            problems.append(f"{name}::{label} starts processes ({need[MULTIPROCESS]}): mark it {MULTIPROCESS}")
        elif CLI in need and not marks & {CLI, MULTIPROCESS}:
            problems.append(f"{name}::{label} starts a subprocess ({need[CLI]}): mark it {CLI}")
    return problems


def _test_modules() -> list[Path]:
    """Every collected test module: tests/, and each plugin's and contrib package's tests/."""
    found = sorted(ROOT.glob("tests/**/test_*.py")) + sorted(ROOT.glob("plugins/*/tests/**/test_*.py"))
    return found + sorted(ROOT.glob("contrib/*/tests/**/test_*.py"))


def _conftests(path: Path) -> tuple[str, ...]:
    """The sources of the ``conftest.py`` files that pytest applies to ``path``, nearest first."""
    out = []
    for folder in path.parents:
        if (folder / "conftest.py").is_file():
            out.append((folder / "conftest.py").read_text())
        if folder == ROOT:
            break
    return tuple(out)


@functools.cache
def _siblings(folder: Path) -> dict[str, str]:
    """Module name -> source of what a test module in ``folder`` imports by plain name: the modules
    beside it (pytest puts its folder on ``sys.path``), then tests/ (``pythonpath`` in pyproject.toml)."""
    out = {p.stem: p.read_text() for p in sorted((ROOT / "tests").glob("*.py"))}
    out.update({p.stem: p.read_text() for p in sorted(folder.glob("*.py"))})
    return out


def test_every_process_starting_test_is_marked():
    """No test module in tests/, plugins/ or contrib/ starts a process from an unmarked test."""
    modules = _test_modules()
    assert len(modules) > 50, f"found only {len(modules)} test modules under {ROOT}"
    problems = [
        p for path in modules for p in unmarked(path.read_text(), str(path.relative_to(ROOT)), _conftests(path), _siblings(path.parent))
    ]
    assert not problems, "tests that start processes need a marker (or `pytestmark = ...` for the whole module):\n" + "\n".join(problems)


def test_contract_suites_mark_their_process_tests():
    """The contract suites of omnicore.testing (classes named ``*Contract``, whose tests every plugin
    inherits) mark their process-starting tests too, and the marker is registered for a plugin's
    own suite by omnicore's pytest plugin."""
    source = (ROOT / "omnicore" / "testing" / "contracts.py").read_text()
    got = reached(source, "omnicore/testing/contracts.py")
    hook = got["ComponentContract.test_hook_module_imports_without_torch"]
    assert CLI in hook[0] and CLI in hook[1], hook
    assert unmarked(source, "omnicore/testing/contracts.py") == []
    assert 'addinivalue_line("markers", "cli:' in (ROOT / "omnicore" / "testing" / "pytest_plugin.py").read_text()


def test_markers_are_registered_and_strict():
    """The three lane markers are registered in pyproject.toml and unknown markers are errors."""
    import tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.split(":")[0].strip() for line in options["markers"]}
    assert {"multiprocess", "cli", "slow"} <= registered, registered
    assert "--strict-markers" in options["addopts"].split()


def test_quick_lane_deselects_the_three_markers():
    """scripts/test.sh --quick passes a -m expression that leaves out each lane marker."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "--quick" in script
    for marker in ("multiprocess", "cli", "slow"):
        assert f"not {marker}" in script, f"test.sh --quick does not deselect {marker}"


# -- the checker itself, on small sources -----------------------------------------------------

SPAWNING = """
import subprocess
import sys
import pytest
from omnicore.testing.distributed import run_distributed

def _omnicore(*args):
    return subprocess.run([sys.executable, "-m", "omnicore", *args], capture_output=True)

def _step():
    return 1

def test_pure():
    assert _step() == 1

def test_cli_help():
    assert _omnicore("--help").returncode == 0

def test_two_ranks():
    assert run_distributed(_step, 2) == [1, 1]

class TestGroup:
    def _go(self):
        return _omnicore("plugins")

    def test_method(self):
        assert self._go().returncode == 0
"""


def test_checker_names_each_unmarked_test_and_why():
    """An unmarked source: exactly the three process-starting tests are named, each with its marker."""
    problems = unmarked(SPAWNING, "m.py")
    assert problems == [
        "m.py::test_cli_help starts a subprocess (subprocess.run, line 8): mark it cli",
        "m.py::test_two_ranks starts processes (omnicore.testing.distributed.run_distributed, line 20): mark it multiprocess",
        "m.py::TestGroup.test_method starts a subprocess (subprocess.run, line 8): mark it cli",
    ]


def test_checker_accepts_module_and_per_test_marks():
    """Marks at module level, on the test, or on its class satisfy the checker; a wrong marker does not."""
    assert unmarked("pytestmark = [pytest.mark.cli, pytest.mark.multiprocess]\n" + SPAWNING) == []
    marked = (
        SPAWNING.replace("def test_cli_help", "@pytest.mark.cli\ndef test_cli_help")
        .replace("def test_two_ranks", "@pytest.mark.multiprocess\ndef test_two_ranks")
        .replace("class TestGroup", "@pytest.mark.cli\nclass TestGroup")
    )
    assert unmarked(marked) == []
    # cli does not cover a spawned process group; multiprocess does cover a subprocess
    wrong = marked.replace("@pytest.mark.multiprocess\ndef test_two_ranks", "@pytest.mark.cli\ndef test_two_ranks")
    assert unmarked(wrong, "m.py") == [
        "m.py::test_two_ranks starts processes (omnicore.testing.distributed.run_distributed, line 22): mark it multiprocess"
    ]
    assert unmarked("pytestmark = pytest.mark.multiprocess\n" + SPAWNING) == []
    # a mark inside parametrize's arguments marks only some cases, not the test
    param = SPAWNING.replace(
        "def test_cli_help():", "@pytest.mark.parametrize('a', [pytest.param(1, marks=pytest.mark.cli)])\ndef test_cli_help(a):"
    )
    assert any("test_cli_help" in p for p in unmarked(param))


def test_checker_follows_aliases_fixtures_and_torchrun_strings():
    """Import aliases, function-scoped fixtures (here or in a conftest) and a torchrun argv are found;
    session fixtures, docstrings and non-starting names (subprocess.PIPE) are not."""
    src = '''
import torch.multiprocessing as mp
from subprocess import check_output as co
import subprocess
import pytest

@pytest.fixture
def server():
    return co(["echo"])

@pytest.fixture(scope="session")
def data():
    return subprocess.run(["build"])

def test_alias():
    mp.start_processes(print, nprocs=2)

def test_fixture(server):
    pass

def test_session(data):
    """Runs torchrun? No: this docstring names it only."""
    assert subprocess.PIPE

def test_argv(tmp_path):
    cmd = ["torchrun", "--nproc-per-node", "2"]

def test_conftest_fixture(remote):
    pass
'''
    conftest = "import subprocess\nimport pytest\n@pytest.fixture\ndef remote():\n    yield subprocess.Popen(['x'])\n"
    got = [p.split(" (")[0] for p in unmarked(src, "m.py", (conftest,))]
    assert got == [
        "m.py::test_alias starts processes",
        "m.py::test_fixture starts a subprocess",
        "m.py::test_argv starts processes",
        "m.py::test_conftest_fixture starts a subprocess",
    ]


@pytest.mark.parametrize(
    ("dotted", "want"),
    [
        ("subprocess.Popen", CLI),
        ("subprocess.CompletedProcess", None),
        ("os.system", CLI),
        ("os.execv", CLI),
        ("os.path.join", None),
        ("venv.create", CLI),
        ("multiprocessing.Process", MULTIPROCESS),
        ("torch.multiprocessing.spawn", MULTIPROCESS),
        ("torch.distributed.run.main", MULTIPROCESS),
        ("torch.distributed.all_reduce", None),
        ("omnicore.testing.distributed.max_rel_diff", None),
    ],
)
def test_classify(dotted, want):
    """Each process-starting name maps to its marker; look-alikes that start nothing map to None."""
    assert classify(dotted) == want
