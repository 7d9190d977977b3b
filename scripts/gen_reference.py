"""Generate the reference parts of the documentation from the code, and check that they are current.

    python scripts/gen_reference.py            # rewrite PLUGINS.md's generated regions and docs/reference/config.md
    python scripts/gen_reference.py --check    # exit 1 and print a unified diff when either is stale

What is generated, and from what:

* PLUGINS.md, between ``<!-- BEGIN GENERATED: NAME -->`` and ``<!-- END GENERATED: NAME -->``
  (the prose around the regions is written by hand and kept as it is):

  - ``hooks``: every hook spec of ``omnicore/hookspecs.py`` (a function decorated with
    ``@hookspec``): its signature, the kind it registers (``HOOK_FOR_KIND``) and its docstring;
  - ``contracts``: every ``Protocol`` and dataclass of ``omnicore/components.py``: the class
    docstring, then every member with its signature and docstring (a dataclass's fields in
    constructor order, each with the text of its ``Attributes:`` entry);
  - ``api``: every name of ``omnicore.api.__all__``, grouped by the topics of the ``api`` module
    docstring (``* **Topic**: :func:`name`, ...``), each with the first sentence of its docstring in
    its home module.

* ``docs/reference/config.md``, whole: every section and field of the run config (the pydantic
  models of ``omnicore/config.py``): name, type with its bounds, default and description; nested
  models as sub-sections, whether unknown keys are refused, and the old (removed or moved) keys.

The Python sources of the PLUGINS.md regions are read with :mod:`ast`, not imported, so the script
runs in a second and needs no torch; the config page imports ``omnicore/config.py`` (pydantic only).

A hook, contract member, dataclass field, public name or config field without its docstring (or
``description``) is an error, printed as ``FILE:LINE: NAME has no docstring`` (exit status 2, after
writing the rest; the entry stays empty): the reference can only be as complete as the
docstrings. ``tests/test_reference.py`` runs the check on the repository and shows that adding a
contract member without regenerating fails it.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
import hashlib
import importlib.util
import inspect
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnicore.registry.options import is_model, type_name  # one spelling of types with `omnicore plugins --options`

ROOT = Path(__file__).resolve().parents[1]
REGIONS = ("hooks", "spec", "contracts", "api")
BEGIN = "<!-- BEGIN GENERATED: {} -->"
END = "<!-- END GENERATED: {} -->"
COMMAND = "python scripts/gen_reference.py"


class SourceError(Exception):
    """The sources cannot be turned into a complete reference; ``problems`` holds one
    ``FILE:LINE: message`` line each (all of them, not only the first)."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Sources:
    """Where the generator reads and writes. Every path defaults to its place under ``root``; a test
    points one of them at a modified copy (``Sources(components=tmp / "components.py", plugins_md=...)``).

    Modules named in ``omnicore.api`` are looked up as ``root/omnicore/...``, except
    ``omnicore.components`` and ``omnicore.hookspecs``, which are read from ``components`` and
    ``hookspecs``.
    """

    root: Path = ROOT
    hookspecs: Path | None = None
    components: Path | None = None
    api: Path | None = None
    config: Path | None = None
    plugins_md: Path | None = None
    config_md: Path | None = None

    def path(self, name: str) -> Path:
        """The path of source or output ``name`` (a field name): the given one, else its default."""
        given = getattr(self, name)
        if given is not None:
            return Path(given)
        defaults = {
            "hookspecs": "omnicore/hookspecs.py",
            "components": "omnicore/components.py",
            "api": "omnicore/api.py",
            "config": "omnicore/config.py",
            "plugins_md": "PLUGINS.md",
            "config_md": "docs/reference/config.md",
        }
        return Path(self.root) / defaults[name]

    def shown(self, path: Path) -> str:
        """``path`` as messages show it: relative to ``root`` when under it."""
        try:
            return Path(path).resolve().relative_to(Path(self.root).resolve()).as_posix()
        except ValueError:
            return str(path)

    def module_file(self, module: str) -> Path:
        """The source file of the omnicore module ``module`` (``omnicore.data.media``).

        Raises:
            FileNotFoundError: no such module under ``root``.
        """
        if module == "omnicore.components":
            return self.path("components")
        if module == "omnicore.hookspecs":
            return self.path("hookspecs")
        base = Path(self.root).joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"module {module} has no source file under {self.root}")


