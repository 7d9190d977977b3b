"""Steps without an update: a NaN or inf loss or gradient norm (``train.on_nonfinite``) and a step
where no rank has a target. Each test runs the real training loop on the tiny text model and
compares parameters and AdamW state bit for bit across the step in question."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import pytest
import torch
from test_train_options import text_cfg, text_jsonl  # noqa: F401  (fixtures)

from omnicore.config import Config
from omnicore.model.omni import OmniModel
from omnicore.testing.distributed import run_distributed
from omnicore.train import loop
from omnicore.train.optim import NonFiniteError


def _config(cfg_dict: dict, out, **train) -> Config:
    d = copy.deepcopy(cfg_dict)
    d["run"]["output_dir"] = str(out)
    d["train"].update(train)
    cfg = Config.model_validate(d)
    cfg.source = str(out.parent / "config.yaml")
    return cfg


def _snapshot(run: loop.Run) -> dict:
    """Copies of the parameters, the AdamW state and the LR schedule position of ``run``."""
    params = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    optim = [{k: v.clone() if torch.is_tensor(v) else v for k, v in run.optimizer.state[p].items()} for p in run.model.parameters()]
    return {"params": params, "optim": optim, "sched": run.scheduler.last_epoch}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _same(a: dict, b: dict) -> bool:
    """Bit-for-bit equality of the parameters and AdamW states of two :func:`_snapshot` results
    (compares bytes, so NaN equals the same NaN); the schedule position is compared apart."""
    if a["params"].keys() != b["params"].keys() or len(a["optim"]) != len(b["optim"]):
        return False
    eq = lambda x, y: x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y))  # noqa: E731
    params = all(eq(a["params"][n], b["params"][n]) for n in a["params"])
    optim = all(sa.keys() == sb.keys() and all(eq(sa[k], sb[k]) for k in sa) for sa, sb in zip(a["optim"], b["optim"]))
    return params and optim


@pytest.fixture
def watch(monkeypatch):
    """Records, per 0-based step, snapshots before and after :func:`loop.apply_update`, and keeps
    the :class:`loop.Run` (also when the run raises)."""
    seen: dict = {"before": {}, "after": {}, "run": None}
    real_setup, real_apply = loop.setup, loop.apply_update

    def setup(*a, **k):
        seen["run"] = real_setup(*a, **k)
        return seen["run"]

    def apply_update(run, step, *a):
        seen["before"][step] = _snapshot(run)
        reason = real_apply(run, step, *a)
        seen["after"][step] = _snapshot(run)
        return reason

    monkeypatch.setattr(loop, "setup", setup)
    monkeypatch.setattr(loop, "apply_update", apply_update)
    return seen


def _inject_nan_loss(monkeypatch, calls: set[int]) -> None:
    """Make the model's loss sum NaN (and so its gradients) on the given 1-based forward calls."""
    real = OmniModel.forward
    count = [0]

    def forward(self, *a, **k):
        out = real(self, *a, **k)
        count[0] += 1
        if count[0] in calls:
            out.loss_sum = out.loss_sum * float("nan")
        return out

    monkeypatch.setattr(OmniModel, "forward", forward)


@pytest.mark.slow
def test_lr_1e6_stops_at_the_first_nan_step_without_saving_or_exporting(text_cfg, tmp_path, watch):  # noqa: F811
    cfg = _config(text_cfg, tmp_path / "nan", lr=1e6, max_steps=4, save_every=1, export=True)
    with pytest.raises(NonFiniteError) as info:
        loop.train(cfg)
    run = watch["run"]
    bad = max(watch["before"]) + 1  # the 1-based step that stopped the run
    assert bad == 2  # lr 1e6: step 1 is finite; step 2's loss is still finite, its gradient norm is NaN
    msg = str(info.value)
    assert re.match(r"non-finite training step 2: loss \d+\.\d+, gradient norm nan; stopped before the optimizer step", msg), msg
    assert "train.lr (now 1e+06)" in msg and "train.on_nonfinite skip" in msg
    ckpts = tmp_path / "nan" / "checkpoints"
    assert (ckpts / f"step-{bad - 1:08d}").is_dir() and not (ckpts / f"step-{bad:08d}").exists()
    assert (ckpts / "latest").read_text().strip().endswith(f"step-{bad - 1:08d}")
    assert not (tmp_path / "nan" / "export").exists()
    # the weights at the stop are those after the last finite step, and finite
    at_stop = _snapshot(run)
    assert _same(at_stop, watch["after"][bad - 2]) and _same(at_stop, watch["before"][bad - 1])
    assert all(torch.isfinite(p).all() for p in at_stop["params"].values())
    # ... and so are the weights in the last checkpoint (loaded into a model holding other weights)
    from omnicore.checkpoint.dcp import load_checkpoint

    with torch.no_grad():
        for p in run.model.parameters():
            p.zero_()
    load_checkpoint(ckpts / f"step-{bad - 1:08d}", run.model, None, None, run.state)
    assert all(torch.equal(p, at_stop["params"][n]) for n, p in run.model.named_parameters())
    # the metrics file holds the finite steps only
    rows = [json.loads(x) for x in (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, bad)) and all(math.isfinite(r["loss"]) for r in rows)


