"""FSDP2 on 2 processes and HSDP (dp_replicate 2 x dp_shard 2) on 4 equal one process.

The tiny Qwen2 of ``conftest.TINY_LM`` is built through the real path (config -> registry ->
``build_omni_model`` -> ``parallelize``), text only. The same 4 micro-batches per step are split
over the data-parallel ranks; the loss is normalised by the global target count and scaled by the
world size (FSDP2 averages gradients over every rank), as the training loop does. Two AdamW steps:
losses of both steps and full gradients of both steps are compared with one process.
"""

from __future__ import annotations

import time

import pytest
import torch
from conftest import TINY_LM

from omnicore.data.packing import MicroBatch
from omnicore.testing.distributed import max_rel_diff, run_distributed

pytestmark = pytest.mark.multiprocess

MICRO = 4  # micro-batches per optimizer step (global)
SEQ = 48
STEPS = 2


def _cfg(parallel: dict, train: dict | None = None):
    from omnicore.config import Config

    return Config.model_validate(
        {
            "run": {"seed": 0, "device": "cpu"},
            "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM)}}},
            "data": {"train": "unused.jsonl"},
            "parallel": parallel,
            "train": train or {},
        }
    )


def _batches(vocab: int, n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (1, SEQ), generator=g)
        labels = torch.full_like(ids, -100)
        keep = torch.rand(1, SEQ, generator=g) < 0.7
        labels[:, :-1] = torch.where(keep[:, :-1], ids[:, 1:], -100)
        out.append({"input_ids": ids, "labels": labels, "position_ids": torch.arange(SEQ).unsqueeze(0)})
    return out


def train_steps(parallel: dict, train: dict | None = None) -> dict:
    """Run STEPS optimizer steps; return per-step losses and full gradients (on every rank).

    ``train``: train-section options (mixed_precision) applied as the training loop applies them. Also returns the dtype block 0's MLP weight had in forward and
    the parameters' dtypes after the steps."""
    import contextlib

    from omnicore.model.build import build_omni_model
    from omnicore.parallel.parallelize import build_strategies, parallelize
    from omnicore.parallel.state import ParallelState, init_parallel_state
    from omnicore.registry import Registry

    cfg = _cfg(parallel, train)
    registry = Registry.from_plugins([], builtins=True)
    state = (
        init_parallel_state("cpu", "gloo", cfg.parallel)
        if torch.distributed.is_initialized()
        else ParallelState(0, 1, 0, torch.device("cpu"))
    )
    state.mixed_precision = cfg.train.mixed_precision
    model, tok = build_omni_model(cfg, registry)
    model = parallelize(model, state, build_strategies(cfg.parallel, registry, state.distributed))
    bf16 = cfg.train.mixed_precision == "bf16"
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    mlp = model.blocks()[0].mlp.down_proj
    forward_dtypes: list[torch.dtype] = []
    mlp.register_forward_pre_hook(lambda m, a: forward_dtypes.append(m.weight.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    batches = _batches(len(tok), MICRO) * STEPS  # the same data each step, so the loss must fall
    losses, grads = [], []
    for step in range(STEPS):
        mine = [batches[step * MICRO + k * state.dp_size + state.dp_rank] for k in range(MICRO // state.dp_size)]
        n_global = state.all_reduce_sum(sum(int((b["labels"] != -100).sum()) for b in mine), dim="dp")
        loss_sum = 0.0
        for b in mine:
            with autocast():
                out = model(MicroBatch(**b))
            (out.loss_sum * state.world_size / n_global).backward()
            loss_sum += float(out.loss_sum.detach())
        losses.append(state.all_reduce_sum(loss_sum) / n_global)
        grads.append(
            {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone() for n, p in model.named_parameters()}
        )
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {
        "losses": losses,
        "grads": grads,
        "fsdp_mesh": tuple(state.fsdp_mesh().shape) if state.distributed else None,
        "forward_dtypes": sorted({str(d) for d in forward_dtypes}),
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
    }


def _compare(ranks: list[dict], ref: dict, mesh_shape: tuple[int, ...]) -> None:
    for r, got in enumerate(ranks):
        assert got["fsdp_mesh"] == mesh_shape
        loss_diff = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref["losses"]))
        grad_diff = max_rel_diff(got["grads"], ref["grads"])
        print(f"rank {r}: loss rel diff {loss_diff:.2e}, grad rel diff {grad_diff:.2e} (losses {got['losses']})")
        assert loss_diff <= 1e-5, (r, got["losses"], ref["losses"])
        assert grad_diff <= 1e-4, (r, grad_diff)
    assert ref["losses"][1] < ref["losses"][0]  # the step did something


def test_fsdp2_two_processes_match_one_process_loss_and_grads():
    t = time.perf_counter()
    ref = train_steps({"dp_shard": -1})
    ranks = run_distributed(train_steps, 2, args=({"dp_shard": -1, "strategies": ["fsdp2"]},))
    _compare(ranks, ref, (2,))
    print(f"took {time.perf_counter() - t:.1f} s")


def test_hsdp_2x2_matches_one_process_loss_and_grads():
    """dp_replicate: 2 alone turns FSDP2 into HSDP (2-D mesh (dp_replicate, dp_shard))."""
    t = time.perf_counter()
    ref = train_steps({"dp_shard": -1})
    ranks = run_distributed(train_steps, 4, args=({"dp_replicate": 2, "dp_shard": -1},))
    _compare(ranks, ref, (2, 2))
    print(f"took {time.perf_counter() - t:.1f} s")