# ---- Docstrings to Markdown ------------------------------------------------------------------

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|obj|exc|const):`(~?)([^`]+)`")
_GOOGLE_SECTIONS = ("Args", "Arguments", "Parameters", "Returns", "Yields", "Raises", "Attributes", "Note", "Notes", "Example", "Examples")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to ``-``."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return "#" + text.replace(" ", "-")


def inline(text: str, links: dict[str, str]) -> str:
    """reST inline markup to Markdown: ``literal`` and roles become code spans; a role naming a
    section of the page (``links``: name -> anchor, e.g. ``Processor``) becomes a link to it."""

    def role(m: re.Match[str]) -> str:
        tilde, target = m.group(1), m.group(2).strip()
        shown = target.rsplit(".", 1)[-1] if tilde else target
        parts = target.split(".")
        for i in range(len(parts)):  # omnicore.api.Encoder, Encoder, Processor.num_tokens
            if parts[i] in links:
                name = ".".join(parts[i:])
                return f"[`{name}`]({links[parts[i]]})"
        return f"`{shown}`"

    text = _ROLE.sub(role, text)
    return re.sub(r"``(.+?)``", lambda m: f"`{m.group(1)}`", text, flags=re.S)


def _blocks(lines: list[str]) -> list[list[str]]:
    """Split lines into blocks separated by blank lines; an indented block stays one block."""
    out: list[list[str]] = []
    cur: list[str] = []
    for line in lines:
        if line.strip():
            cur.append(line.rstrip())
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _google_items(body: list[str]) -> list[tuple[str, str]]:
    """The ``name: text`` items of a Google-style section body (already dedented to column 0)."""
    items: list[tuple[str, list[str]]] = []
    for line in body:
        m = re.match(r"^(\*{0,2}\w[\w.]*)(?: \(([^)]*)\))?:\s*(.*)$", line)
        if _indent(line) == 0 and m:
            items.append((m.group(1), [m.group(3)]))
        elif items:
            items[-1][1].append(line.strip())
        else:
            items.append(("", [line.strip()]))
    return [(name, " ".join(x for x in text if x)) for name, text in items]


def _simple_table(block: list[str], links: dict[str, str]) -> list[str] | None:
    """An reST simple table (``===  ===`` borders) as a Markdown table, or None if ``block`` is not one."""
    border = re.compile(r"^=+( +=+)+$")
    if not border.match(block[0]) or sum(bool(border.match(x)) for x in block) < 2:
        return None
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", block[0])]
    rows: list[list[str]] = []
    header: list[str] | None = None
    for line in block[1:]:
        if border.match(line):
            if header is None and rows:
                header, rows = rows[0], []
            continue
        cells = [line[a : (spans[i + 1][0] if i + 1 < len(spans) else len(line))].strip() for i, (a, _) in enumerate(spans)]
        if rows and not cells[0]:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    header = header or [""] * len(spans)
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(spans)]
    out += ["| " + " | ".join(_cell(inline(c, links)) for c in row) + " |" for row in rows]
    return out


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell: one line, ``|`` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def to_markdown(doc: str, links: dict[str, str]) -> list[str]:
    """A docstring (already cleaned with :func:`inspect.cleandoc`) as Markdown lines.

    Handles what omnicore's docstrings use: paragraphs, ``*`` lists, ``::`` literal blocks,
    definition lists (a term line followed by an indented body), simple tables and the Google
    sections (``Args:``, ``Returns:``, ``Raises:``, ``Attributes:``, ...).
    """
    out: list[str] = []
    literal_next = False
    for block in _blocks(doc.splitlines()):
        base = min(_indent(x) for x in block)
        block = [x[base:] for x in block]
        if literal_next or (base > 0 and not out):
            out += ["    " + x for x in block] + [""]
            literal_next = False
            continue
        if block[-1].endswith("::"):
            literal_next = True
            block = block[:-1] + [block[-1][:-1]]
            if block[-1].strip() == ":":
                block = block[:-1]
            if not block:
                continue
        table = _simple_table(block, links)
        if table is not None:
            out += table + [""]
            continue
        head = re.match(r"^(\w+):\s*$", block[0])
        if head and head.group(1) in _GOOGLE_SECTIONS and len(block) > 1:
            body = [x[min(_indent(y) for y in block[1:]) :] for x in block[1:]]
            if head.group(1) in ("Returns", "Yields", "Note", "Notes"):
                out += [f"{head.group(1)}: " + inline(" ".join(x.strip() for x in body), links), ""]
            else:
                out += [f"{head.group(1)}:", ""]
                out += [f"- `{n}`: {inline(t, links)}" if n else f"- {inline(t, links)}" for n, t in _google_items(body)] + [""]
            continue
        if len(block) > 1 and _indent(block[0]) == 0 and _indent(block[1]) > 0 and not block[0].lstrip().startswith(("* ", "- ")):
            out += [f"- {inline(term, links)}: {inline(text, links)}" for term, text in _definitions(block)] + [""]
            continue
        out += [inline("\n".join(block), links)] + [""]
    while out and not out[-1]:
        out.pop()
    return "\n".join(out).splitlines()


def _definitions(block: list[str]) -> list[tuple[str, str]]:
    """The ``(term, body)`` pairs of an reST definition list."""
    out: list[tuple[str, list[str]]] = []
    for line in block:
        if _indent(line) == 0:
            out.append((line.strip(), []))
        else:
            out[-1][1].append(line.strip())
    return [(t, " ".join(b)) for t, b in out]


def first_paragraph(doc: str) -> str:
    """The first paragraph of a cleaned docstring, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def first_sentence(doc: str) -> str:
    """The first sentence of the docstring's first paragraph (up to a full stop followed by a space,
    outside parentheses and code; ``e.g.`` and ``i.e.`` do not end one)."""
    para = first_paragraph(doc)
    depth, code = 0, False
    for i, ch in enumerate(para):
        if ch == "`":
            code = not code
        elif not code and ch in "([":
            depth += 1
        elif not code and ch in ")]":
            depth = max(depth - 1, 0)
        elif ch == "." and not code and depth == 0 and (i + 1 == len(para) or para[i + 1] == " "):
            if not para[max(0, i - 3) : i + 1].endswith(("e.g.", "i.e.", "etc.", "vs.")):
                return para[: i + 1]
    return para


