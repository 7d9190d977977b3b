"""Compositions of strategies through ``parallelize()`` on omnicore's one mesh, against one process.

FSDP+SP+EP: the tiny, unmodified transformers Qwen3-MoE of ``test_expert_parallel`` (4 experts,
top-2, forced routing in layers 0 and 1: an expert with no tokens, duplicate experts in a top-2)
inside an :class:`OmniModel`, on 4 processes (one run) as ``dp_shard 1 x ep 2 x sp 2`` with the strategies
``[ulysses, ep, fsdp2]``:

* the two ep ranks of a pair read different rows (2 packed rows of 8 tokens each), and the two sp
  ranks of a group split those 16 tokens (Ulysses all-to-alls around attention);
* experts are ``Shard(0)`` over ``ep`` and ``fully_shard``-ed over ``dp_shard_sp`` (the sp pair);
* every dense parameter is FSDP2-sharded over ``fsdp`` = ``dp_shard x ep x sp`` (all 4 ranks).

The same run then does FSDP+SP with two data groups, ``dp_shard 2 x sp 2`` and ``[ulysses, fsdp2]``
(the experts run unsplit on every rank). The forced routing picks experts by a token's index modulo
the row length 8; each rank holds exactly one row's 8 tokens under SP 2, so it routes as on one
process.

The loss is each rank's token-loss sum over the global target count, scaled by the world size for
the backward (FSDP2 averages), as the training loop does. Loss: relative difference at most 1e-5
of one process; every gradient (gathered from its DTensor shards) at most 1e-4.
"""

from __future__ import annotations

import time

import pytest
import torch
from test_expert_parallel import GRAD_TOL, LOSS_TOL, B, L, batch, build_model, omni, omni_loss, reference

from omnicore.testing.distributed import max_rel_diff, run_distributed


def fsdp_sp_ep_rank(parallel: dict) -> dict:
    import torch.distributed as dist

    from omnicore.config import ParallelConfig
    from omnicore.parallel.parallelize import build_strategies, parallelize
    from omnicore.parallel.state import init_parallel_state
    from omnicore.registry import Registry

    pcfg = ParallelConfig.model_validate(parallel)
    state = init_parallel_state("cpu", "gloo", pcfg)
    registry = Registry.discover()  # the installed plugins: ulysses comes from omnicore-parallel-ulysses
    strategies = build_strategies(pcfg, registry, True)
    model = parallelize(omni(build_model()), state, strategies)
    data = next(s for _, s in strategies if hasattr(s, "data_split"))
    data_rank, data_size = data.data_split(state)
    assert (data_rank, data_size) == (state.dp_rank, state.dp_size)
    rows = B // data_size
    mine = batch()[data_rank * rows : (data_rank + 1) * rows]
    loss = omni_loss(model, mine, B * (L - 1))
    (loss * state.world_size).backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[n] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return {
        "loss": total,
        "grads": grads,
        "order": [n for n, _ in strategies],
        "fsdp": state.size("fsdp"),
        "experts_fsdp": state.size("dp_shard_sp"),
    }


FSDP_SP_EP = {"dp_shard": 1, "ep": 2, "sp": 2, "strategies": ["fsdp2", "ep", "ulysses"]}
FSDP_SP = {"dp_shard": 2, "sp": 2, "strategies": ["fsdp2", "ulysses"]}


def four_ranks() -> dict:
    """The one 4-process run: FSDP+SP+EP (dp_shard 1 x ep 2 x sp 2), then FSDP+SP with two data
    groups (dp_shard 2 x sp 2: FSDP2 over all 4 ranks, experts unsplit, computed locally)."""
    return {"fsdp_sp_ep": fsdp_sp_ep_rank(FSDP_SP_EP), "fsdp_sp": fsdp_sp_ep_rank(FSDP_SP)}


@pytest.mark.multiprocess
def test_fsdp_sp_ep_and_fsdp_sp_on_four_processes_match_one_process():
    t = time.perf_counter()
    ref = reference(packed=True)
    ranks = run_distributed(four_ranks, 4)
    for r, both in enumerate(ranks):
        res = both["fsdp_sp"]
        assert res["order"] == ["ulysses", "fsdp2"] and res["fsdp"] == 4
        dl = max_rel_diff(res["loss"], ref["loss"])
        dg = max(max_rel_diff(res["grads"][n], g) for n, g in ref["grads"].items())
        print(f"FSDP+SP (dp_shard 2 x sp 2) rank {r}: loss rel diff {dl:.2e}, max grad rel diff {dg:.2e}")
        assert dl <= LOSS_TOL and dg <= GRAD_TOL, (r, dl, dg)
        res = both["fsdp_sp_ep"]
        assert res["order"] == ["ulysses", "ep", "fsdp2"] and res["fsdp"] == 4 and res["experts_fsdp"] == 2
        assert set(res["grads"]) == set(ref["grads"])
        dl = max_rel_diff(res["loss"], ref["loss"])
        dg = max(max_rel_diff(res["grads"][n], g) for n, g in ref["grads"].items())
        print(f"FSDP+SP+EP rank {r}: loss rel diff {dl:.2e}, max grad rel diff {dg:.2e}")
        assert dl <= LOSS_TOL and dg <= GRAD_TOL, (r, dl, dg)
    print(f"took {time.perf_counter() - t:.1f} s")
