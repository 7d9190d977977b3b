"""Expert parallelism (``ep``) and COMET-style overlap (``comet_ep``) against one process.

The foundation is a tiny, unmodified transformers Qwen3-MoE (4 experts, top-2, 3 layers). Routing
of layers 0 and 1 is forced from outside (a forward hook on each router that picks the experts by
position and keeps the router's softmax weights, so the router still gets gradients):

* layer 0: no token picks expert 3 (with EP 4, rank 3 receives no tokens at all), and several tokens
  pick the same expert twice in their top-2;
* layer 1: every token picks experts 0 and 1 only (with EP 2, rank 1 receives nothing; with EP 4,
  ranks 2 and 3);
* layer 2: the model's own router (uneven splits that differ between ranks).

Each rank takes its own rows of the global batch (the ep ranks are data-parallel for everything but
the experts); its loss is its token-loss sum over the *global* token count, so the ranks' losses add
up to the one-process loss. Gradients: expert gradients are gathered from their DTensor shards;
dense gradients are summed over ranks (plain EP) or reduce-scattered by FSDP2 (FSDP+EP, loss scaled
by the world size since FSDP2 averages).
"""

from __future__ import annotations

import time

import pytest
import torch

from omnicore.data.packing import MicroBatch
from omnicore.testing.distributed import max_rel_diff, run_distributed

B, L = 4, 8  # global batch: rows x tokens
LOSS_TOL, GRAD_TOL = 1e-5, 1e-4

LAYER0 = [[0, 0], [2, 2], [1, 2], [0, 2], [2, 1], [1, 1], [0, 1], [2, 0]]  # never expert 3; duplicates
LAYER1 = [[0, 1], [1, 0], [0, 0], [1, 1], [1, 0], [0, 1], [0, 0], [1, 0]]  # only experts 0 and 1


def _force(table: list[list[int]]):
    idx_table = torch.tensor(table)

    def hook(module, args, out):
        logits = out[0]
        idx = idx_table[torch.arange(logits.shape[0]) % L]
        probs = torch.softmax(logits.float(), dim=-1)
        w = probs.gather(1, idx)
        w = w / w.sum(dim=-1, keepdim=True)
        return logits, w.to(logits.dtype), idx

    return hook


def build_model(seed: int = 0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=64,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg).float()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0)
            layer.mlp.experts.gate_up_proj.normal_(0, 0.3)
            layer.mlp.experts.down_proj.normal_(0, 0.3)
    model.model.layers[0].mlp.gate.register_forward_hook(_force(LAYER0))
    model.model.layers[1].mlp.gate.register_forward_hook(_force(LAYER1))
    return model


def batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (B, L), generator=g)


def loss_of(model, ids: torch.Tensor, n_global: int) -> torch.Tensor:
    logits = model(input_ids=ids).logits
    return (
        torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1), reduction="sum")
        / n_global
    )


def omni(lm):
    from omnicore.model.omni import OmniModel

    return OmniModel(lm, {}, {}, {"encoder": {}, "decoder": {}, "decoder_start": {}})


def omni_loss(model, rows: torch.Tensor, n_global: int) -> torch.Tensor:
    """The rows packed into one ``[1, rows*L]`` sequence (positions restart per row), as the
    training loop feeds :class:`OmniModel`; loss = token-loss sum / global target count."""
    labels = torch.full_like(rows, -100)
    labels[:, :-1] = rows[:, 1:]
    pos = torch.arange(L).repeat(rows.shape[0]).view(1, -1)
    return model(MicroBatch(rows.reshape(1, -1), labels.reshape(1, -1), pos)).loss_sum / n_global


