"""Ulysses and Async-Ulysses against one process: real values from tiny models on gloo.

Each distributed test spawns the ranks once and runs several cases in them (see ``cases.py``):
a length not divisible by SP, one KV head with SP 2, a packed row whose second sample crosses the
shard boundary, an image placeholder span straddling the boundary, and all of them at once (with an
image target span for the decoder loss), and an mRoPE (qwen2_vl) foundation with images in packed
samples, whose 3-D positions the sequence hook must cut like the 1-D ones. Loss: relative
difference at most 1e-5; gradients: the largest difference at most 1e-4 of the largest reference
gradient, per parameter (floored at 1e-3 of the model's largest gradient).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cases  # noqa: E402

from omnicore.testing.distributed import run_distributed  # noqa: E402

STRATEGIES = ("ulysses", "async_ulysses")


def _worker(rank: int, world: int, names: list[str], out: str, sp: int | None) -> None:
    import torch.distributed as dist

    from omnicore_parallel_ulysses.strategy import AsyncUlysses, Ulysses

    for name in names:
        for strategy in STRATEGIES:
            model, batch, n = cases.build(name)
            cls = AsyncUlysses if strategy == "async_ulysses" else Ulysses
            s = cls({"sp": sp} if sp else {})
            stock = _foundation_logits(model, batch)
            model = s.apply(model, None)
            if stock is not None:  # generation calls the foundation without the global positions: stock attention
                torch.testing.assert_close(_foundation_logits(model, batch), stock, atol=1e-6, rtol=0)
            seen = _record_inner(s, name)
            data_rank, data_size = s.data_split(None)
            # as the training loop does: the global target count (each of the data_size groups has
            # this row's n), and the world over which gradients are averaged
            loss, grads = cases.loss_and_grads(model, batch, n * data_size, scale=world)
            total = loss.clone()
            dist.all_reduce(total)
            total = total / data_size  # the row's loss sum (each data group computed the whole row)
            if rank == 0:
                torch.save(
                    {"loss": total, "grads": grads, "data": (data_rank, data_size), "local": loss, "inner_position_ids": seen},
                    f"{out}/{name}-{strategy}.pt",
                )


def _foundation_logits(model, batch) -> torch.Tensor | None:
    """For an mRoPE case: the foundation's logits on the whole row called directly (as generation
    does, without Ulysses' keyword argument), positions ``[4, 1, T]``; None otherwise."""
    if model.rope is None:
        return None
    pos = torch.cat([batch.position_ids[None], batch.rope_position_ids])
    with torch.no_grad():
        return model.lm(input_ids=batch.input_ids, position_ids=pos, use_cache=False).logits


def _record_inner(s, name: str) -> list:
    """For a varlen case: check that the varlen kernel is Ulysses' core and record the position_ids
    each of its calls gets (they must be the whole row's, not this rank's slice)."""
    seen: list = []
    if cases.CASES[name].get("attention") != "sdpa_varlen":
        assert s.state.inner is None  # sdpa: the dense-mask core
        return seen
    from omnicore.testing import sdpa_varlen_attention_forward

    assert s.state.inner is sdpa_varlen_attention_forward

    def inner(module, q, k, v, mask, **kw):
        seen.append(kw["position_ids"].clone())
        assert mask is None and q.shape[2] == kw["position_ids"].shape[-1]  # full sequence after the all-to-all
        return sdpa_varlen_attention_forward(module, q, k, v, mask, **kw)

    s.state.inner = inner
    return seen


def _reference(name: str):
    model, batch, n = cases.build(name)
    return cases.loss_and_grads(model, batch, n)


def _compare(name: str, got: dict, want_loss: torch.Tensor, want_grads: dict) -> tuple[float, float]:
    rel_loss = float((got["loss"] - want_loss).abs() / want_loss.abs())
    worst = _grad_gap(got["grads"], want_grads)
    assert rel_loss <= 1e-5, f"{name}: loss relative difference {rel_loss:.2e}"
    assert worst <= 1e-4, f"{name}: gradient difference {worst:.2e} of the largest gradient"
    return rel_loss, worst


def _grad_gap(got: dict, want: dict) -> float:
    """The largest gradient difference, per parameter relative to the parameter's largest reference
    gradient, floored at 1e-3 of the model's largest (a gradient that is zero in exact arithmetic,
    such as a key bias under softmax, is noise ~1e-11)."""
    floor = 1e-3 * max(float(g.abs().max()) for g in want.values())
    return max(float((got[k] - g).abs().max()) / max(float(g.abs().max()), floor) for k, g in want.items())


def _rank_main(names: list[str], out: str, sp: int | None) -> None:
    """One rank under omnicore's harness (the process group is up): run the cases."""
    import torch.distributed as dist

    _worker(dist.get_rank(), dist.get_world_size(), names, out, sp)


