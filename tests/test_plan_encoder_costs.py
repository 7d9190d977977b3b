"""``omnicore plan``: each data rank's encoder FLOPs of step 1 (``PlanReport.encoder_costs``), and
the optional strategy member ``plan_encoder_costs`` that gives them as balanced; one process.

The data is skewed: a source's row ``i`` goes to virtual shard ``i % V`` (``V`` = data ranks x
``train.grad_accum``), and the rows of shard 0 hold one image each, the rest text only. The
reference reads each rank's micro-batches itself and counts the image encoder on real tensors
with ``FlopCounterMode``; the plan counts on the meta device. ``encoder_balance`` itself is
tested in ``plugins/omnicore-parallel-encoder-balance/tests/test_plan.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config_dict

ROWS = 16


def _config(folder: Path, ranks: int, grad_accum: int, strategies: list) -> object:
    """A skewed JSONL (module docstring) in ``folder`` and its config; a packing window of 8
    samples (the plan's is larger, so it takes this one and reads what the reference reads)."""
    from PIL import Image

    from omnicore.config import Config

    shards = ranks * grad_accum
    lines = []
    for i in range(ROWS):
        if i % shards == 0:
            Image.fromarray(np.random.default_rng(i).integers(0, 256, (28, 28, 3), dtype=np.uint8)).save(folder / f"{i}.png")
            content: object = [{"type": "image", "path": f"{i}.png"}, {"type": "text", "text": "Which digit?"}]
        else:
            content = f"Which digit is written as {'x' * 12} {i % 10} here?"
        lines.append({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": str(i % 10)}]})
    (folder / "skewed.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    d = tiny_config_dict(str(folder / "skewed.jsonl"), decoders=False, grad_accum=grad_accum)
    d["data"].update(packing_window=8, num_workers=0, max_tokens=160)
    d["parallel"] = {"strategies": strategies}
    cfg = Config.model_validate(d)
    cfg.source = str(folder / "config.yaml")
    return cfg


def _read(cfg, model, tokenizer, ranks: int) -> list[list]:
    """Each data rank's micro-batches of step 1, as training reads them."""
    from omnicore.data.pipeline import DataPipeline
    from omnicore.model.build import open_data
    from omnicore.registry import registry_for

    chat, sources = open_data(cfg, registry_for(cfg), tokenizer, rope=model.rope)
    out = []
    for r in range(ranks):
        data = DataPipeline(sources, chat, cfg.data, cfg.run.seed, data_rank=r, data_size=ranks, grad_accum=cfg.train.grad_accum)
        out.append(data.step())
        data.close()
    return out


def _real_flops(encoder, batch) -> float:
    """Model FLOPs of a forward and backward of ``encoder`` on real tensors (``FlopCounterMode``;
    a fused attention backward without its recomputed scores, as training counts it)."""
    from omnicore.components import EncoderOutput
    from omnicore.model.flops import flop_counter

    with flop_counter(model_flops=True) as counter:
        out = encoder(batch)
        rows = [out.embeds, *out.layer_embeds] if isinstance(out, EncoderOutput) else [out]
        sum(r.float().sum() for r in rows).backward()
    return float(counter.get_total_flops())


def test_plan_shows_each_ranks_own_encoder_flops_without_a_balancing_strategy(tmp_path):
    """2 data ranks, ``[fsdp2]``: rank 0 reads every image, rank 1 none. Each rank's ``own``
    image FLOPs equal ``FlopCounterMode``'s on its micro-batch; there is no ``balanced`` column.
    The audio encoder, with no clip in the step, gets one line saying so."""
    from omnicore.model.build import build_omni_model
    from omnicore.parallel.plan import make_plan, spread

    cfg = _config(tmp_path, 2, 1, ["fsdp2"])
    report = make_plan(cfg, 2)
    model, tok = build_omni_model(cfg)
    steps = _read(cfg, model, tok, 2)
    want = [
        sum(_real_flops(model.encoders["image"], mb.encoder_inputs["image"]) for mb in s if "image" in mb.encoder_inputs) for s in steps
    ]
    assert want[0] > 0 and want[1] == 0.0
    image = report.encoder_costs["image"]
    assert image.own == pytest.approx(want, rel=1e-9) and image.balanced is None
    assert image.own[0] == report.flops["encoder.image"]  # rank 0's, as the per-part line counts it
    text = report.render()
    assert "encoder FLOPs of step 1 per data rank, forward + backward (the 2 data ranks, 1 micro-batch(es) each; own:" in text
    rows = text.split("  encoder.image ")[1].split("\n")
    assert rows[0].split() == ["own"]
    assert rows[1].split() == ["rank", "0", f"{want[0]:.3g}"] and rows[2].split() == ["rank", "1", "0"]
    assert rows[3].split() == ["max", "/", "mean", "2.00"]
    assert "  encoder.audio: no items in step 1\n" in text
    costs = report.as_dict()["encoder_costs"]
    assert costs["data_ranks"] == costs["ranks_read"] == 2
    assert costs["per_modality"]["image"] == {
        "own": image.own,
        "own_spread": spread(image.own),
        "balanced": None,
        "balanced_spread": None,
        "balanced_by": None,
        "note": "",
    }
    assert spread(image.own) == 2.0


class Reverse:
    """A stand-in balancing strategy: every rank gets the batch of the rank mirrored to it."""

    mesh_dims = ()

    def __init__(self):
        self.calls: list[tuple[str, list[bool]]] = []

    def apply(self, model, state):
        return model

    def plan_encoder_costs(self, modality, module, processor, batches, flops):
        assert processor is not None and module is not None
        self.calls.append((modality, [b is not None for b in batches]))
        return [flops(b) for b in reversed(batches)] if modality == "image" else None


class Raises(Reverse):
    def plan_encoder_costs(self, modality, module, processor, batches, flops):
        raise RuntimeError("no plan here\nsecond line")


class TooFew(Reverse):
    def plan_encoder_costs(self, modality, module, processor, batches, flops):
        return [0.0]


def test_plan_encoder_costs_is_asked_per_micro_step_and_its_faults_are_reported(tmp_path):
    """The core asks ``plan_encoder_costs`` once per micro-step and encoder modality with every
    rank's batch of that micro-step (2 ranks x 2 micro-steps: images on rank 0's first only),
    sums its answers, shows the first strategy that answers, and reports a member that raises or
    answers for the wrong number of ranks instead of failing the plan."""
    import warnings

    from omnicore.model.build import build_omni_model
    from omnicore.parallel.mesh import MeshLayout
    from omnicore.parallel.plan import MetaFlops, PlanReport, add_encoder_costs

    cfg = _config(tmp_path, 2, 2, ["fsdp2"])
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = build_omni_model(cfg)
    steps = _read(cfg, model, tok, 2)
    count = MetaFlops(model)
    per_step = [[count("encoder.image", s[k].encoder_inputs.get("image")) for s in steps] for k in range(2)]
    assert per_step[0][0] > 0 and per_step[0][1] == per_step[1][0] == per_step[1][1] == 0.0

    def plan(strategies):
        report = PlanReport(2, MeshLayout(2, {"dp_replicate": 1, "dp_shard": 2, "ep": 1, "sp": 1}), True)
        report.data_ranks = 2
        add_encoder_costs(report, model, steps, strategies, count)
        return report

    mirror = Reverse()
    second = Reverse()
    report = plan([("none", object()), ("mirror", mirror), ("second", second)])
    image = report.encoder_costs["image"]
    assert image.own == [per_step[0][0], 0.0] and image.balanced == [0.0, per_step[0][0]] and image.by == "mirror"
    assert second.calls == []  # the first strategy that answers is the one shown
    assert mirror.calls == [("image", [True, False]), ("image", [False, False])]  # audio: no items, nothing to ask
    assert report.encoder_costs["audio"].own == [0.0, 0.0] and report.encoder_costs["audio"].balanced is None
    assert "(balanced: as mirror would assign the items, micro-step by micro-step)" in report.render()

    image = plan([("broken", Raises())]).encoder_costs["image"]
    assert image.own == [per_step[0][0], 0.0] and image.balanced is None
    assert image.note == "broken: plan_encoder_costs raised RuntimeError: no plan here"
    image = plan([("few", TooFew())]).encoder_costs["image"]
    assert image.balanced is None and image.note == "few: plan_encoder_costs gave 1 values for 2 data ranks; ignored"
    assert "(few: plan_encoder_costs gave 1 values for 2 data ranks; ignored)" in plan([("few", TooFew())]).render()


def test_plan_reads_at_most_max_cost_ranks_and_says_so(tmp_path, monkeypatch):
    import omnicore.parallel.plan as plan

    monkeypatch.setattr(plan, "MAX_COST_RANKS", 2)
    report = plan.make_plan(_config(tmp_path, 3, 1, ["fsdp2"]), 3)
    assert len(report.encoder_costs["image"].own) == 2
    assert report.encoder_costs_basis.startswith("the first 2 of 3 data ranks: the plan reads at most 2; balanced over these 2 only")
    assert report.as_dict()["encoder_costs"]["ranks_read"] == 2 and report.as_dict()["encoder_costs"]["data_ranks"] == 3


def test_plan_says_why_it_has_no_encoder_costs(tmp_path):
    """Data that is not here, and a data rank whose shard holds no row: no per-rank table, one
    line that says why (the rest of the plan stands)."""
    from omnicore.parallel.plan import make_plan

    cfg = _config(tmp_path, 2, 1, ["fsdp2"])
    gone = cfg.model_copy(update={"data": cfg.data.model_copy(update={"train": str(tmp_path / "elsewhere.jsonl")})})
    report = make_plan(gone, 2)
    assert report.ok and report.encoder_costs == {} and not report.flops_from_data
    assert "\nencoder FLOPs of step 1 per data rank: not counted: the data was not read (above)\n" in report.render()
    (tmp_path / "skewed.jsonl").write_text((tmp_path / "skewed.jsonl").read_text().splitlines()[0] + "\n")  # one row: shard 1 is empty
    report = make_plan(cfg, 2)
    assert report.ok and report.encoder_costs == {} and report.flops_from_data  # rank 0's step is read
    assert report.encoder_costs_basis.startswith("not counted: data rank 1 could not be read (SampleError: data source ")
    assert "no rows for data shard 1 of 2" in report.encoder_costs_basis
    assert report.as_dict()["encoder_costs"]["per_modality"] == {} and report.as_dict()["encoder_costs"]["ranks_read"] == 0