# ---- Reading Python sources with ast ---------------------------------------------------------


@dataclass
class Member:
    """One documented member of a class: ``display`` is the signature or ``name: type`` as shown."""

    name: str
    display: str
    doc: str | None
    line: int


def _parse(path: Path) -> ast.Module:
    """The syntax tree of ``path`` (parsed once per version of the file: the API table reads some
    modules for several names)."""
    path = Path(path)
    return _parse_text(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _parse_text(path: str, mtime_ns: int) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def _args(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop_self: bool) -> str:
    """The parameters of ``fn`` as written (annotations and defaults), ``self`` dropped."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    parts = []

    def one(arg: ast.arg, default: ast.expr | None, star: str = "") -> str:
        text = star + arg.arg + (f": {ast.unparse(arg.annotation)}" if arg.annotation is not None else "")
        if default is not None:
            text += f" = {ast.unparse(default)}" if arg.annotation is not None else f"={ast.unparse(default)}"
        return text

    for i, (arg, default) in enumerate(zip(positional, defaults)):
        if drop_self and i == 0 and arg.arg in ("self", "cls"):
            continue
        parts.append(one(arg, default))
        if a.posonlyargs and arg is a.posonlyargs[-1]:
            parts.append("/")
    if a.vararg is not None:
        parts.append(one(a.vararg, None, "*"))
    elif a.kwonlyargs:
        parts.append("*")
    parts += [one(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg is not None:
        parts.append(one(a.kwarg, None, "**"))
    return ", ".join(parts)


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, *, drop_self: bool = False) -> str:
    """``name(params) -> ret`` exactly as the source writes it (``self`` dropped for methods)."""
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    return f"{fn.name}({_args(fn, drop_self)}){ret}"


def _attr_doc(body: list[ast.stmt], i: int) -> str | None:
    """The string literal right after statement ``i`` (an attribute docstring), cleaned."""
    if i + 1 < len(body):
        nxt = body[i + 1]
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            return inspect.cleandoc(nxt.value.value)
    return None


def _decorator_names(node: ast.ClassDef | ast.FunctionDef) -> set[str]:
    names = set()
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        names.add(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return names


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any((b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")) == "Protocol" for b in cls.bases)


def class_members(cls: ast.ClassDef) -> list[Member]:
    """The public members declared in ``cls``'s body, in source order: annotated attributes
    (``name: type``), properties (``name: return type``) and methods (their signature)."""
    out = []
    for i, stmt in enumerate(cls.body):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and not stmt.target.id.startswith("_"):
            out.append(Member(stmt.target.id, f"{stmt.target.id}: {ast.unparse(stmt.annotation)}", _attr_doc(cls.body, i), stmt.lineno))
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and not stmt.name.startswith("_"):
            doc = ast.get_docstring(stmt)
            if "property" in _decorator_names(stmt):
                ret = ast.unparse(stmt.returns) if stmt.returns is not None else "Any"
                out.append(Member(stmt.name, f"{stmt.name}: {ret}", doc, stmt.lineno))
            else:
                out.append(Member(stmt.name, signature(stmt, drop_self=True), doc, stmt.lineno))
    return out


def _split_section(doc: str, title: str) -> tuple[str, list[str]]:
    """``(the docstring without its Google-style section title, that section's body lines dedented)``
    of a cleaned docstring; the body is empty when there is no such section."""
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == f"{title}:" and _indent(line) == 0:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() and _indent(lines[j]) == 0), len(lines))
            body = [x for x in lines[i + 1 : end] if x.strip()]
            base = min((_indent(x) for x in body), default=0)
            return "\n".join(lines[:i] + lines[end:]).strip(), [x[base:] for x in body]
    return doc.strip(), []


def _google_section(doc: str, title: str) -> dict[str, str]:
    """``name -> text`` of one Google-style section (``Attributes:``) of a cleaned docstring."""
    return dict(_google_items(_split_section(doc, title)[1]))


def _field_default(value: ast.expr | None) -> tuple[str | None, bool]:
    """``(default as written or None, init)`` of a dataclass field's right-hand side."""
    if value is None:
        return None, True
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "field":
        kw = {k.arg: k.value for k in value.keywords}
        init = not (isinstance(kw.get("init"), ast.Constant) and kw["init"].value is False)
        if "default" in kw:
            return ast.unparse(kw["default"]), init
        if "default_factory" in kw:
            factory = ast.unparse(kw["default_factory"])
            return {"dict": "{}", "list": "[]", "tuple": "()", "set": "set()"}.get(factory, f"{factory}()"), init
        return None, init
    return ast.unparse(value), True


# ---- PLUGINS.md: hooks -----------------------------------------------------------------------


def _module_dict(tree: ast.Module, name: str) -> dict[str, Any] | None:
    """The literal value of the module-level assignment ``name = {...}``."""
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and stmt.value is not None:
            try:
                return ast.literal_eval(stmt.value)
            except ValueError:
                return None
    return None


def hooks_region(src: Sources, problems: list[str]) -> list[str]:
    """The ``hooks`` region: the hookspecs module docstring, then one table row per hook spec."""
    path = src.path("hookspecs")
    tree = _parse(path)
    found = _module_dict(tree, "HOOK_FOR_KIND")
    if found is None:
        problems.append(f"{src.shown(path)}:1: HOOK_FOR_KIND (kind -> hook name, a dict literal) not found")
        kind_of: dict[str, str] = {}
    else:
        kind_of = {hook: kind for kind, hook in found.items()}
    rows = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or "hookspec" not in _decorator_names(fn):
            continue
        doc = ast.get_docstring(fn)
        if doc is None:
            problems.append(f"{src.shown(path)}:{fn.lineno}: {fn.name} has no docstring")
            continue
        if fn.name not in kind_of:
            problems.append(f"{src.shown(path)}:{fn.lineno}: {fn.name} is not in HOOK_FOR_KIND (which kind does it register?)")
        body, returns = _split_section(doc, "Returns")
        ret = " ".join(x.strip() for x in returns)
        kind = kind_of.get(fn.name, "")
        rows.append(f"| `{_cell(signature(fn))}` | `{kind}` | {_cell(inline(body, _LINKS))} | {_cell(inline(ret, _LINKS))} |")
    out = to_markdown(ast.get_docstring(tree) or "", _LINKS) + [""]
    out += ["| hook | kind | registers | returns |", "| --- | --- | --- | --- |"] + rows
    return out


# ---- PLUGINS.md: contracts -------------------------------------------------------------------

_LINKS: dict[str, str] = {}
"""Name -> anchor of each class section the contracts regions make (``Encoder`` -> ``#encoder``), set by
:func:`generate` before any region is made: a role naming one becomes a link to it."""


def contract_classes(tree: ast.Module) -> list[ast.ClassDef]:
    """The Protocols and dataclasses of the components module, in source order."""
    return [c for c in tree.body if isinstance(c, ast.ClassDef) and (_is_protocol(c) or "dataclass" in _decorator_names(c))]


def _member_lines(display: str, doc: str) -> list[str]:
    """One list item: ``- `display`: doc``, continuation paragraphs indented under it."""
    body = to_markdown(doc, _LINKS)
    first, rest = (body[0], body[1:]) if body else ("", [])
    out = [f"- `{display}`: {first}".rstrip()]
    out += [("  " + x) if x else "" for x in rest]
    return out


def _class_body(cls: ast.ClassDef, src: Sources, problems: list[str]) -> list[str]:
    """One class of the components module: its docstring, then each member as a list item (a
    Protocol's attributes and methods; a dataclass's fields with their ``Attributes:`` text, then
    its properties and methods, then its ``Raises:``)."""
    path = src.shown(src.path("components"))
    doc = ast.get_docstring(cls)
    if doc is None:
        problems.append(f"{path}:{cls.lineno}: {cls.name} has no docstring")
        doc = ""
    members = class_members(cls)
    out: list[str] = []
    fields: dict[str, str] = {}
    if not _is_protocol(cls):
        fields = _google_section(doc, "Attributes")
        out += to_markdown(_split_section(_split_section(doc, "Attributes")[0], "Raises")[0], _LINKS) + [""]
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)) or stmt.target.id.startswith("_"):
                continue
            name = stmt.target.id
            default, init = _field_default(stmt.value)
            display = f"{name}: {ast.unparse(stmt.annotation)}" + (f" = {default}" if default is not None and init else "")
            if name not in fields:
                problems.append(f"{path}:{stmt.lineno}: {cls.name}.{name} has no docstring (no entry in its Attributes section)")
            out += _member_lines(display, fields.get(name, ""))
    else:
        out += to_markdown(doc, _LINKS) + ([""] if members else [])
    for m in members:
        if not _is_protocol(cls) and m.name in _dataclass_fields(cls):
            continue  # a field, listed above
        if m.doc is None:
            problems.append(f"{path}:{m.line}: {cls.name}.{m.name} has no docstring")
        out += _member_lines(m.display, m.doc or "")
    raises = _google_section(doc, "Raises") if not _is_protocol(cls) else {}
    if raises:
        out += ["", "Raises:", ""] + [f"- `{n}`: {inline(t, _LINKS)}" for n, t in raises.items()]
    return out


