"""Check omnicore's import graph: no cycles between its modules and no lower layer importing a higher one.

    python scripts/check_imports.py            # prints the layers and the graph summary; exit 1 on a problem
    python scripts/check_imports.py --edges    # also prints every module -> module edge

Every ``import`` and ``from ... import`` statement of every module under ``omnicore/`` counts, at
module level or inside a function (a lazy import is still a dependency), except those under
``if TYPE_CHECKING:``. The layers, lowest first (a module may import its own layer and any lower one):

==  ==========================================================================================
0   ``omnicore`` (the package), ``components``, ``hookspecs``, ``builtins``: contracts, torch-free
1   ``registry``, ``config``: discovery, resolving, the run config (torch-free)
2   ``kernels``: built-in kernels and the varlen helpers
3   ``data``: JSONL, media, chat template, packing, collate
4   ``model``: OmniModel, the built-in foundation, assembly, weights
5   ``parallel``: mesh, state, strategies, ``parallelize``, ``plan``
6   ``checkpoint``: DCP save and resume, export
7   ``eval``: held-out loss, scoring, generation, sample grids (never imports ``train``)
8   ``train``: the training recipe (asks ``eval``'s validator and sampler)
9   ``api``, ``testing``: the surfaces for plugin authors (nothing in the core imports them)
10  ``cli``, ``__main__``
==  ==========================================================================================

Pure standard library (``ast``), so it runs anywhere; ``tests/test_layers.py`` runs it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "omnicore"

LAYERS: list[tuple[str, ...]] = [
    ("omnicore", "omnicore.components", "omnicore.hookspecs", "omnicore.builtins"),
    ("omnicore.registry", "omnicore.config"),
    ("omnicore.kernels",),
    ("omnicore.data",),
    ("omnicore.model",),
    ("omnicore.parallel",),
    ("omnicore.checkpoint",),
    ("omnicore.eval",),
    ("omnicore.train",),
    ("omnicore.api", "omnicore.testing"),
    ("omnicore.cli", "omnicore.__main__"),
]
"""Module prefixes per layer, lowest first."""


def module_name(path: Path, root: Path = ROOT) -> str:
    """``omnicore/data/chat.py`` -> ``omnicore.data.chat``; a package's ``__init__`` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    """The layer of ``module``: that of its longest matching prefix in :data:`LAYERS`.

    Raises:
        KeyError: the module is in no layer (add it to :data:`LAYERS`).
    """
    best, found = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    if found is None:
        raise KeyError(f"{module} is in no layer of scripts/check_imports.py; add it to LAYERS")
    return found


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def imports_of(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The omnicore modules that the file at ``path`` (under ``root``) imports, resolved to the
    modules in ``known``."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_lines(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # "from pkg import module" depends on the module; "from module import name" on the module
            names = [n for n in subs if n in known] or [base]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != me:
                out.add(n)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``module -> modules it imports`` for every module of the package under ``root``."""
    files = sorted((root / PACKAGE).rglob("*.py"))
    known = {module_name(f, root) for f in files}
    return {module_name(f, root): imports_of(f, known, root) for f in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def upward(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs where the imported module sits in a higher layer."""
    out = []
    for a, deps in sorted(g.items()):
        for b in sorted(deps):
            # a package's __init__ importing its own submodules is not upward
            if b.startswith(a + "."):
                continue
            if layer_of(b) > layer_of(a):
                out.append((a, b))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="print every module -> module edge")
    args = ap.parse_args(argv)
    g = graph()
    if args.edges:
        for a, deps in sorted(g.items()):
            for b in sorted(deps):
                print(f"{a} -> {b}")
    for i, prefixes in enumerate(LAYERS):
        print(f"layer {i}: {', '.join(prefixes)}")
    cyc, up = cycles(g), upward(g)
    edges = sum(len(d) for d in g.values())
    print(f"{len(g)} modules, {edges} import edges, {len(cyc)} cycles, {len(up)} upward imports")
    for c in cyc:
        print("cycle: " + " <-> ".join(c))
    for a, b in up:
        print(f"upward: {a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})")
    return 1 if cyc or up else 0


if __name__ == "__main__":
    sys.exit(main())
