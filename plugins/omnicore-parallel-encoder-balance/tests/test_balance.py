"""``encoder_balance`` on 2 and 4 gloo processes against one process and against the same layout
without it: the rows of ``balance_cases`` (uneven items, a rank with no item, image and audio encoders).

Each layout runs the four rows once: every data group reads its rows one per micro-step
(:func:`balance_cases.rows_of`), the loss of each is ``loss_sum * world / targets`` (FSDP2 averages
gradients over the world; the raw layout sums them itself), and each rank returns the whole loss
(all-reduced), every gradient gathered whole, how often each encoder module ran, and the
balancer's statistics. Tolerances: loss relative difference at most 1e-5; each gradient at most
1e-5 of the parameter's largest reference gradient (floored at 1e-3 of the model's largest: a
gradient that is zero in exact arithmetic is round-off). The balanced layouts must also have moved
items (so the comparison is not vacuous) and evened the ranks' encoder costs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import balance_cases as cases  # noqa: E402

from omnicore.testing.distributed import max_rel_diff, run_distributed  # noqa: E402

pytestmark = pytest.mark.multiprocess

LOSS_TOL = 1e-5
GRAD_TOL = 1e-5
BALANCE = {"name": "encoder_balance", "options": {"min_spread": 1.0}}


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def layout_run(parallel: dict) -> dict:
    """One layout on this rank (the process group is up): ``parallel`` is the config's section,
    or with ``raw: true`` the balancer alone, applied by hand, gradients summed by all-reduce."""
    import torch.distributed as dist

    from omnicore.api import Registry
    from omnicore.testing import init_parallel_state, parallelize
    from omnicore_parallel_encoder_balance.strategy import EncoderBalance

    mesh = {k: v for k, v in parallel.items() if k not in ("raw", "strategies")}
    state = init_parallel_state("cpu", "gloo", mesh)
    model = cases.build_model()
    calls = {m: 0 for m in model.encoders}
    for m, enc in model.encoders.items():
        enc.register_forward_pre_hook(lambda *_, m=m: calls.__setitem__(m, calls[m] + 1))
    raw = parallel.get("raw", False)
    applied: list[str] = []
    if raw:
        strategies = [("encoder_balance", EncoderBalance(BALANCE["options"]))]
        model = strategies[0][1].apply(model, state)
        applied.append("encoder_balance")
    else:
        registry = Registry.discover()
        named = [c if isinstance(c, dict) else {"name": c} for c in parallel["strategies"]]
        strategies = [(c["name"], registry.build("parallel", c["name"], c.get("options", {}))) for c in named]
        for name, s in strategies:  # record the order parallelize applies them in
            s.apply = (lambda f, name: lambda *a: (applied.append(name), f(*a))[1])(s.apply, name)
        model = parallelize(model, state, strategies)
    # as the training loop asks: the first strategy with a data_split (Ulysses), else one group per dp rank
    split = next((s.data_split for _, s in strategies if hasattr(s, "data_split")), None)
    data_rank, data_size = split(state) if split else (state.dp_rank, state.dp_size)
    n = cases.total_targets(model)
    scale = 1.0 if raw else state.world_size
    model.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for k in cases.rows_of(data_rank, data_size):
        mb, _ = cases.build_row(model, k)
        out = model(mb)
        (out.loss_sum * scale / n).backward()
        total += out.loss_sum.detach()
    dist.all_reduce(total)
    grads = {}
    for name, p in model.named_parameters():
        g = _full(p.grad if p.grad is not None else torch.zeros_like(p))
        if raw:
            dist.all_reduce(g)
        grads[name] = g
    hook = next((s.hook for n_, s in strategies if n_ == "encoder_balance"), None)
    return {
        "loss": total,  # under Ulysses the ranks of a data group each hold their part of its rows' loss
        "grads": grads,
        "calls": calls,
        "order": applied,
        "data": (data_rank, data_size),
        "stats": None if hook is None else {m: vars(s) for m, s in hook.stats.items()},
    }


def layouts_run(layouts: dict[str, dict]) -> dict:
    return {name: layout_run(p) for name, p in layouts.items()}


def _grad_gap(got: dict, want: dict) -> float:
    floor = 1e-3 * max(float(g.abs().max()) for g in want.values())
    return max(float((got[k] - g).abs().max()) / max(float(g.abs().max()), floor) for k, g in want.items())


def _check(ranks: list[dict], ref: dict, balanced: list[str], plain: str | None) -> None:
    for r, res in enumerate(ranks):
        for name, got in res.items():
            dl, dg = max_rel_diff(got["loss"], ref["loss"]), _grad_gap(got["grads"], ref["grads"])
            print(f"rank {r} {name}: order {got['order']}, loss rel diff {dl:.1e}, grad gap {dg:.1e}, calls {got['calls']}")
            assert dl <= LOSS_TOL and dg <= GRAD_TOL, (r, name, dl, dg)
        for name in balanced:
            got = res[name]
            # every rank called every encoder once per micro-step, as without balancing
            steps = len(cases.rows_of(*got["data"]))
            assert got["calls"] == {m: steps for m in got["calls"]}, (name, got["calls"])
            image = got["stats"]["image"]
            assert image["moved"] > 0 and image["calls"] == steps, (name, image)
            pairs = list(zip(image["spread_after"], image["spread_before"]))
            assert all(a <= b for a, b in pairs) and any(a < b for a, b in pairs), (name, image)
            if plain is not None:  # the same layout without encoder_balance: the same numbers
                assert max_rel_diff(got["loss"], res[plain]["loss"]) <= LOSS_TOL
                assert _grad_gap(got["grads"], res[plain]["grads"]) <= GRAD_TOL, name
    # the statistics come from gathered numbers: every rank has the same
    for name in balanced:
        assert all(res[name]["stats"] == ranks[0][name]["stats"] for res in ranks), name


@pytest.fixture(scope="module")
def ref() -> dict:
    return cases.reference()


def test_two_processes_equal_one_and_the_run_without_it(ref):
    """2 ranks, two micro-steps each: rows (0, 2) then (1, 3). The first pairs 5 images and 2
    clips with a text-only row (rank 1 has no item and encodes some of rank 0's); the second
    holds one clip on rank 0 and one image on rank 1 (each modality on one rank only)."""
    t = time.perf_counter()
    layouts = {
        "raw": {"raw": True},
        "fsdp2": {"strategies": ["fsdp2"]},
        "fsdp2+balance": {"strategies": ["fsdp2", BALANCE]},
    }
    ranks = run_distributed(layouts_run, 2, args=(layouts,))
    _check(ranks, ref, ["raw", "fsdp2+balance"], "fsdp2")
    stats = ranks[0]["fsdp2+balance"]["stats"]
    # the first micro-step: 80 image tokens' worth on rank 0, none on rank 1; balanced to 3 + 2 images
    assert stats["image"]["spread_before"][0] == 2.0 and stats["image"]["spread_after"][0] == pytest.approx(1.2)
    assert ranks[0]["fsdp2+balance"]["order"] == ["encoder_balance", "fsdp2"]  # the attention phase comes first
    print(f"took {time.perf_counter() - t:.1f} s")


def test_four_processes_fsdp2_hsdp_and_ulysses_equal_one(ref):
    """4 ranks: FSDP2 over 4 (each rank one row: rank 2 has none), HSDP 2 x 2, and Ulysses SP 2
    with two data groups (each sp position balances over its own dp group of 2)."""
    t = time.perf_counter()
    layouts = {
        "fsdp2": {"strategies": ["fsdp2"]},
        "fsdp2+balance": {"strategies": ["fsdp2", BALANCE]},
        "hsdp+balance": {"dp_replicate": 2, "strategies": ["fsdp2", BALANCE]},
        "ulysses+balance": {"sp": 2, "strategies": ["fsdp2", BALANCE, "ulysses"]},
    }
    ranks = run_distributed(layouts_run, 4, args=(layouts,))
    _check(ranks, ref, ["fsdp2+balance", "hsdp+balance", "ulysses+balance"], "fsdp2")
    assert ranks[0]["ulysses+balance"]["order"] == ["encoder_balance", "ulysses", "fsdp2"]
    assert [res["ulysses+balance"]["data"] for res in ranks] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    print(f"took {time.perf_counter() - t:.1f} s")
