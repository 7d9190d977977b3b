"""The longest functions of a package, in lines: whole (``def`` to the last line) and body without
its docstring.

    python scripts/function_lengths.py [PATH=omnicore] [--top 10]

Pure standard library (``ast``). The team's goal: no function body in ``omnicore/`` over 60 lines.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def lengths(root: Path) -> list[tuple[int, int, str]]:
    """``(whole, body without docstring, "file:line name")`` for every function under ``root``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                whole = node.end_lineno - node.lineno + 1
                doc = 0
                first = node.body[0]
                if (
                    isinstance(first, ast.Expr)
                    and isinstance(getattr(first, "value", None), ast.Constant)
                    and isinstance(first.value.value, str)
                ):
                    doc = first.end_lineno - first.lineno + 1
                out.append((whole, whole - doc, f"{path}:{node.lineno} {node.name}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default="omnicore")
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args(argv)
    rows = lengths(Path(a.path))
    print(f"{len(rows)} functions; longest bodies (without docstring), whole function in brackets:")
    for whole, body, where in sorted(rows, key=lambda r: (-r[1], -r[0]))[: a.top]:
        print(f"  {body:4d} ({whole:4d})  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