def _dataclass_fields(cls: ast.ClassDef) -> set[str]:
    return {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def spec_region(src: Sources, problems: list[str]) -> list[str]:
    """The ``spec`` region: ``ComponentSpec``'s docstring and fields."""
    tree = _parse(src.path("components"))
    for cls in contract_classes(tree):
        if cls.name == "ComponentSpec":
            return _class_body(cls, src, problems)
    problems.append(f"{src.shown(src.path('components'))}:1: no ComponentSpec class")
    return []


def contracts_region(src: Sources, problems: list[str]) -> list[str]:
    """The ``contracts`` region: the components module docstring, then every Protocol and
    dataclass of the module but ``ComponentSpec``, each under a ``####`` heading."""
    tree = _parse(src.path("components"))
    out = to_markdown(ast.get_docstring(tree) or "", _LINKS)
    for cls in contract_classes(tree):
        if cls.name != "ComponentSpec":
            out += ["", f"#### `{cls.name}`", ""] + _class_body(cls, src, problems)
    return out


def _contract_links(src: Sources) -> dict[str, str]:
    tree = _parse(src.path("components"))
    return {c.name: anchor(f"`{c.name}`") for c in contract_classes(tree)}


# ---- PLUGINS.md: the public API --------------------------------------------------------------


def _eval_names(node: ast.expr, env: dict[str, ast.expr]) -> list[str] | None:
    """The string names an expression for ``__all__`` evaluates to: literals, ``sorted``/``list``/
    ``tuple`` of them, a dict's keys, ``+`` of such, and module-level names bound to such."""
    if isinstance(node, ast.Name) and node.id in env:
        return _eval_names(env[node.id], env)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out = []
        for e in node.elts:
            if isinstance(e, ast.Starred):
                inner = _eval_names(e.value, env)
                if inner is None:
                    return None
                out += inner
            elif isinstance(e, ast.Constant) and isinstance(e.value, str):
                out.append(e.value)
            else:
                return None
        return out
    if isinstance(node, ast.Dict):
        return [k.value for k in node.keys if isinstance(k, ast.Constant)]
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("sorted", "list", "tuple", "set") and len(node.args) == 1:
        inner = _eval_names(node.args[0], env)
        return sorted(inner) if inner is not None and node.func.id == "sorted" else inner
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _eval_names(node.left, env), _eval_names(node.right, env)
        return None if left is None or right is None else left + right
    return None


def api_names(tree: ast.Module) -> tuple[list[str] | None, dict[str, str]]:
    """``(__all__, name -> home module)`` of the api module, read from its source: the homes from
    a module-level dict literal of ``name: "omnicore...."`` strings and from the ``from omnicore...
    import`` statements (those under ``if TYPE_CHECKING:`` included)."""
    env: dict[str, ast.expr] = {}
    homes: dict[str, str] = {}
    all_node = None
    for stmt in ast.walk(tree):
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    env[t.id] = stmt.value
                    if t.id == "__all__":
                        all_node = stmt.value
            if isinstance(stmt.value, ast.Dict):
                try:
                    value = ast.literal_eval(stmt.value)
                except ValueError:
                    continue
                if value and all(isinstance(v, str) and v.split(".")[0] == "omnicore" for v in value.values()):
                    homes.update(value)
        elif isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.module.split(".")[0] == "omnicore":
            for alias in stmt.names:
                homes.setdefault(alias.asname or alias.name, stmt.module)
    names = _eval_names(all_node, env) if all_node is not None else None
    return names, homes


@dataclass
class Documented:
    """Where a public name is defined and what its docstring says."""

    kind: str  # "class", "function" or "value"
    doc: str | None
    file: Path
    line: int


def find_definition(src: Sources, module: str, name: str, depth: int = 0) -> Documented | None:
    """The definition of ``name`` in ``module`` (following ``from x import name`` re-exports)."""
    path = src.module_file(module)
    tree = _parse(path)
    for i, stmt in enumerate(tree.body):
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return Documented("class", ast.get_docstring(stmt), path, stmt.lineno)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            return Documented("function", ast.get_docstring(stmt), path, stmt.lineno)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return Documented("value", _attr_doc(tree.body, i), path, stmt.lineno)
    if depth < 5:
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom) and any((a.asname or a.name) == name for a in stmt.names):
                base = stmt.module or ""
                if stmt.level:
                    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (stmt.level - 1)]
                    base = ".".join(pkg + ([stmt.module] if stmt.module else []))
                original = next(a.name for a in stmt.names if (a.asname or a.name) == name)
                return find_definition(src, base, original, depth + 1)
    return None


