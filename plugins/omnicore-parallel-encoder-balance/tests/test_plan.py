"""``omnicore plan`` with ``encoder_balance``: each data rank's encoder FLOPs of step 1, as the
data puts them ("own") and as the strategy would assign them ("balanced"); one process, no
process group.

The data is skewed by construction: a source's row ``i`` goes to virtual shard ``i % V`` (``V`` =
data ranks x ``train.grad_accum``), and the rows of the first shards hold one image each, those
of the last shard one clip, the rest text only. The reference reads each rank's micro-batches
itself, counts the encoder FLOPs on real tensors with ``FlopCounterMode`` (own), and runs
:func:`~omnicore_parallel_encoder_balance.assign.assign` per micro-step on one item's count times
each rank's items (balanced).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import balance_cases as cases  # noqa: E402

from omnicore_parallel_encoder_balance.assign import assign, spread  # noqa: E402

ROWS = 24


def _write(folder: Path, shards: int, image_shards: set[int], strategies: list, grad_accum: int) -> object:
    """A skewed JSONL (module docstring) and its config: images in ``image_shards``, a 2 s clip in
    the last shard. A packing window of 8 samples (under the plan's, which it then takes: the
    reference reads what the plan reads), for speed."""
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(ROWS):
        if i % shards in image_shards:
            cases._image(i).save(folder / f"{i}.png")
            content: object = [{"type": "image", "path": f"{i}.png"}, {"type": "text", "text": "Which digit?"}]
        elif i % shards == shards - 1:
            sf.write(folder / f"{i}.wav", cases._clip(2.0, i).samples, 16000)
            content = [{"type": "audio", "path": f"{i}.wav"}, {"type": "text", "text": "Which digit?"}]
        else:
            content = f"Which digit is written as {'x' * 12} {i % 10} here?"
        lines.append({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": str(i % 10)}]})
    (folder / "skewed.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return _config(folder, strategies, grad_accum)


def _config(folder: Path, strategies: list, grad_accum: int) -> object:
    from omnicore.testing import Config

    cfg = Config.model_validate({
        "run": {"seed": 0},
        "model": cases.model_dict(),
        "data": {"train": str(folder / "skewed.jsonl"), "max_tokens": 160, "packing_window": 8, "num_workers": 0},
        "train": {"grad_accum": grad_accum},
        "parallel": {"strategies": strategies},
    })  # fmt: skip
    cfg.source = str(folder / "config.yaml")
    return cfg


def _steps(cfg, ranks: int) -> tuple[object, list[list]]:
    """The model (real tensors) and each data rank's micro-batches of step 1, read here (as
    training reads them)."""
    from omnicore.api import Registry
    from omnicore.data.pipeline import DataPipeline
    from omnicore.model.build import open_data
    from omnicore.testing import build_omni_model

    reg = Registry.discover()
    model, tok = build_omni_model(cfg, reg)
    chat, sources = open_data(cfg, reg, tok, rope=model.rope)
    out = []
    for r in range(ranks):
        data = DataPipeline(sources, chat, cfg.data, cfg.run.seed, data_rank=r, data_size=ranks, grad_accum=cfg.train.grad_accum)
        out.append(data.step())
        data.close()
    return model, out


def _real_flops(encoder, batch) -> float:
    """Model FLOPs of a forward and backward of ``encoder`` on real tensors (``FlopCounterMode``;
    a fused attention backward counted without its recomputed scores, as the plan and training do)."""
    from omnicore.api import EncoderOutput
    from omnicore.model.flops import flop_counter

    with flop_counter(model_flops=True) as counter:
        out = encoder(batch)
        rows = [out.embeds, *out.layer_embeds] if isinstance(out, EncoderOutput) else [out]
        sum(r.float().sum() for r in rows).backward()
    return float(counter.get_total_flops())


def _reference(cfg, ranks: int) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """Per modality: (own, balanced by assign per micro-step, balanced by assign over the whole step)."""
    model, steps = _steps(cfg, ranks)
    out = {}
    for m, key in (("image", "pixel_values"), ("audio", "input_features")):
        batches = [[mb.encoder_inputs.get(m) for mb in step] for step in steps]
        one = next(b for row in batches for b in row if b is not None)
        item = _real_flops(model.encoders[m], {k: v[:1] for k, v in one.items()})
        counts = [[0 if b is None else int(b[key].shape[0]) for b in row] for row in batches]
        own = [sum(_real_flops(model.encoders[m], b) for b in row if b is not None) for row in batches]
        balanced = [0.0] * ranks
        for k in range(cfg.train.grad_accum):
            after = assign([[item] * counts[r][k] for r in range(ranks)], min_spread=1.05).after
            balanced = [x + y for x, y in zip(balanced, after)]
        whole = assign([[item] * sum(counts[r]) for r in range(ranks)], min_spread=1.05).after
        out[m] = (own, balanced, whole)
        assert [sum(c) for c in counts] == [round(x / item) for x in own], "the encoder's FLOPs are n items x one item's"
    return out


def _check(report, ref, ranks: int) -> None:
    text = report.render()
    as_json = report.as_dict()["encoder_costs"]
    assert as_json["data_ranks"] == as_json["ranks_read"] == ranks
    for m, (own, balanced, _) in ref.items():
        got = report.encoder_costs[m]
        # Whisper on the meta device takes every frame as valid (its mask as all true): within 1%
        rel = 1e-9 if m == "image" else 0.01
        assert got.own == pytest.approx(own, rel=rel), m
        assert got.balanced == pytest.approx(balanced, rel=rel) and got.by == "encoder_balance", m
        assert as_json["per_modality"][m]["own"] == got.own and as_json["per_modality"][m]["balanced"] == got.balanced
        assert as_json["per_modality"][m]["balanced_spread"] == spread(got.balanced)
        rows = text.split(f"  encoder.{m} ")[1].split("\n")
        assert rows[0].split()[:2] == ["own", "balanced"] and "as encoder_balance would assign the items" in rows[0]
        for r in range(ranks):
            assert rows[1 + r].split() == ["rank", str(r), f"{got.own[r]:.3g}", f"{got.balanced[r]:.3g}"]
        assert rows[1 + ranks].split() == ["max", "/", "mean", f"{spread(got.own):.2f}", f"{spread(got.balanced):.2f}"]


@pytest.mark.slow
def test_plan_on_two_ranks_shows_own_and_balanced_encoder_flops(tmp_path):
    """2 data ranks, one micro-step: rank 0 reads every image, rank 1 every clip. With
    ``options.modalities: [image]`` the clips stay where they are, and the plan shows their own
    FLOPs only."""
    from omnicore.parallel.plan import make_plan

    cfg = _write(tmp_path, 2, {0}, ["encoder_balance", "fsdp2"], grad_accum=1)
    ref = _reference(cfg, 2)
    assert ref["image"][0][1] == 0 and ref["audio"][0][0] == 0 and ref["image"][0][0] > 0 and ref["audio"][0][1] > 0
    report = make_plan(cfg, 2)
    assert report.ok, report.violations
    _check(report, ref, 2)
    assert spread(report.encoder_costs["image"].own) == 2.0 and spread(report.encoder_costs["image"].balanced) < 1.5

    only = {"name": "encoder_balance", "options": {"modalities": ["image"]}}
    report = make_plan(_config(tmp_path, [only, "fsdp2"], grad_accum=1), 2)
    image, audio = report.encoder_costs["image"], report.encoder_costs["audio"]
    assert image.balanced == pytest.approx(ref["image"][1]) and audio.balanced is None
    assert audio.own == pytest.approx(ref["audio"][0], rel=0.01)
    assert report.as_dict()["encoder_costs"]["per_modality"]["audio"]["balanced"] is None
    assert report.render().split("  encoder.audio ")[1].split("\n")[0].split() == ["own"]


@pytest.mark.slow
def test_plan_on_four_ranks_balances_each_micro_step(tmp_path):
    """4 data ranks, 2 micro-steps: rank 0 reads the images on both, rank 3 the clips on its
    second. Balanced per micro-step (as the hook runs) differs from balancing the whole step."""
    from omnicore.parallel.plan import make_plan

    cfg = _write(tmp_path, 8, {0, 1}, [{"name": "encoder_balance", "options": {"min_spread": 1.05}}, "fsdp2"], grad_accum=2)
    ref = _reference(cfg, 4)
    report = make_plan(cfg, 4)
    assert report.ok, report.violations
    _check(report, ref, 4)
    own, balanced, whole = ref["image"]
    assert own[1:] == [0.0, 0.0, 0.0] and balanced != pytest.approx(whole), "the data should tell per-step from whole-step"
