"""PLUGINS.md's "N processes equal one" snippet, taken from the page and run with the built-in
``fsdp2`` in place of ``your_strategy``; and the contract's skip reason that points to it."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULE = "n_equal_one_doc_example"
HEADING = "**N processes equal one.**"


def snippet() -> str:
    """The indented code block after the paragraph that starts with :data:`HEADING`, dedented."""
    text = (ROOT / "PLUGINS.md").read_text()
    start = text.index("    import pytest\n", text.index(HEADING))
    lines = []
    for line in text[start:].splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


def test_the_contract_skip_points_to_the_snippet():
    from omnicore.testing import ParallelStrategyContract

    class Fsdp2(ParallelStrategyContract):
        name = "fsdp2"

    with pytest.raises(pytest.skip.Exception) as ei:
        Fsdp2().test_apply_without_mesh_keeps_the_loss()
    reason = str(ei.value)
    assert "run_distributed" in reason and "PLUGINS.md" in reason
    assert "'N processes equal one'" in reason and HEADING in (ROOT / "PLUGINS.md").read_text()


@pytest.mark.multiprocess
def test_the_snippet_runs_and_two_fsdp2_processes_equal_one(tmp_path, monkeypatch):
    code = snippet().replace("import your_package.plugin  # the hook module your entry point names", "import omnicore.builtins")
    code = code.replace("[your_package.plugin]", "[]").replace('"your_strategy"', '"fsdp2"')
    assert "your_" not in code, code
    (tmp_path / f"{MODULE}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned ranks inherit sys.path
    rows = []
    for i in range(24):
        q = "Count " + " ".join(str((i * 3 + k) % 10) for k in range(2 + i % 5))
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 3)}]})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    import importlib

    mod = importlib.import_module(MODULE)
    try:
        mod.test_two_processes_equal_one(tmp_path)  # the page's own assertions
    finally:
        sys.modules.pop(MODULE, None)
