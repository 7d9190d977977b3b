"""PLUGINS.md against the code: every hook spec and every contract member has its reference entry.

The reference is checked, not generated, so it can explain more than the docstrings; these tests
fail as soon as the code and the page disagree:

* each hook spec of :mod:`omnicore.hookspecs` has a heading ``#### `name(params) -> ret` `` under
  ``### Hooks``, with the signature exactly as :func:`inspect.signature` gives it, and no heading
  there names a hook that does not exist;
* each ``Protocol`` of :mod:`omnicore.components` (the required contract of each kind, its optional
  and per-op parts, and what the core hands a parallel strategy) has a ``#### `Name` `` section
  under ``### Contracts`` that lists every method as ``name(params) -> ret`` (parameter names
  without ``self``, the return annotation as written in the code) and every attribute or property
  as ``name: type``; ``tests/test_contract_reads.py`` checks that the core reads nothing else;
* every kind has its hook and its contract.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Protocol

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


def _signature(fn, *, drop_self: bool = False) -> str:
    sig = inspect.signature(fn)
    params = [p.name for p in sig.parameters.values() if not (drop_self and p.name == "self")]
    ret = sig.return_annotation
    ret = ret if isinstance(ret, str) else inspect.formatannotation(ret)
    return f"{fn.__name__}({', '.join(params)}) -> {ret}"


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
    assert "preprocess(media) -> dict[str, Any]" in methods and attrs == ["modality: str"]


@pytest.mark.parametrize("name", sorted(_hookspecs()))
def test_every_hook_has_a_reference_entry_with_its_signature(name):
    hooks = _sections(_reference()["Hooks"], 4)
    want = f"`{_signature(_hookspecs()[name])}`"
    assert want in hooks, f"PLUGINS.md, Reference > Hooks: add a heading '#### {want}' (headings there: {sorted(hooks)})"
    assert hooks[want].strip(), f"PLUGINS.md: the entry {want} is empty"


def test_no_reference_entry_for_a_hook_that_does_not_exist():
    documented = {re.match(r"`(\w+)\(", h).group(1) for h in _sections(_reference()["Hooks"], 4) if h.startswith("`")}
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
    hooks = _reference()["Hooks"]
    for kind, hook in hookspecs.HOOK_FOR_KIND.items():
        body = _sections(hooks, 4)[f"`{_signature(_hookspecs()[hook])}`"]
        assert f'kind="{kind}"' in body, f'PLUGINS.md: the entry of {hook} must say it registers kind="{kind}"'
