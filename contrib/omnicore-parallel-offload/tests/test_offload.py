"""Tests of the ``fsdp2_offload`` strategy: real values from tiny models.

The end-to-end test trains the tiny omni-modal model on the digits data on 2 processes through the
real command line, once with omnicore's built-in ``fsdp2`` and once with ``fsdp2_offload``, and
compares the losses step by step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from omnicore.api import ParallelStrategy
from omnicore.testing import ParallelStrategyContract
from omnicore_parallel_offload.strategy import FSDP2Offload, OffloadStats, offload_block_activations

STEPS = 4


def _tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


class TestOffloadContract(ParallelStrategyContract):
    """The kit's parallel-strategy suite: registered and documented, and a hook module that imports
    without torch, transformers or diffusers (the single-process loss check needs a process group)."""

    name = "fsdp2_offload"


@pytest.mark.cli
def test_listed_by_omnicore_plugins():
    out = subprocess.run([sys.executable, "-m", "omnicore", "plugins", "--kind", "parallel"], capture_output=True, text=True, check=True)
    row = next(line for line in out.stdout.splitlines() if "fsdp2_offload" in line)
    assert row.split()[:3] == ["parallel", "fsdp2_offload", "omnicore-parallel-offload"]
    assert "available" in row.split()


def test_contract_and_options():
    strategy = FSDP2Offload({})
    assert isinstance(strategy, ParallelStrategy)
    assert strategy.mesh_dims == ("dp_shard",)
    assert FSDP2Offload({"pin_memory": True}).options.pin_memory is True
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="pin_memroy"):
        FSDP2Offload({"pin_memroy": True})


def test_offloaded_blocks_give_the_same_gradients_and_count_what_they_moved():
    """Offloading is a move and a move back: loss and every gradient bit-identical to no offloading."""
    model = _tiny_qwen2()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    want_loss, want = _loss_and_grads(model, ids)
    stats = offload_block_activations(list(model.model.layers), pin_memory=False)
    got_loss, got = _loss_and_grads(model, ids)
    assert torch.equal(got_loss, want_loss)
    for name, g in want.items():
        assert torch.equal(got[name], g), name
    assert stats.block_forwards == 2
    # per Qwen2 decoder layer, autograd saves 4 attention and 3 MLP weights and 2 RMSNorm weights:
    # all kept in place; the activations are moved
    assert stats.kept_parameters == 2 * (4 + 3 + 2)
    assert stats.packed > 0 and stats.unpacked == stats.packed
    assert stats.stored_devices == ["cpu"] and stats.pinned == 0
    assert stats.packed_bytes >= 2 * 2 * 16 * 32 * 4  # at least one fp32 [2, 16, 32] hidden state per layer


def test_context_is_left_when_a_block_raises():
    model = _tiny_qwen2()
    stats = offload_block_activations(list(model.model.layers), pin_memory=False)
    with pytest.raises((TypeError, ValueError, AttributeError)):
        model.model.layers[0](torch.zeros(1, 4, 32))  # no position embeddings: the forward raises
    assert stats.block_forwards == 1
    before = stats.packed  # what the block saved before it raised
    x = torch.randn(3, 3, requires_grad=True)
    (x * x).sum().backward()  # outside any block now: nothing more may be packed
    assert stats.packed == before


def _train(cfg: dict, work: Path, env: dict) -> tuple[list[float], str]:
    work.mkdir(parents=True, exist_ok=True)
    path = work / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "omnicore", "train", str(path)]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (Path(cfg["run"]["output_dir"]) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows], proc.stdout


@pytest.mark.cli
@pytest.mark.multiprocess
def test_two_processes_match_builtin_fsdp2(digits_data, run_config, tmp_path):
    """2 processes, 4 steps, the tiny omni-modal model on the digits data: fsdp2_offload gives the
    losses of the built-in fsdp2 to rel 1e-6 (the same arithmetic; measured: identical on CPU), and
    every rank's stats show each block forward offloaded and every activation read back from CPU."""
    train = str(digits_data / "train.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", OMNICORE_OFFLOAD_STATS=str(tmp_path / "stats"))
    ref, _ = _train(run_config(train, str(tmp_path / "ref" / "run"), "fsdp2", STEPS), tmp_path / "ref", env)
    got, stdout = _train(run_config(train, str(tmp_path / "off" / "run"), "fsdp2_offload", STEPS), tmp_path / "off", env)
    print(f"fsdp2 {ref}\nfsdp2_offload {got}\nmax rel diff {max(abs(a - b) / abs(a) for a, b in zip(ref, got)):.3g}")
    assert len(ref) == len(got) == STEPS
    assert ref[0] > ref[-1]  # it learns
    assert got == pytest.approx(ref, rel=1e-6)
    assert "fsdp2_offload: activations of 2 blocks saved on CPU (pin_memory=False)" in stdout
    for rank in (0, 1):
        stats = OffloadStats(**json.loads((tmp_path / "stats" / f"rank{rank}.json").read_text()))
        assert stats.block_forwards == STEPS * 2  # one micro-batch per step, 2 blocks
        assert stats.packed > 0 and stats.unpacked == stats.packed
        assert stats.kept_parameters > 0  # FSDP2's all-gathered weights stay where they are
        assert stats.stored_devices == ["cpu"]
        print(f"rank {rank}: {stats}")