def _run(world: int, names: list[str], tmp_path: Path, sp: int | None = None) -> dict:
    run_distributed(_rank_main, world, args=(names, str(tmp_path), sp))
    report = {}
    for name in names:
        want_loss, want_grads = _reference(name)
        results = {s: torch.load(tmp_path / f"{name}-{s}.pt") for s in STRATEGIES}
        for s, got in results.items():
            report[(name, s)] = _compare(name, got, want_loss * 1.0, want_grads)
            if cases.CASES[name].get("attention") == "sdpa_varlen":
                _check_inner_positions(name, got["inner_position_ids"], world if sp is None else sp)
        # Async-Ulysses gives the numbers of Ulysses
        a, b = results["ulysses"], results["async_ulysses"]
        torch.testing.assert_close(a["loss"], b["loss"], rtol=1e-6, atol=0)
        for k in a["grads"]:
            torch.testing.assert_close(a["grads"][k], b["grads"][k], rtol=1e-5, atol=1e-7)
    print({f"{k[0]}/{k[1]}": f"loss {v[0]:.1e} grad {v[1]:.1e}" for k, v in report.items()})
    return report


def _check_inner_positions(name: str, seen: list, sp: int) -> None:
    """Every call of the varlen core (one per layer) got the whole row's position_ids, padded to a
    multiple of ``sp`` by a sample of its own."""
    lengths = cases.CASES[name]["samples"]
    t = sum(lengths)
    pad = -t % sp
    want = torch.cat([torch.arange(n) for n in lengths + ([pad] if pad else [])]).unsqueeze(0)
    assert len(seen) == cases.TINY_LM["num_hidden_layers"]
    for pos in seen:
        assert torch.equal(pos, want), f"{name}: the varlen core got position_ids {pos.tolist()}"


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "names", [["odd_length", "gqa_one_kv_head"], ["packed_crossing", "image_straddling"]], ids=["odd-length+gqa", "packed+image"]
)
def test_sp2_matches_one_process(names, tmp_path):
    _run(2, names, tmp_path)


@pytest.mark.multiprocess
def test_sp2_varlen_core_matches_one_process(tmp_path):
    """``model.kernels.attention: sdpa_varlen`` under Ulysses SP 2: the varlen kernel is the core on the full
    sequence (given the global position_ids, no mask) and the losses and gradients equal one
    process with sdpa_varlen; Async-Ulysses gives the same numbers."""
    _run(2, ["packed_varlen", "all_varlen"], tmp_path)


@pytest.mark.multiprocess
def test_sp2_mrope_with_images_matches_one_process(tmp_path):
    """A qwen2_vl foundation (mRoPE) and packed samples with images: the sequence hook cuts the 3-D
    ``rope_position_ids`` like ``position_ids`` (an image straddles the boundary; one row needs a
    padding sample), the attention keeps samples apart by the 1-D row (the varlen core gets exactly
    that row), and SP 2 gives one process's loss and gradients, with sdpa and sdpa_varlen, Ulysses
    and Async-Ulysses; the foundation called directly (generation) still gives its stock logits.
    The case is one where the 3-D positions matter: the 1-D ones give another loss."""
    names = ["mrope_images", "mrope_varlen"]
    for name in names:
        model, batch, n = cases.build(name)
        rope, flat = batch.rope_position_ids, batch.position_ids
        assert rope.shape == (3, *flat.shape) and not torch.equal(rope[1], flat) and not torch.equal(rope[0], rope[2])
        _, want = cases.loss_and_grads(model, batch, n)
        _, text_layout = cases.loss_and_grads(model, dataclasses.replace(batch, rope_position_ids=None), n)
        assert _grad_gap(text_layout, want) > 1e-2, name  # 100 times the tolerance of _compare
    report = _run(2, names, tmp_path)
    assert set(report) == {(n, s) for n in names for s in STRATEGIES}


@pytest.mark.multiprocess
def test_sp4_everything_at_once(tmp_path):
    """4 processes, SP 4: odd length, packing across boundaries, one KV head (replicated 4 times),
    image input and target spans across shards."""
    _run(4, ["all"], tmp_path)


@pytest.mark.multiprocess
def test_dp2_x_sp2_splits_data_by_group(tmp_path):
    """4 processes as 2 SP groups of 2 (no mesh sp dim: groups built from the world): both groups
    compute the same row here, so the summed loss over the world is twice the row's; gradients
    averaged over all 4 ranks equal the one-process gradients."""
    _run(4, ["all"], tmp_path, sp=2)
    got = torch.load(tmp_path / "all-ulysses.pt")
    assert got["data"] == (0, 2)


@pytest.mark.cli
def test_listed_by_omnicore_plugins():
    out = subprocess.run([sys.executable, "-m", "omnicore", "plugins", "--kind", "parallel"], capture_output=True, text=True, check=True)
    for name in STRATEGIES:
        row = next(line for line in out.stdout.splitlines() if line.split()[1:2] == [name])
        assert row.split()[2] == "omnicore-parallel-ulysses" and "available" in row.split()


def test_head_checks_name_what_to_change():
    from types import SimpleNamespace

    from omnicore_parallel_ulysses.strategy import Ulysses

    with pytest.raises(ValueError, match="num_attention_heads=6 is not divisible by sp=4"):
        Ulysses.check_heads(SimpleNamespace(num_attention_heads=6, num_key_value_heads=2), 4)
    with pytest.raises(ValueError, match="num_key_value_heads=3 and sp=2"):
        Ulysses.check_heads(SimpleNamespace(num_attention_heads=6, num_key_value_heads=3), 2)
    Ulysses.check_heads(SimpleNamespace(num_attention_heads=4, num_key_value_heads=1), 4)
