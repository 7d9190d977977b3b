"""PLUGINS.md against the imported code: every hook spec and every contract member has its reference entry.

``scripts/gen_reference.py`` writes the reference from the sources, read with :mod:`ast`
(``tests/test_reference.py`` checks that it is current); these tests check what it wrote against the
modules as Python imports them, with :mod:`inspect`, a second way to read the same code:

* each hook spec of :mod:`omnicore.hookspecs` has a row ``| `name(params) -> ret` | `kind` |`` in the
  table under ``### Hooks``, with the signature as :func:`inspect.signature` gives it and the kind
  that ``HOOK_FOR_KIND`` gives, and no row there names a hook that does not exist;
* each ``Protocol`` of :mod:`omnicore.components` (the required contract of each kind, its optional
  and per-op parts, and what the core hands a parallel strategy) has a ``#### `Name` `` section
  under ``### Contracts`` that lists every method as ``name(params) -> ret`` (parameters as written,
  with annotations and defaults, without ``self``) and every attribute or property as
  ``name: type``; ``tests/test_contract_reads.py`` checks that the core reads nothing else;
* every kind has its hook and its contract.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any, Protocol

import pytest

from omnicore import components, hookspecs

DOC = Path(__file__).resolve().parents[1] / "PLUGINS.md"


def _sections(text: str, level: int) -> dict[str, str]:
    """Heading text -> body, for headings of exactly ``level`` (``#`` count); a body ends at the
    next heading of the same or a higher level."""
    out: dict[str, str] = {}
    current, body = None, []
    for line in text.splitlines():
        m = re.match(r"^(#+) (.*)$", line)
        if m and len(m.group(1)) <= level:
            if current is not None:
                out[current] = "\n".join(body)
            current, body = (m.group(2).strip(), []) if len(m.group(1)) == level else (None, [])
            continue
        if current is not None:
            body.append(line)
    if current is not None:
        out[current] = "\n".join(body)
    return out


def _reference() -> dict[str, str]:
    return _sections(_sections(DOC.read_text(), 2)["Reference"], 3)


def _hookspecs() -> dict[str, object]:
    return {n: f for n, f in vars(hookspecs).items() if inspect.isfunction(f) and hasattr(f, f"{hookspecs.PROJECT}_spec")}


def _protocols() -> dict[str, type]:
    return {n: c for n, c in vars(components).items() if inspect.isclass(c) and c is not Protocol and getattr(c, "_is_protocol", False)}


def _annotation(a) -> str:
    return a if isinstance(a, str) else inspect.formatannotation(a)


def _signature(fn, *, drop_self: bool = False) -> str:
    """``name(params) -> ret`` from :func:`inspect.signature`: each parameter as
    ``name: annotation = default`` (``name=default`` without annotation), ``*args``, ``**kwargs``,
    a bare ``*`` before keyword-only ones."""
    sig = inspect.signature(fn)
    params, star = [], False
    for p in sig.parameters.values():
        if drop_self and p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
        star = star or p.kind in (p.VAR_POSITIONAL, p.KEYWORD_ONLY)
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}" if p.annotation is not p.empty else f"={p.default!r}"
        params.append(text)
    ret = "" if sig.return_annotation is sig.empty else f" -> {_annotation(sig.return_annotation)}"
    return f"{fn.__name__}({', '.join(params)}){ret}"


def _hook_rows() -> dict[str, list[str]]:
    """Signature -> the other cells of each row of the hooks table (``| `sig` | `kind` | ... |``)."""
    rows = {}
    for line in _reference()["Hooks"].splitlines():
        m = re.match(r"^\| `([^`]+)` \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split(" | ")]
    return rows


def _contract_members(cls: type) -> tuple[list[str], list[str]]:
    """``(methods as 'name(params) -> ret', attributes as 'name: type')`` declared on the Protocol."""
    methods = [_signature(f, drop_self=True) for n, f in vars(cls).items() if inspect.isfunction(f) and not n.startswith("_")]
    attrs = [f"{n}: {t if isinstance(t, str) else inspect.formatannotation(t)}" for n, t in vars(cls).get("__annotations__", {}).items()]
    attrs += [f"{n}: {inspect.signature(p.fget).return_annotation}" for n, p in vars(cls).items() if isinstance(p, property)]
    return methods, attrs


def test_found_what_to_check():
    """Guard against the checks below passing vacuously."""
    assert set(_hookspecs()) == set(hookspecs.HOOK_FOR_KIND.values()) and len(_hookspecs()) == 6
    assert set(_protocols()) == {
        "Processor",
        "Encoder",
        "Decoder",
        "Foundation",
        "FoundationOptional",
        "ParallelStrategy",
        "ParallelStrategyOptional",
        "SequenceParallel",
        "ParallelModel",
        "ParallelStateView",
        "Kernel",
        "CrossEntropyKernel",
        "Logger",
    }
    # every protocol belongs to a kind's contract, or describes what the core hands a strategy
    in_contracts = {p.__name__ for protos in components.CONTRACTS.values() for p in protos}
    assert set(_protocols()) - in_contracts == {"ParallelModel", "ParallelStateView"}
    methods, attrs = _contract_members(components.Processor)
    assert "preprocess(media: Any) -> dict[str, Any]" in methods and attrs == ["modality: str"]
    assert _signature(components.ParallelStateView.fsdp_mesh, drop_self=True) == "fsdp_mesh(shard_dim: str = 'fsdp') -> Any"
    assert _signature(components.ParallelStateView.submesh, drop_self=True) == "submesh(*dims: str) -> Any"
    assert len(_hook_rows()) == 6


@pytest.mark.parametrize("name", sorted(_hookspecs()))
def test_every_hook_has_a_reference_entry_with_its_signature(name):
    rows = _hook_rows()
    want = _signature(_hookspecs()[name])
    assert want in rows, f"PLUGINS.md, Reference > Hooks: no row for `{want}` (rows: {sorted(rows)}); run python scripts/gen_reference.py"
    assert all(rows[want]), f"PLUGINS.md: the row of {want} has an empty cell: {rows[want]}"


def test_no_reference_entry_for_a_hook_that_does_not_exist():
    documented = {re.match(r"(\w+)\(", sig).group(1) for sig in _hook_rows()}
    assert documented <= set(_hookspecs()), (
        f"PLUGINS.md documents hooks not in omnicore/hookspecs.py: {sorted(documented - set(_hookspecs()))}"
    )


@pytest.mark.parametrize("name", sorted(_protocols()))
def test_every_contract_member_has_a_reference_entry(name):
    contracts = _sections(_reference()["Contracts"], 4)
    heading = f"`{name}`"
    assert heading in contracts, f"PLUGINS.md, Reference > Contracts: add a section '#### {heading}'"
    body = contracts[heading]
    methods, attrs = _contract_members(_protocols()[name])
    missing = [m for m in methods + attrs if f"`{m}`" not in body]
    assert not missing, f"PLUGINS.md, Reference > Contracts > {name}: add entries (exactly as in the code) for {missing}"


def test_each_kind_names_its_hook():
    rows = _hook_rows()
    for kind, hook in hookspecs.HOOK_FOR_KIND.items():
        cells = rows[_signature(_hookspecs()[hook])]
        assert cells[0] == f"`{kind}`", f"PLUGINS.md: the row of {hook} must name the kind it registers, `{kind}`, not {cells[0]}"


# ---- README.md and docs/: structure, links, commands and config keys ---------------------------
#
# The README is short and starts with the two commands; the "Using it" material lives in docs/*.md.
# These tests keep that shape, and check what the pages name against the code: every relative link
# (and its #anchor) resolves, every `omnicore ...` command and option exists, every script a page runs
# is in the repository, every dotted config key is a field of omnicore.config.Config, and every
# config block validates.

ROOT = DOC.parent
README = ROOT / "README.md"
PAGES = ["config", "data", "training", "parallelism", "checkpoints", "evaluation"]
"""The pages the issue asks for under docs/; docs/index.md lists them and README.md links each."""
README_MAX_LINES = 180
SECTIONS = ("run", "model", "data", "train", "eval", "samples", "parallel", "generate", "plugins")
FILE_SUFFIXES = {"jsonl", "json", "yaml", "yml", "py", "png", "md", "sh", "txt", "lock", "safetensors", "wav", "mkv", "stamp"}
"""Last parts that make ``data.jsonl`` or ``run.lock`` a file name rather than a config key."""
NOT_KEYS = {"model.layers.3.mlp"}
"""Dotted names in the docs that start like a config key but are something else (a checkpoint's tensor name)."""


def _doc_files() -> list[Path]:
    """README.md, every page under docs/ (but docs/reference/, generated and checked on its own), and the
    READMEs that took the README's figures."""
    pages = sorted(p for p in (ROOT / "docs").glob("*.md"))
    return [README, *pages, ROOT / "bench" / "README.md", ROOT / "examples" / "digits" / "README.md"]


def _code_blocks(text: str) -> list[list[str]]:
    """The code blocks of a markdown text (fenced, or indented by 4 spaces after a blank line), as lists of
    lines (indentation of an indented block removed); fenced blocks keep their info string as line 0."""
    blocks: list[list[str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            block = [line[3:].strip()]
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                block.append(lines[i])
                i += 1
            blocks.append(block)
        elif line.startswith("    ") and (i == 0 or not lines[i - 1].strip()) and not re.match(r"^\s*([-*|]|\d+\.)", line):
            block = ["(indented)"]
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                block.append(lines[i][4:])
                i += 1
            blocks.append([b for b in block if b.strip()])
            continue
        i += 1
    return blocks


def _prose(text: str) -> str:
    """The text without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", _prose(path.read_text()), flags=re.M)}


def _links(path: Path) -> list[str]:
    """Relative markdown link targets of a page (``[text](target)``), web links left out."""
    found = re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text()))
    return [t for t in found if not re.match(r"^[a-z]+:", t)]


def _config_field(parts: list[str]) -> str | None:
    """Walk ``parts`` (a dotted key without its section's ``Config`` prefix) through the pydantic models of
    :mod:`omnicore.config`; None when every part is a field, else what is wrong. A dict field takes any
    key (a modality, an op), and the walk stops at a field that is not a model (a list, ``Any``)."""
    import typing

    from pydantic import BaseModel

    from omnicore.config import Config

    model: Any = Config
    walked: list[str] = []
    while parts:
        part = parts.pop(0)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None  # options dicts, lists, Any: the component's own options model checks them
        if part not in model.model_fields:
            return f"{'.'.join(walked) or 'the config'} has no field {part!r} (fields: {', '.join(model.model_fields)})"
        walked.append(part)
        ann = model.model_fields[part].annotation
        if typing.get_origin(ann) is dict:
            if parts:
                walked.append(parts.pop(0))  # the key of the mapping: a modality, an op, a prefix
            ann = typing.get_args(ann)[-1]
        members = [a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = members[0] if typing.get_origin(ann) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and members else ann
    return None


_KEY = re.compile(rf"(?<![\w./<-])(?:--)?((?:{'|'.join(SECTIONS)})\.[A-Za-z_][\w]*(?:\.[\w<>*]+)*)")


def _config_keys(path: Path) -> set[str]:
    """Dotted config keys a page names: in `backticks` in its prose, and as ``--section.key`` overrides in
    its code blocks."""
    text = path.read_text()
    spans = re.findall(r"`([^`\n]+)`", _prose(text))
    spans += [line for block in _code_blocks(text) for line in block[1:] if "--" in line]
    keys = set()
    for span in spans:
        for m in _KEY.finditer(span):
            key = m.group(1)
            if key.rsplit(".", 1)[-1] not in FILE_SUFFIXES:
                keys.add(key)
    return keys


def _commands(path: Path) -> list[str]:
    """Each command line of a page's code blocks (continuation lines joined, comments dropped)."""
    out: list[str] = []
    for block in _code_blocks(path.read_text()):
        if block[0] not in ("", "bash", "sh", "(indented)"):
            continue  # yaml, json, python blocks hold no commands
        for line in block[1:]:
            code = re.sub(r"\s#\s.*$", "", line).rstrip()
            if out and (line.startswith((" ", "\t")) or out[-1].endswith("\\")):
                out[-1] = out[-1].rstrip("\\ ") + " " + code.strip()
            elif code:
                out.append(code.strip())
    return out


def test_readme_starts_with_the_two_commands_and_nothing_between_them():
    text = README.read_text()
    blocks = _code_blocks(text)
    assert blocks, "README.md has no code block"
    first = blocks[0]
    assert first[1:3] == ["bash examples/digits/run.sh", "bash scripts/test.sh"], (
        f"README.md: the first code block must be the two commands, the main job then the tests, on adjacent lines; it is {first[1:]}"
    )
    assert len(first) == 3, f"README.md: nothing may share the two commands' block: {first[3:]}"
    head = text.split("bash examples/digits/run.sh")[0]
    assert "## The two commands" in head and "`" not in head.split("## The two commands")[1], (
        "README.md: no command or code may stand between 'The two commands' heading and the commands"
    )


def test_readme_is_short_and_keeps_its_sections():
    text = README.read_text()
    n = len(text.splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; keep it near 150 (at most {README_MAX_LINES}) and move detail to docs/"
    headings = re.findall(r"^## (.*)$", _prose(text), flags=re.M)
    assert headings[0] == "The two commands", f"README.md: 'The two commands' must be the first section, not {headings[0]!r}"
    for needed in ("Install", "Six kinds of component", "A tour of the code", "Documentation", "Tests"):
        assert needed in headings, f"README.md: missing the section '## {needed}' (sections: {headings})"


def test_readme_tests_section_names_both_lanes_and_their_times():
    tests = _sections(README.read_text(), 2)["Tests"]
    assert "bash scripts/test.sh`" in tests and "bash scripts/test.sh --quick" in tests
    assert re.search(r"\(quick lane: [^;]+; full suite: [\d,]+ tests, about \d+ min of pytest on 2 cores\)", tests), (
        "README.md, Tests: keep the line '(quick lane: N tests, M min; full suite: N tests, about M min of pytest on 2 cores)'"
    )


def test_readme_table_of_the_six_kinds_names_each_hook():
    kinds = _sections(README.read_text(), 2)["Six kinds of component"]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| (\w+) \| `(\w+)` \|", kinds, flags=re.M)}
    assert rows == dict(hookspecs.HOOK_FOR_KIND), f"README.md: the kinds table must have one row per kind with its hook; it has {rows}"


def test_readme_table_of_the_six_kinds_names_the_registered_components():
    """The "built in" and "first-party plugins" columns list exactly what the registry holds from
    omnicore itself and from the distributions under plugins/ and contrib/."""
    from omnicore.registry import BUILTIN_PROVIDER, Registry

    kinds = _sections(README.read_text(), 2)["Six kinds of component"]
    first_party = {re.search(r'^name = "([^"]+)"', p.read_text(), re.M).group(1) for p in ROOT.glob("*/omnicore-*/pyproject.toml")}
    rows = Registry.discover().rows
    for line in kinds.splitlines():
        m = re.match(r"^\| (\w+) \| `\w+` \|[^|]*\|([^|]*)\|([^|]*)\|$", line)
        if not m:
            continue
        kind, builtin, plugins = m.group(1), set(re.findall(r"`(\w+)`", m.group(2))), set(re.findall(r"`(\w+)`", m.group(3)))
        want_builtin = {r.name for r in rows if r.kind == kind and r.provider == BUILTIN_PROVIDER}
        want_plugins = {r.name for r in rows if r.kind == kind and r.provider in first_party}
        assert builtin == want_builtin, (
            f"README.md, kinds table, {kind}: built in lists {sorted(builtin)}, the registry {sorted(want_builtin)}"
        )
        assert plugins == want_plugins, (
            f"README.md, kinds table, {kind}: first-party plugins list {sorted(plugins)}, the registry {sorted(want_plugins)}"
        )


def test_readme_tour_lists_the_core_in_reading_order():
    tour = _sections(README.read_text(), 2)["A tour of the code"]
    paths = re.findall(r"^\| `([^`]+)` \|", tour, flags=re.M)
    want = ["omnicore/api.py", "omnicore/components.py", "omnicore/hookspecs.py", "omnicore/registry/", "omnicore/config.py"]
    assert paths[: len(want)] == want, f"README.md: the tour starts with {want}, not {paths[: len(want)]}"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README.md's tour names paths that do not exist: {missing}"


def test_every_docs_page_exists_and_is_linked_from_the_readme_and_the_index():
    readme_links = {Path(t.split("#")[0]).as_posix() for t in _links(README)}
    index_links = {Path(t.split("#")[0]).as_posix() for t in _links(ROOT / "docs" / "index.md")}
    for page in PAGES:
        assert (ROOT / "docs" / f"{page}.md").is_file(), f"docs/{page}.md is missing"
        assert f"docs/{page}.md" in readme_links, f"README.md does not link docs/{page}.md"
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert page.name in index_links, f"docs/index.md does not list docs/{page.name}"
    assert "docs/index.md" in readme_links and "PLUGINS.md" in readme_links
    assert "reference/config.md" in {Path(t.split("#")[0]).as_posix() for t in _links(ROOT / "docs" / "config.md")}


@pytest.mark.parametrize("page", _doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve_to_files_and_headings(page):
    bad = []
    for target in _links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target} (no heading with that anchor in {dest.relative_to(ROOT)})")
    assert not bad, f"{page.relative_to(ROOT)}: broken links: {bad}"


_REPO_PATH = re.compile(r"^(omnicore|tests|plugins|contrib|examples|bench|scripts|docs)/[\w./-]*$")


def _repo_paths(path: Path) -> set[str]:
    """Paths of this repository that a page names in `backticks` (``tests/test_x.py::test_y`` as its
    file), without git-ignored outputs (``bench/results/``, the digits data) and placeholders
    (``plugins/NAME/tests``)."""
    ignored = [line.strip().rstrip("/") for line in (ROOT / ".gitignore").read_text().splitlines() if line.strip().endswith("/")]
    out = set()
    for span in re.findall(r"`([^`\n]+)`", _prose(path.read_text())):
        for word in span.split():
            word = word.split("::")[0].rstrip(",;:)")
            if not _REPO_PATH.match(word) or any(part.isupper() for part in word.split("/")):
                continue
            parts = word.rstrip("/").split("/")
            if any(word.rstrip("/") == ig or word.startswith(ig + "/") if "/" in ig else ig in parts for ig in ignored):
                continue
            out.add(word)
    return out


@pytest.mark.parametrize("page", _doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_repository_paths_named_in_the_docs_exist(page):
    missing = sorted(p for p in _repo_paths(page) if not (ROOT / p).exists())
    assert not missing, f"{page.relative_to(ROOT)} names files that are not in the repository: {missing}"


def test_the_path_check_finds_paths():
    paths = _repo_paths(ROOT / "docs" / "data.md")
    assert {"tests/test_mrope.py", "bench/data_scale.py"} <= paths
    assert not _repo_paths(ROOT / "bench" / "README.md") & {"bench/results/suite.json", "examples/digits/data/train.jsonl"}


@pytest.mark.parametrize("page", _doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_config_keys_named_in_the_docs_exist(page):
    from omnicore.config import REMOVED_KEYS

    keys = _config_keys(page) - NOT_KEYS
    if page.name == "config.md":  # the page that explains removed keys may name one
        keys -= set(REMOVED_KEYS)
    bad = {k: why for k in sorted(keys) if (why := _config_field(k.split(".")))}
    assert not bad, f"{page.relative_to(ROOT)} names config keys that omnicore/config.py does not have: {bad}"


def test_the_key_check_finds_keys_and_rejects_wrong_ones():
    """Guard against the check above passing vacuously."""
    keys = _config_keys(ROOT / "docs" / "data.md")
    assert {"data.packing", "data.max_tokens", "model.foundation.options.tokenizer", "run.seed"} <= keys
    assert not any(k.endswith(".jsonl") for k in keys)
    assert _config_field(["model", "kernels", "<op>"]) is None and _config_field(["model", "encoders", "image", "name"]) is None
    assert "no field 'max_step'" in _config_field(["train", "max_step"])
    assert "no field 'nme'" in _config_field(["model", "encoders", "image", "nme"])


@pytest.mark.parametrize("page", _doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_commands_quoted_in_the_docs_exist(page):
    """``omnicore SUB --opt``: the subcommand and each option exist; ``bash``/``python``/``sbatch FILE``: the
    file is in the repository; ``pip install NAME``: NAME is a distribution of plugins/ or contrib/."""
    from omnicore.cli import build_parser

    subs = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse keeps them only there
    dists = {re.search(r'^name = "([^"]+)"', p.read_text(), re.M).group(1) for p in ROOT.glob("*/omnicore-*/pyproject.toml")}
    bad = []
    for cmd in _commands(page):
        words = cmd.split()
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words.pop(0)  # VAR=value before the command
        if not words:
            continue
        if "omnicore" in words and (words[0] == "omnicore" or words[words.index("omnicore") - 1] == "-m"):
            rest = words[words.index("omnicore") + 1 :]
            if not rest or rest[0].startswith("-") or rest[0] == "SUBCOMMAND":
                continue
            if rest[0] not in subs:
                bad.append(f"{cmd}: no subcommand {rest[0]!r}")
                continue
            known = subs[rest[0]]._option_string_actions  # noqa: SLF001
            for opt in re.findall(r"(?<![\w.])--[a-z][\w-]*(?![\w.])", " ".join(rest[1:])):
                if opt not in known:
                    bad.append(f"{cmd}: omnicore {rest[0]} has no option {opt}")
        elif words[0] in ("bash", "sbatch") or words[0].endswith("python"):
            if len(words) > 1 and words[1] != "-m" and not words[1].startswith("-") and "/" in words[1]:
                if not (ROOT / words[1]).is_file():
                    bad.append(f"{cmd}: no file {words[1]}")
        elif words[:2] == ["pip", "install"]:
            names = [w for w in words[2:] if not w.startswith("-") and w != "dist" and "/" not in w]
            bad += [f"{cmd}: no distribution {n}" for n in names if n not in dists and n != "omnicore"]
    assert not bad, f"{page.relative_to(ROOT)}: {bad}"


def test_the_command_check_finds_commands():
    cmds = _commands(ROOT / "docs" / "parallelism.md")
    ulysses = [c for c in cmds if "--parallel.sp 2" in c]
    assert ulysses and ulysses[0].startswith("torchrun") and ulysses[0].endswith("--samples.every 0")
    assert any(c.startswith("omnicore plugins") for c in _commands(ROOT / "docs" / "index.md"))


@pytest.mark.parametrize("page", _doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_config_blocks_in_the_docs_validate(page):
    """A YAML block whose top-level keys are config sections validates: the whole config when it has
    ``data``, otherwise each section against its own model."""
    import yaml
    from pydantic import ValidationError

    from omnicore.config import Config

    checked = 0
    for block in _code_blocks(page.read_text()):
        body = "\n".join(block[1:])
        try:
            doc = yaml.safe_load(body)
        except yaml.YAMLError:
            continue  # a command or a JSON line, not YAML
        if not isinstance(doc, dict) or not doc or not set(doc) <= set(Config.model_fields):
            continue
        try:
            if "data" in doc:
                Config.model_validate(doc)
            else:
                for section, value in doc.items():
                    Config.model_fields[section].annotation.model_validate(value)
        except ValidationError as e:
            pytest.fail(f"{page.relative_to(ROOT)}: the config block starting {block[1]!r} does not validate:\n{e}")
        checked += 1
    if page in (README, ROOT / "docs" / "training.md", ROOT / "docs" / "checkpoints.md", ROOT / "docs" / "data.md"):
        assert checked, f"{page.relative_to(ROOT)}: found no config block to check"


@pytest.mark.slow
def test_no_docstring_names_a_path_outside_the_repository():
    """Docstrings name files of this repository only: a path into a workspace (``../shared``, ``/tmp/``,
    ``/work/``) means nothing to a reader of the package."""
    import ast

    bad = []
    for path in sorted((ROOT / "omnicore").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if not doc:
                    continue
                start = node.body[0].lineno
                for i, line in enumerate(doc.splitlines()):
                    if re.search(r"\.\./shared|/tmp/|/work/", line):
                        bad.append(f"{path.relative_to(ROOT)}:{start + i}: {line.strip()}")
    assert not bad, "docstrings name paths outside the repository:\n" + "\n".join(bad)