_TOPIC = re.compile(r"^\* \*\*(.+?)\*\*(.*?)(?=^\S|\Z)", re.M | re.S)


def api_topics(doc: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """``(the docstring without its topic list, [(topic, role targets), ...])`` from the api module
    docstring's ``* **Topic**: :func:`name`, ...`` bullets (continuation lines indented)."""
    topics = [(m.group(1), [r.group(2) for r in _ROLE.finditer(m.group(2))]) for m in _TOPIC.finditer(doc)]
    return _TOPIC.sub("", doc).strip(), topics


def api_region(src: Sources, problems: list[str]) -> list[str]:
    """The ``api`` region: the api module docstring's prose, then one table per topic with each
    public name's kind and the first sentence of its docstring."""
    path = src.path("api")
    tree = _parse(path)
    names, homes = api_names(tree)
    if names is None:
        problems.append(f"{src.shown(path)}:1: __all__ not found or not computable from literals")
        return []
    prose, topics = api_topics(ast.get_docstring(tree) or "")
    grouped = []
    for title, targets in topics:
        listed = []
        for target in targets:  # Registry, omnicore.api.Audio, or a member such as Registry.build (not listed)
            parts = target.lstrip("~").split(".")
            if parts[-1] in names:
                listed.append(parts[-1])
            elif not any(p in names for p in parts):
                problems.append(f"{src.shown(path)}:1: the module docstring names {target} under {title}, but it is not in __all__")
        grouped.append((title, list(dict.fromkeys(listed))))
    placed = {n for _, ns in grouped for n in ns}
    for n in names:
        if n not in placed:
            problems.append(f"{src.shown(path)}:1: {n} is in __all__ but in no topic of the module docstring (* **Topic**: :func:`{n}`)")
    out = to_markdown(prose, _LINKS)
    for title, topic_names in grouped:
        out += ["", f"#### {title}", "", "| name | kind | what it is |", "| --- | --- | --- |"]
        for n in topic_names:
            home = homes.get(n)
            found = find_definition(src, home, n) if home else None
            if found is None:
                problems.append(f"{src.shown(path)}:1: {n}: its home module ({home}) does not define it")
                continue
            if found.doc is None:
                problems.append(f"{src.shown(found.file)}:{found.line}: {n} has no docstring")
                continue
            shown = f"[`{n}`]({_LINKS[n]})" if n in _LINKS else f"`{n}`"
            out.append(f"| {shown} | {found.kind} | {_cell(inline(first_sentence(found.doc), _LINKS))} |")
    return out


# ---- docs/reference/config.md ----------------------------------------------------------------


def _load_config(path: Path) -> types.ModuleType:
    """Import ``path`` (the config module) under a private name, so a modified copy can be read."""
    name = "_gen_reference_config_" + hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves the annotations in the module's namespace
    spec.loader.exec_module(module)
    return module


def _nested_models(tp: Any) -> list[tuple[str, type]]:
    """The pydantic models inside a field type, each with the key suffix that reaches it
    (``""`` itself, ``[i]`` in a list, ``.<key>`` in a dict)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if is_model(tp):
        return [("", tp)]
    if origin in (typing.Union, types.UnionType):
        return [x for a in args for x in _nested_models(a)]
    if origin in (list, tuple, set):
        return [("[i]" + s, m) for a in args for s, m in _nested_models(a)]
    if origin is dict:
        return [(".<key>" + s, m) for s, m in _nested_models(args[-1])]
    return []


def _bounds(field: Any) -> str:
    """A field's numeric and length bounds (``> 0``, ``0 <= x < 1``, ``at least 1 item``)."""
    parts = []
    for m in field.metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if getattr(m, attr, None) is not None:
                parts.append(f"{sym} {getattr(m, attr)}")
        if getattr(m, "min_length", None):
            parts.append(f"at least {m.min_length} item" + ("s" if m.min_length > 1 else ""))
        if getattr(m, "max_length", None) is not None:
            parts.append(f"at most {m.max_length} item" + ("s" if m.max_length != 1 else ""))
    return ", ".join(parts)


def _yaml(value: Any) -> str:
    """A default value written as YAML flow style."""
    if is_model(type(value)):
        value = value.model_dump(exclude_defaults=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value if value and re.fullmatch(r"[\w./<>-]+", value) and value not in ("null", "true", "false") else repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple, set)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return repr(value)


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
        if is_model(type(value)) and not value.model_fields_set:
            return "(the defaults below)"
        return f"`{_yaml(value)}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{_yaml(field.default)}`"


def _field_lines(model: type) -> dict[str, int]:
    """Field name -> its line in the model's source file."""
    try:
        lines, start = inspect.getsourcelines(model)
    except (OSError, TypeError):
        return {}
    out = {}
    for i, line in enumerate(lines):
        m = re.match(r"^\s{4}(\w+)\s*:", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = start + i
    return out


def _strictness(model: type) -> str:
    """How ``model`` treats unknown keys (``extra`` in its ``model_config``)."""
    extra = model.model_config.get("extra") or "ignore"
    return {"forbid": "refuses unknown keys", "allow": "keeps unknown keys", "ignore": "ignores unknown keys"}[
        extra
    ] + f' (`extra="{extra}"`)'


def _text(value: str) -> str:
    """Plain text (a field description) for a Markdown table cell: one line, and ``<``, ``>``,
    ``*``, ``|`` escaped outside code spans so that ``<modality>`` and ``*.jsonl`` show as written."""
    parts = " ".join(value.split()).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
    return "`".join(parts).replace("|", "\\|")


class _ConfigPage:
    """``docs/reference/config.md`` from the config module's models: one section per field of
    ``Config``, a sub-section per nested model at the key that reaches it, and the models used under
    several keys (``ComponentConfig``) once, under "Shared models", linked from every table."""

    def __init__(self, src: Sources, problems: list[str]):
        self.src, self.problems = src, problems
        self.path = src.path("config")
        self.module = _load_config(self.path)
        self.root = self.module.Config
        self.uses: dict[type, int] = {}
        self._count(self.root)
        self.shared = [m for m, n in self.uses.items() if n > 1]
        self.links = {m: anchor(f"`{m.__name__}`") for m in self.shared}
        self._place(self.root, "")
        self.lax = [m for m in [self.root, *self.uses] if m.model_config.get("extra") != "forbid"]

    @staticmethod
    def _nested(model: type) -> list[tuple[str, Any, str, type]]:
        """``(field name, field, key suffix, nested model)`` for each model inside a field of ``model``."""
        return [(n, f, s, m) for n, f in model.model_fields.items() if not f.exclude for s, m in _nested_models(f.annotation)]

    def _count(self, model: type) -> None:
        for _, _, _, m in self._nested(model):
            self.uses[m] = self.uses.get(m, 0) + 1
            if self.uses[m] == 1:
                self._count(m)

    def _place(self, model: type, dotted: str) -> None:
        """The anchor of each unshared model: its own sub-section's heading, ``dotted.key``."""
        for name, _, suffix, m in self._nested(model):
            if m not in self.links:
                self.links[m] = anchor(f"`{dotted}{name}{suffix}`")
                self._place(m, f"{dotted}{name}{suffix}.")

    def row(self, model: type, name: str, field: Any, dotted: str) -> str:
        """One table row: key, type (nested models linked) with bounds, default, description."""
        tp = _cell(type_name(field.annotation))
        for m, link in self.links.items():
            tp = re.sub(rf"\b{m.__name__}\b", f"[{m.__name__}]({link})", tp)
        bounds = _bounds(field)
        if not field.description:
            line = _field_lines(model).get(name, 1)
            self.problems.append(f"{self.src.shown(self.path)}:{line}: {model.__name__}.{name} ({dotted}{name}) has no description")
        return f"| `{name}` | {tp}{f' ({bounds})' if bounds else ''} | {_cell(_default(field))} | {_text(field.description or '')} |"

    def section(self, model: type, dotted: str, level: int) -> list[str]:
        """A model's docstring and table, then a sub-section per unshared nested model."""
        out = []
        doc = model.__dict__.get("__doc__")
        if doc:
            out += to_markdown(inspect.cleandoc(doc), {}) + [""]
        if model in self.lax:
            out += [f"`{model.__name__}` {_strictness(model)}.", ""]
        out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        out += [self.row(model, n, f, dotted) for n, f in model.model_fields.items() if not f.exclude]
        for name, _, suffix, m in self._nested(model):
            if m not in self.shared:
                key = f"{dotted}{name}{suffix}"
                out += ["", f"{'#' * level} `{key}`", "", f"A `{m.__name__}`.", ""] + self.section(m, key + ".", level + 1)
        return out

    def render(self) -> str:
        out = [
            "# Config reference",
            "",
            f"<!-- Generated by {COMMAND} from omnicore/config.py; edit the models there, not this page. -->",
            "",
            "Every key of the run config (`omnicore train CONFIG`), section by section, as the pydantic models of",
            "`omnicore/config.py` define it. In an override a key is written with dots: `--train.max_steps 50`.",
            "",
        ]
        out += to_markdown(inspect.cleandoc(self.root.__doc__ or ""), {}) + [""]
        if self.lax:
            out += ["Sections refuse unknown keys unless noted.", ""]
        else:
            out += ['Every section and sub-section refuses unknown keys (`extra="forbid"`): a misspelt key is an error']
            out += ["that names the closest valid one.", ""]
        for name, f in self.root.model_fields.items():
            if f.exclude:
                continue
            nested = _nested_models(f.annotation)
            out += (
                [f"## `{name}`", ""]
                + ([_text(f.description), ""] if f.description else [])
                + (["Required.", ""] if f.is_required() else [])
            )
            if len(nested) == 1 and nested[0][0] == "" and nested[0][1] not in self.shared:
                out += self.section(nested[0][1], f"{name}.", 3) + [""]
            else:  # a plain value, or a shared model: one row
                out += ["| key | type | default | description |", "| --- | --- | --- | --- |", self.row(self.root, name, f, ""), ""]
        if self.shared:
            out += ["## Shared models", "", "Models used under several keys; each key's table links here."]
            for m in self.shared:
                out += ["", f"### `{m.__name__}`", ""] + self.section(m, "", 4)
            out.append("")
        old = [(f"`{k}`", _text(v)) for k, v in getattr(self.module, "REMOVED_KEYS", {}).items()]
        old += [
            (f"`{section}.{k}`", f"`{v}` (moved)")
            for section, keys in getattr(self.module, "MOVED_KEYS", {}).items()
            for k, v in keys.items()
        ]
        if old:
            out += ["## Old keys", "", "An old key (`REMOVED_KEYS`, `MOVED_KEYS`) is an error that names the spelling to use now:", ""]
            out += ["| old key | use instead |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in old] + [""]
        return "\n".join(out).rstrip() + "\n"


def config_reference(src: Sources, problems: list[str]) -> str:
    """The whole text of ``docs/reference/config.md`` (see :class:`_ConfigPage`); a field without a
    ``description`` is added to ``problems`` as ``FILE:LINE: Model.field (dotted.key) has no description``."""
    return _ConfigPage(src, problems).render()


# ---- Putting it together ---------------------------------------------------------------------


def replace_regions(text: str, regions: dict[str, list[str]], shown: str) -> str:
    """``text`` with each ``BEGIN``/``END`` marked region's body replaced.

    Raises:
        SourceError: a region's markers are missing, repeated or out of order.
    """
    for name, lines in regions.items():
        begin, end = BEGIN.format(name), END.format(name)
        if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
            raise SourceError([f"{shown}:1: needs exactly one '{begin}' ... '{end}' pair, in that order"])
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        note = f"<!-- Generated by {COMMAND}; edit the docstrings, not this region. -->"
        text = head + begin + "\n" + note + "\n\n" + "\n".join(lines).strip() + "\n\n" + end + tail
    return text


def generate(src: Sources) -> tuple[dict[Path, str], list[str]]:
    """``(the generated text of every output file by path, problems)``. A problem is a hook,
    member, public name or config field without its docstring or description (``FILE:LINE: NAME
    has no docstring``) or a name the API table cannot place; its entry is generated empty.

    Raises:
        SourceError: PLUGINS.md lacks a region's markers.
    """
    problems: list[str] = []
    _LINKS.clear()
    _LINKS.update(_contract_links(src))
    makers = {"hooks": hooks_region, "spec": spec_region, "contracts": contracts_region, "api": api_region}
    regions = {name: makers[name](src, problems) for name in REGIONS}
    config_md = config_reference(src, problems)
    plugins = src.path("plugins_md")
    text = replace_regions(plugins.read_text(encoding="utf-8"), regions, src.shown(plugins))
    return {plugins: text, src.path("config_md"): config_md}, problems


def compare(src: Sources) -> tuple[list[str], list[str]]:
    """``(a unified diff per stale output file, problems)``: the files as they are against the
    generated text (both empty when the reference is current and complete)."""
    outputs, problems = generate(src)
    diffs = []
    for path, want in outputs.items():
        have = path.read_text(encoding="utf-8") if path.is_file() else ""
        if have != want:
            name = src.shown(path)
            diff = difflib.unified_diff(have.splitlines(True), want.splitlines(True), f"{name} (as is)", f"{name} (generated)")
            diffs.append("".join(diff))
    return diffs, problems


def check(src: Sources) -> list[str]:
    """A unified diff per stale output file; empty when all are current.

    Raises:
        SourceError: with every problem (see :func:`generate`), which comes before staleness.
    """
    diffs, problems = compare(src)
    if problems:
        raise SourceError(problems)
    return diffs


def write(src: Sources) -> tuple[list[Path], list[str]]:
    """Write every stale output file, also when there are problems (their entries stay empty).
    Returns ``(the files written, problems)``."""
    outputs, problems = generate(src)
    written = []
    for path, want in outputs.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != want:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(want, encoding="utf-8")
            written.append(path)
    return written, problems


def main(argv: list[str] | None = None) -> int:
    """The command line; exit status 0 (current), 1 (stale, with ``--check``) or 2 (problems)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff when a file is stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this script's repository)")
    args = parser.parse_args(argv)
    src = Sources(root=args.root)
    try:
        if args.check:
            diffs, problems = compare(src)
            for d in diffs:
                sys.stdout.write(d if d.endswith("\n") else d + "\n")
            if diffs:
                print(f"the reference is stale: run {COMMAND}", file=sys.stderr)
        else:
            written, problems = write(src)
            for path in written:
                print(f"wrote {src.shown(path)}")
            diffs = []
    except SourceError as exc:
        problems = exc.problems
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s): the reference is generated from the docstrings; add the missing ones", file=sys.stderr)
        return 2
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
