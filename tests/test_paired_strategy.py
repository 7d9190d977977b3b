"""PLUGINS.md's parallel-strategy example (``PairedFSDP``: pairs of ranks read the same micro-batches
through ``data_split`` and split its targets in a sequence hook), taken from the page and run:
two processes train to the one-process losses; without the target split the run stops at step 1
with an error that says why; ``omnicore plan`` shows its data split and its violation."""

from __future__ import annotations

import copy
import json
import sys
import textwrap
from pathlib import Path

import pytest

from omnicore.components import ComponentSpec
from omnicore.hookspecs import hookimpl

ROOT = Path(__file__).resolve().parents[1]
MODULE = "paired_doc_example"


def doc_example() -> str:
    """The indented code block of PLUGINS.md that defines ``class PairedFSDP``, dedented."""
    text = (ROOT / "PLUGINS.md").read_text()
    start = text.index("    import torch\n\n    from omnicore.api import FSDP2, IGNORE_INDEX, Violation")
    lines = []
    for line in text[start:].splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    code = textwrap.dedent("\n".join(lines))
    assert "class PairedFSDP" in code and "def data_split" in code and "class KeepHalf" in code
    return code


class DocPlugin:
    """Registers the page's strategy as ``paired_fsdp`` and a copy without the sequence hook."""

    @hookimpl
    def omnicore_parallel_strategies(self):
        return [
            ComponentSpec(name="paired_fsdp", target=f"{MODULE}:PairedFSDP"),
            ComponentSpec(name="paired_no_split", target=f"{MODULE}:NoSplit"),
        ]


NO_SPLIT = '''

class NoSplit(PairedFSDP):
    """The same without the hook: both ranks of a pair count every target."""

    def apply(self, model, state):
        return self.fsdp.apply(model, state)
'''


def _registry(folder: str):
    from omnicore.registry import Registry

    if folder not in sys.path:
        sys.path.insert(0, folder)
    return Registry.from_plugins([(DocPlugin(), "doc-example")], builtins=True)


def _config(raw: dict, out: str, strategy: str):
    from omnicore.config import Config

    d = copy.deepcopy(raw)
    d["run"]["output_dir"] = out
    d["parallel"] = {"strategies": [strategy], "backend": "gloo"}
    return Config.model_validate(d)


def train_rank(folder: str, raw: dict, out: str, strategy: str) -> list[float]:
    from omnicore.train.loop import train

    return [r["loss"] for r in train(_config(raw, out, strategy), registry=_registry(folder))]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from conftest import tiny_config_dict

    folder = tmp_path_factory.mktemp("paired")
    (folder / f"{MODULE}.py").write_text(doc_example() + NO_SPLIT)
    lines = []
    for i in range(32):
        q = "Count " + " ".join(str((i * 3 + k) % 10) for k in range(2 + i % 7))
        lines.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 4)}]})
    data = folder / "text.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    raw = tiny_config_dict(str(data), decoders=False, max_steps=3, grad_accum=2)
    raw["model"]["encoders"] = {}
    raw["data"]["max_tokens"] = 128
    return str(folder), raw


@pytest.mark.multiprocess
def test_two_processes_equal_one_process(setup, tmp_path):
    from omnicore.testing.distributed import run_distributed

    folder, raw = setup
    ref = train_rank(folder, raw, str(tmp_path / "one"), "paired_fsdp")  # one process: no pairs, every target
    ranks = run_distributed(train_rank, 2, args=(folder, raw, str(tmp_path / "two"), "paired_fsdp"))
    assert len(ref) == 3 and ranks[0] == ranks[1]
    assert ranks[0] == pytest.approx(ref, rel=1e-5)


@pytest.mark.multiprocess
def test_without_the_target_split_the_run_stops_at_step_one(setup, tmp_path):
    from omnicore.testing.distributed import DistributedTestError, run_distributed

    folder, raw = setup
    with pytest.raises(DistributedTestError) as ei:
        run_distributed(train_rank, 2, args=(folder, raw, str(tmp_path / "bad"), "paired_no_split"))
    msg = str(ei.value)
    assert "ParallelizeError" in msg and "each micro-batch read by 2 rank(s)" in msg
    assert "must each compute the loss of their own part of the targets" in msg
    assert not (tmp_path / "bad" / "checkpoints").exists()  # stopped before any optimizer step or save


def test_plan_shows_the_data_split_and_the_violation(setup):
    from omnicore.parallel.plan import make_plan

    folder, raw = setup
    cfg = _config(raw, "unused", "paired_fsdp")
    two = make_plan(cfg, 2, _registry(folder))
    assert two.ok and two.data == [(0, 1), (0, 1)]
    assert "  data: 1 shard(s); rank 0 reads shard 0, rank 1 reads shard 0\n" in two.render()
    four = make_plan(cfg, 4, _registry(folder))
    assert four.data == [(0, 2), (0, 2), (1, 2), (1, 2)]
    three = make_plan(cfg, 3, _registry(folder))
    assert [str(v) for v in three.violations] == ["parallel.dp_shard: paired_fsdp needs an even world size, not 3"]


def test_the_example_declares_the_dims_of_the_fsdp2_it_applies(setup):
    """It applies FSDP2, which is HSDP when ``parallel.dp_replicate`` > 1: it must claim both dims,
    or a replicated layout is refused as a dim no strategy uses."""
    from omnicore.api import FSDP2
    from omnicore.parallel.plan import make_plan

    folder, raw = setup
    cfg = _config(raw, "unused", "paired_fsdp")
    cfg = cfg.model_copy(update={"parallel": cfg.parallel.model_copy(update={"dp_replicate": 2, "dp_shard": 2})})
    hsdp = make_plan(cfg, 4, _registry(folder))
    assert [str(v) for v in hsdp.violations] == [] and hsdp.ok
    assert hsdp.data == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert "HSDP: shard over 2 ranks, replicate x2" in hsdp.render()
    assert sys.modules[MODULE].PairedFSDP.mesh_dims == FSDP2.mesh_dims
