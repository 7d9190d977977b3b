"""``omnicore plan CONFIG --world-size N``: mesh, strategies, per-rank memory, and each violated
constraint with its message; exit status 0 when valid, 2 otherwise. No process group starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TINY_LM

TINY_MOE = {
    "model_type": "qwen2_moe",
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32,
    "num_experts": 3,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def _write(tmp_path: Path, parallel: dict, lm: dict = TINY_LM) -> str:
    cfg = {
        "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": dict(lm)}}},
        "data": {"train": "unused.jsonl"},
        "parallel": parallel,
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _plan(capsys, tmp_path, parallel, world, lm=TINY_LM) -> tuple[int, str]:
    from omnicore.cli import main

    rc = main(["plan", _write(tmp_path, parallel, lm), "--world-size", str(world)])
    return rc, capsys.readouterr().out


@pytest.mark.cli
def test_plan_cli_hsdp_is_valid_and_prints_mesh_groups_and_memory(tmp_path):
    """The real command line; torch.distributed is never initialised."""
    path = _write(tmp_path, {"dp_replicate": 2, "dp_shard": -1})
    code = "import sys, torch.distributed as d; from omnicore.cli import main; rc = main(sys.argv[1:]); assert not d.is_initialized(); sys.exit(rc)"
    proc = subprocess.run(
        [sys.executable, "-c", code, "plan", path, "--world-size", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "mesh: dp_replicate=2 x dp_shard=2 x ep=1 x sp=1 (world 4)" in out
    assert "dp_replicate  size 2  groups [0,2] [1,3]" in out and "dp_shard      size 2  groups [0,1] [2,3]" in out
    assert "fsdp2 [sharding]: HSDP: shard over 2 ranks, replicate x2; wraps lm.model.layers.0, lm.model.layers.1, (root)" in out
    assert "ok: no violated constraints" in out


@pytest.mark.slow
def test_plan_memory_is_sharded_by_the_fsdp_dims(capsys, tmp_path):
    from omnicore.config import load_config
    from omnicore.parallel.plan import make_plan

    one = make_plan(load_config(_write(tmp_path, {"dp_shard": -1})), 1)
    four = make_plan(load_config(_write(tmp_path, {"dp_shard": -1})), 4)
    hsdp = make_plan(load_config(_write(tmp_path, {"dp_replicate": 2, "dp_shard": -1})), 4)
    assert one.ok and four.ok and hsdp.ok
    assert one.param_bytes_per_rank == one.total_param_bytes == 4 * one.params  # fp32, unsharded
    assert one.optimizer_bytes_per_rank == 8 * one.params  # AdamW: 2 fp32 states
    # 4-way FSDP: each rank holds ceil(dim0 / 4) rows of every parameter
    assert one.param_bytes_per_rank / 4 <= four.param_bytes_per_rank < one.param_bytes_per_rank / 4 * 1.05
    assert four.optimizer_bytes_per_rank == 2 * four.param_bytes_per_rank
    # HSDP 2x2 shards over 2 ranks only
    assert one.param_bytes_per_rank / 2 <= hsdp.param_bytes_per_rank < four.param_bytes_per_rank * 2 * 1.05


def test_sizes_not_multiplying_to_the_world_size(capsys, tmp_path):
    rc, out = _plan(capsys, tmp_path, {"dp_replicate": 2, "dp_shard": 3}, 4)
    assert rc == 2
    assert (
        "parallel: parallel.dp_replicate x parallel.dp_shard x parallel.ep x parallel.sp = 2 x 3 x 1 x 1 = 6, but the world size is 4; make the product 4 (for example parallel.dp_shard: 2, or -1 to fill the rest)"
        in out
    )
    rc, out = _plan(capsys, tmp_path, {"dp_shard": -1, "sp": 3}, 4)
    assert rc == 2
    assert (
        "parallel.dp_shard: is -1 (the rest) but the world size 4 is not divisible by dp_replicate=1, ep=1, sp=3 (product 3); use a world size that is a multiple of 3"
        in out
    )


def test_heads_not_divisible_by_sp(capsys, tmp_path):
    rc, out = _plan(capsys, tmp_path, {"dp_shard": 1, "sp": 3}, 3)
    assert rc == 2
    assert (
        "parallel.sp: is 3 but the foundation has 4 attention heads, not divisible by 3; set parallel.sp to a divisor of 4 that divides the world size (1)"
        in out
    )
    # and an sp dim no strategy uses is reported too
    assert (
        "parallel.sp: is 3 but no strategy uses the 'sp' dim (strategies: fsdp2); add a sequence-parallel strategy (for example ulysses) to parallel.strategies or set parallel.sp: 1"
        in out
    )


def test_experts_not_divisible_by_ep(capsys, tmp_path):
    rc, out = _plan(capsys, tmp_path, {"dp_shard": 1, "ep": 2}, 2, lm=TINY_MOE)
    assert rc == 2
    assert (
        "parallel.ep: is 2 but the foundation has 3 experts, not divisible by 2; set parallel.ep to a divisor of 3 that divides the world size (1)"
        in out
    )
    rc, out = _plan(capsys, tmp_path, {"dp_shard": 1, "ep": 2}, 2)
    assert "parallel.ep: is 2 but the foundation (qwen2) has no experts; set parallel.ep: 1 or use a mixture-of-experts foundation" in out


def test_replicate_dim_without_a_sharding_strategy(capsys, tmp_path):
    rc, out = _plan(capsys, tmp_path, {"dp_replicate": 2, "dp_shard": 1, "strategies": ["none"]}, 2)
    assert rc == 2
    assert (
        "parallel.dp_replicate: is 2 but no strategy uses the 'dp_replicate' dim (strategies: none); add fsdp2 to parallel.strategies (HSDP) or set parallel.dp_replicate: 1"
        in out
    )


def test_strategies_are_ordered_by_phase_not_list_order():
    from omnicore.parallel.parallelize import ParallelizeError, order_strategies, phase_of

    class Attn:
        phase = "attention"
        mesh_dims = ("sp",)

    class Legacy:  # the original contract: no phase -> sharding (last)
        mesh_dims = ("dp_shard",)

        def apply(self, model, mesh):
            return model

    class Ckpt:
        phase = "checkpointing"
        mesh_dims = ()

    got = [n for n, _ in order_strategies([("legacy", Legacy()), ("ckpt", Ckpt()), ("attn", Attn())])]
    assert got == ["attn", "ckpt", "legacy"]
    bad = type("Bad", (), {"phase": "whenever"})()
    with pytest.raises(
        ParallelizeError, match="declares phase 'whenever'; phases are attention, experts, checkpointing, compile, sharding"
    ):
        phase_of(bad)


def test_ep_without_a_sharding_strategy(capsys, tmp_path):
    """EP alone would leave the dense gradients of the ep ranks unreduced: refused, naming fsdp2."""
    moe = dict(TINY_MOE, num_experts=4)
    rc, out = _plan(capsys, tmp_path, {"dp_shard": 1, "ep": 2, "strategies": ["ep"]}, 2, lm=moe)
    assert rc == 2
    want = (
        "parallel.strategies: 'ep' splits the experts over parallel.ep = 2, but no sharding strategy reduces the dense (non-expert) "
        "gradients over the ep ranks, which read different samples (strategies: ep); add fsdp2 to parallel.strategies"
    )
    assert want in out
    assert "1 violated constraint(s)" in out
    rc, out = _plan(capsys, tmp_path, {"dp_shard": 1, "ep": 2, "strategies": ["ep", "fsdp2"]}, 2, lm=moe)
    assert rc == 0, out
    assert "ok: no violated constraints" in out


def test_parallelize_refuses_ep_without_a_sharding_strategy():
    """The same check at apply time (parallelize validates before it changes anything)."""
    from types import SimpleNamespace

    from omnicore.parallel.expert import ExpertParallel
    from omnicore.parallel.mesh import MeshLayout
    from omnicore.parallel.parallelize import ParallelizeError, parallelize

    layout = MeshLayout(2, {"dp_replicate": 1, "dp_shard": 1, "ep": 2, "sp": 1})
    state = SimpleNamespace(size=layout.size, world_size=2)
    with pytest.raises(ParallelizeError, match="add fsdp2 to parallel.strategies"):
        parallelize(object(), state, [("ep", ExpertParallel({}))])


def test_plan_shows_training_options_kernels_and_precision(capsys, tmp_path):
    from omnicore.cli import main

    path = _write(tmp_path, {"dp_shard": -1})
    rc = main(
        [
            "plan",
            path,
            "--world-size",
            "2",
            "--parallel.strategies",
            "[{name: activation_checkpointing, options: {mode: selective, every: 2}}, fsdp2]",
            "--train.mixed_precision",
            "bf16",
            "--model.kernels",
            "{cross_entropy: chunked_cross_entropy}",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    # TINY_LM has 2 blocks: selective 1-in-2 checkpoints block 0 only; FSDP2 still wraps both
    assert (
        "activation_checkpointing [checkpointing]: activation checkpointing (selective): 1 block, one block in every 2; wraps lm.model.layers.0\n"
        in out
    )
    assert "fsdp2 [sharding]" in out
    assert "kernels: attention=sdpa, cross_entropy=chunked_cross_entropy; precision: bf16 mixed" in out
