"""FSDP+SP: ``ulysses`` composed with ``fsdp2`` through omnicore's ``parallelize()`` on the real mesh,
against one process (core harness ``omnicore.testing.distributed``).

On 2 processes the mesh is ``dp_shard 1 x sp 2``: FSDP2 shards every dense parameter over the
derived ``fsdp`` dim (``dp_shard x ep x sp``, here the 2 sp ranks) and averages the gradients over
it; Ulysses splits the packed row. The case ``all`` (odd length, packing across the shard boundary,
one KV head, image input and target spans) is used. Gradients are gathered from FSDP2's DTensor
shards (``full_tensor``). Loss: relative difference at most 1e-5; gradients: at most 1e-4 of the
largest reference gradient per parameter (floored as in ``test_ulysses``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.multiprocess

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cases  # noqa: E402
from test_ulysses import _compare, _reference  # noqa: E402

from omnicore.testing.distributed import run_distributed  # noqa: E402


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def fsdp_sp_rank(case: str, parallel: dict, strategy: str = "ulysses") -> dict:
    """One rank: ParallelState from ``parallel`` sizes, ``[ulysses, fsdp2]`` by parallelize()."""
    import torch.distributed as dist

    from omnicore.api import FSDP2
    from omnicore.testing import init_parallel_state, parallelize
    from omnicore_parallel_ulysses.strategy import AsyncUlysses, Ulysses

    state = init_parallel_state("cpu", "gloo", parallel)
    model, batch, n = cases.build(case)
    sp = (AsyncUlysses if strategy == "async_ulysses" else Ulysses)({})
    model = parallelize(model, state, [("fsdp2", FSDP2()), (strategy, sp)])  # phases order them
    data_rank, data_size = sp.data_split(state)
    # as the training loop does: global target count (each data group holds this row), loss scaled
    # by the world size (FSDP2 averages gradients over every rank)
    model.zero_grad(set_to_none=True)
    out = model(batch)
    (out.loss_sum * state.world_size / (n * data_size)).backward()
    grads = {k: _full(p.grad if p.grad is not None else torch.zeros_like(p)) for k, p in model.named_parameters()}
    total = out.loss_sum.detach().clone()
    dist.all_reduce(total)
    return {"loss": total / data_size, "grads": grads, "data": (data_rank, data_size), "fsdp": state.size("fsdp")}


@pytest.mark.parametrize("strategy", ["ulysses", "async_ulysses"])
def test_fsdp2_with_ulysses_sp2_matches_one_process(strategy):
    t = time.perf_counter()
    want_loss, want_grads = _reference("all")
    ranks = run_distributed(fsdp_sp_rank, 2, args=("all", {"dp_shard": 1, "sp": 2}, strategy))
    for r, got in enumerate(ranks):
        assert got["fsdp"] == 2 and got["data"] == (0, 1)
        dl, dg = _compare("all", got, want_loss, want_grads)
        print(f"FSDP2+{strategy} SP2 rank {r}: loss rel diff {dl:.2e}, grad diff {dg:.2e}")
    print(f"took {time.perf_counter() - t:.1f} s")


def test_hsdp_with_ulysses_matches_one_process():
    """HSDP + SP on 4 ranks: dp_replicate 2 x sp 2 (FSDP2 over the sp ranks of each replica, replicated
    across the two), each replica reading its own copy of the row."""
    want_loss, want_grads = _reference("all")
    ranks = run_distributed(fsdp_sp_rank, 4, args=("all", {"dp_replicate": 2, "dp_shard": 1, "sp": 2}))
    for r, got in enumerate(ranks):
        assert got["fsdp"] == 2 and got["data"][1] == 2
        dl, dg = _compare("all", got, want_loss, want_grads)
        print(f"HSDP 2 x SP2 rank {r}: loss rel diff {dl:.2e}, grad diff {dg:.2e}")