def reference(packed: bool = False) -> dict:
    model = omni(build_model()) if packed else build_model()
    ids = batch()
    loss = (omni_loss if packed else loss_of)(model, ids, B * (L - 1))
    loss.backward()
    return {"loss": loss.detach(), "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()}}


def _full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _grads(model, reduce_dense: bool) -> dict:
    import torch.distributed as dist

    out = {}
    for n, p in model.named_parameters():
        g = _full(p.grad).detach().clone()
        if reduce_dense and ".experts." not in n:
            dist.all_reduce(g)  # plain EP: the dense parameters are data-parallel, reduce by hand
        out[n] = g
    return out


def ep_rank(ep: int, strategy: str = "ep", chunks: int = 1) -> dict:
    """One rank of plain EP over every rank: the strategy's expert sharding
    (``apply_expert_parallel`` with its plan, chunks and dispatcher) on a 1-D mesh named ``ep``;
    dense gradients summed by hand. ``strategy``: ``ep`` or ``comet_ep``."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    assert world == ep
    mesh = init_device_mesh("cpu", (ep,), mesh_dim_names=("ep",))
    model = build_model()
    from omnicore.parallel.expert import ExpertParallel, apply_expert_parallel

    if strategy == "comet_ep":
        from omnicore_parallel_comet.strategy import CometExpertParallel

        s = CometExpertParallel({"chunks": chunks})
    else:
        s = ExpertParallel({})
    # the strategy's expert sharding on the bare 1-D ep mesh, without FSDP (apply(model, state) adds FSDP)
    apply_expert_parallel(model, mesh, plan=s.expert_plan, chunks=s.chunks, dispatcher=s.dispatcher())
    rows = B // world
    t0 = time.perf_counter()
    loss = loss_of(model, batch()[rank * rows : (rank + 1) * rows], B * (L - 1))
    loss.backward()
    elapsed = time.perf_counter() - t0
    total = loss.detach().clone()
    dist.all_reduce(total)
    return {"loss": total, "grads": _grads(model, reduce_dense=True), "step_s": elapsed}


def fsdp_ep_rank(ep: int, dp_shard: int, strategy: str = "ep", chunks: int = 2) -> dict:
    """One rank of FSDP+EP through omnicore's real path: ParallelState with ``parallel`` sizes,
    the built-in ``ep`` (or ``comet_ep``) and ``fsdp2`` strategies, ``parallelize()`` (experts phase,
    then FSDP2 of blocks and root over ``fsdp``), an :class:`OmniModel` on packed rows."""
    import torch.distributed as dist

    from omnicore.parallel.fsdp import FSDP2
    from omnicore.parallel.parallelize import parallelize
    from omnicore.parallel.state import init_parallel_state

    state = init_parallel_state("cpu", "gloo", {"dp_replicate": 1, "dp_shard": dp_shard, "ep": ep, "sp": 1})
    if strategy == "comet_ep":
        from omnicore_parallel_comet.strategy import CometExpertParallel

        s = CometExpertParallel({"chunks": chunks})
    else:
        from omnicore.registry import Registry

        s = Registry.from_plugins([], builtins=True).build("parallel", "ep", {})
    model = parallelize(omni(build_model()), state, [("fsdp2", FSDP2()), (strategy, s)])  # phases order them
    rows = B // state.dp_size
    mine = batch()[state.dp_rank * rows : (state.dp_rank + 1) * rows]
    loss = omni_loss(model, mine, B * (L - 1))
    (loss * state.dp_size).backward()  # FSDP2 averages gradients over the dp ranks (as the loop scales)
    total = loss.detach().clone()
    dist.all_reduce(total)
    return {"loss": total, "grads": _grads(model, reduce_dense=False)}


def four_ranks() -> dict:
    """The one 4-process run: EP 4 (one expert per rank; rank 3 gets no tokens in layer 0, ranks 2
    and 3 none in layer 1), then EP 2 x dp_shard 2 with FSDP2 (4 experts over 2 ep ranks, each
    expert's weights sharded again over 2 dp_shard ranks)."""
    return {"ep4": ep_rank(4), "ep2_dp2": fsdp_ep_rank(2, 2)}


@pytest.fixture(scope="module")
def ref() -> dict:
    return reference()


@pytest.fixture(scope="module")
def ref_packed() -> dict:
    return reference(packed=True)


@pytest.fixture(scope="module")
def ep2() -> list:
    return run_distributed(ep_rank, 2, args=(2,))


def _check(result: dict, ref: dict, label: str = "") -> tuple[float, float]:
    assert set(result["grads"]) == set(ref["grads"])
    dl = max_rel_diff(result["loss"], ref["loss"])
    dg = max(max_rel_diff(result["grads"][n], g) for n, g in ref["grads"].items())
    print(f"{label}: loss rel diff {dl:.2e}, max grad rel diff {dg:.2e}")
    assert dl <= LOSS_TOL, f"loss rel diff {dl:.2e}"
    assert dg <= GRAD_TOL, f"grad rel diff {dg:.2e}"
    return dl, dg


@pytest.mark.slow
def test_reference_routing_covers_the_edge_cases(ref):
    """The forced routing really leaves expert 3 without tokens in layer 0 and experts 2, 3 in
    layer 1 (zero gradients), while the other experts get gradients."""
    g0 = ref["grads"]["model.layers.0.mlp.experts.gate_up_proj"]
    g1 = ref["grads"]["model.layers.1.mlp.experts.gate_up_proj"]
    assert g0[3].abs().max() == 0 and all(g0[e].abs().max() > 0 for e in range(3))
    assert g1[2:].abs().max() == 0 and g1[:2].abs().max() > 0


@pytest.mark.multiprocess
def test_ep2_matches_one_process(ref, ep2):
    for r, res in enumerate(ep2):
        _check(res, ref, f"EP2 rank {r}")


@pytest.mark.multiprocess
def test_comet_overlap_matches_ep(ref, ep2):
    """COMET with 3 chunks (2 rows x 8 tokens per rank: uneven chunks) gives plain EP's numbers."""
    comet = run_distributed(ep_rank, 2, args=(2, "comet_ep", 3))
    for r, res in enumerate(comet):
        _check(res, ref, f"COMET rank {r}")
    dl = max_rel_diff(comet[0]["loss"], ep2[0]["loss"])
    dg = max(max_rel_diff(comet[0]["grads"][n], g) for n, g in ep2[0]["grads"].items())
    print(f"COMET vs EP: loss {dl:.2e}, grads {dg:.2e}")
    assert dl <= 1e-6 and dg <= 1e-5


@pytest.mark.multiprocess
def test_fsdp_ep_matches_one_process(ref_packed):
    """FSDP+EP on 2 ranks: experts EP 2, everything else FSDP2 over both ranks."""
    for r, res in enumerate(run_distributed(fsdp_ep_rank, 2, args=(2, 1))):
        _check(res, ref_packed, f"FSDP+EP rank {r}")


@pytest.mark.multiprocess
def test_fsdp_comet_matches_one_process(ref_packed):
    for r, res in enumerate(run_distributed(fsdp_ep_rank, 2, args=(2, 1, "comet_ep", 2))):
        _check(res, ref_packed, f"FSDP+COMET rank {r}")


@pytest.mark.multiprocess
def test_ep4_and_ep2_x_dp_shard2_on_four_processes(ref, ref_packed):
    ranks = run_distributed(four_ranks, 4)
    for r, res in enumerate(ranks):
        _check(res["ep4"], ref, f"EP4 rank {r}")
        _check(res["ep2_dp2"], ref_packed, f"EP2xFSDP2 rank {r}")


def test_strategy_registered_and_plan():
    from omnicore.parallel.expert import DEFAULT_PLAN, ExpertParallel, match_plan, plan_problems
    from omnicore.registry import Registry

    s = Registry.from_plugins([], builtins=True).build("parallel", "ep", {})
    assert isinstance(s, ExpertParallel) and s.mesh_dims == ("ep",) and s.phase == "experts"
    model = build_model()
    assert list(match_plan(model, DEFAULT_PLAN)) == [f"model.layers.{i}.mlp.experts" for i in range(3)]
    assert plan_problems(model, 2) == [] and plan_problems(model, 4) == []
    assert "not divisible by parallel.ep = 3" in plan_problems(model, 3)[0]
    assert "no parameter matches" in plan_problems(model, 2, {"*.nothing": "Shard(0)"})[0]


@pytest.mark.cli
def test_comet_plugin_hook_module_is_torch_free():
    import subprocess
    import sys

    code = "import sys, omnicore_parallel_comet.plugin as p; specs = p.omnicore_parallel_strategies(); assert specs[0].name == 'comet_ep'; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