@pytest.mark.slow
def test_skip_leaves_weights_and_adamw_state_and_the_run_goes_on(text_cfg, tmp_path, watch, monkeypatch):  # noqa: F811
    plain = loop.train(_config(text_cfg, tmp_path / "plain", max_steps=4))
    _inject_nan_loss(monkeypatch, {2})  # grad_accum 1, one process: forward call 2 is step 2
    rows = loop.train(_config(text_cfg, tmp_path / "skip", max_steps=4, on_nonfinite="skip"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["skipped"] for r in rows] == [False, True, False, False]
    assert [r["skip_reason"] for r in rows] == [None, "nonfinite", None, None]
    assert [r["skipped_steps"] for r in rows] == [0, 1, 1, 1]
    assert math.isnan(rows[1]["loss"]) and math.isnan(rows[1]["grad_norm"])
    before, after = watch["before"][1], watch["after"][1]
    assert _same(before, after)  # parameters and AdamW state, bit for bit
    assert after["sched"] == before["sched"] + 1  # the LR schedule advanced ...
    assert [r["lr"] for r in rows] == [r["lr"] for r in plain]  # ... so the rates are those of a run without skips
    assert rows[0]["loss"] == plain[0]["loss"] and not _same(watch["before"][2], watch["after"][2])  # step 3 updates
    assert all(torch.isfinite(p).all() for p in watch["after"][3]["params"].values())
    written = [json.loads(x) for x in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    assert written[1]["loss"] is None and written[1]["skipped"] is True  # strict JSON: NaN written as null


@pytest.mark.slow
def test_skip_stops_after_max_skipped_steps_in_a_row(text_cfg, tmp_path, watch):  # noqa: F811
    cfg = _config(text_cfg, tmp_path / "many", lr=1e6, max_steps=8, on_nonfinite="skip", max_skipped_steps=2, save_every=1)
    with pytest.raises(NonFiniteError, match=r"non-finite training step 4: .*3 non-finite steps in a row; train.max_skipped_steps is 2"):
        loop.train(cfg)
    # steps 2 and 3 were skipped and saved with the weights of step 1; step 4 stopped the run
    assert _same(watch["after"][0], watch["after"][1]) and _same(watch["after"][0], watch["after"][2])
    assert _same(watch["after"][0], watch["before"][3]) and 3 not in watch["after"]
    assert [watch["after"][s]["sched"] for s in (0, 1, 2)] == [1, 2, 3]
    rows = [json.loads(x) for x in (tmp_path / "many" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["skipped"], r["skipped_steps"]) for r in rows] == [(1, False, 0), (2, True, 1), (3, True, 2)]
    ckpts = tmp_path / "many" / "checkpoints"
    assert not (ckpts / "step-00000004").exists()
    meta = json.loads((ckpts / "step-00000003" / "trainer_state.json").read_text())
    assert (meta["skipped_steps"], meta["nonfinite_in_row"]) == (2, 2)


@pytest.mark.slow
def test_a_step_without_targets_leaves_weights_and_adamw_state(text_cfg, tmp_path, watch, monkeypatch):  # noqa: F811
    from omnicore.data import pipeline

    real = pipeline.collate
    calls = [0]

    def collate(*a, **k):  # the micro-batch of step 2 (the second collate call) loses its targets
        mb = real(*a, **k)
        calls[0] += 1
        if calls[0] == 2:
            mb = dataclasses.replace(mb, labels=torch.full_like(mb.labels, -100), n_targets=0)
        return mb

    monkeypatch.setattr(pipeline, "collate", collate)
    rows = loop.train(_config(text_cfg, tmp_path / "empty", max_steps=3, weight_decay=0.1))
    assert [(r["targets"] == 0, r["skipped"], r["skip_reason"], r["skipped_steps"]) for r in rows] == [
        (False, False, None, 0),
        (True, True, "no_targets", 1),
        (False, False, None, 1),
    ]
    before, after = watch["before"][1], watch["after"][1]
    assert _same(before, after) and after["sched"] == before["sched"] + 1
    # what the check guards against: torch's AdamW with zero gradients still moves the weights
    run = watch["run"]
    with torch.no_grad():
        for n, p in run.model.named_parameters():
            p.copy_(before["params"][n])
            p.grad = torch.zeros_like(p)
    run.optimizer.step()
    assert any(not torch.equal(p, before["params"][n]) for n, p in run.model.named_parameters())


def two_ranks_one_bad(cfg_dict: dict, out: str, mode: str) -> dict:
    """On 2 processes, make only rank 1's step 2 non-finite: ``loss`` adds inf to its loss sum (its
    gradients stay finite), ``grad`` makes its gradients NaN (its loss stays finite). Returns this
    rank's error message and the steps it finished."""
    import pathlib

    import torch.distributed as dist

    rank = dist.get_rank()
    real = OmniModel.forward
    count = [0]

    def forward(self, *a, **k):
        res = real(self, *a, **k)
        count[0] += 1
        if rank == 1 and count[0] == 2:
            if mode == "loss":
                res.loss_sum = res.loss_sum + float("inf")
            else:
                res.loss_sum.register_hook(lambda g: g * float("nan"))
        return res

    OmniModel.forward = forward
    finished: list[int] = []
    real_log = loop.log_step
    loop.log_step = lambda run, row: (finished.append(row["step"]), real_log(run, row))
    try:
        loop.train(_config(cfg_dict, pathlib.Path(out), max_steps=3))
    except NonFiniteError as exc:
        return {"error": str(exc), "finished": finished}
    return {"error": None, "finished": finished}


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["loss", "grad"])
def test_two_ranks_stop_at_the_same_step_when_one_rank_is_non_finite(text_cfg, tmp_path, mode):  # noqa: F811
    ranks = run_distributed(two_ranks_one_bad, 2, args=(text_cfg, str(tmp_path / mode), mode))
    for r in ranks:
        assert r["finished"] == [1]
        assert r["error"] is not None and r["error"].startswith("non-finite training step 2: ")
    word = "loss inf" if mode == "loss" else "loss "
    assert word in ranks[0]["error"] and ranks[0]["error"] == ranks[1]["error"]
    if mode == "grad":
        assert "gradient norm nan" in ranks[0]["error"] and "loss nan" not in ranks[0]["error"]
