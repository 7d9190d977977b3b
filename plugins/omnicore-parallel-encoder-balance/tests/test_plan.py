"""``omnicore plan`` with ``encoder_balance``: each data rank's encoder FLOPs of step 1, as the
data puts them ("own") and as the strategy would assign them ("balanced"); in process, no process
group.

The data is skewed by construction. A source's row ``i`` goes to virtual shard ``i % V`` (``V`` =
data ranks x ``train.grad_accum``; micro-step ``k`` of data rank ``r`` reads shard ``r *
grad_accum + k``); the rows of the image shards hold one image each, those of the last shard one
clip, the rest text only. With a packing window of :data:`WINDOW` samples that always fit in one
row, each micro-batch holds exactly :data:`WINDOW` samples of its shard. So the reference is
arithmetic: own = items x one item's FLOPs (``FlopCounterMode`` on real tensors), balanced =
:func:`~omnicore_parallel_encoder_balance.assign.assign` per micro-step on those items.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import balance_cases as cases  # noqa: E402

from omnicore_parallel_encoder_balance.assign import assign, spread  # noqa: E402

ROWS = 24
WINDOW = 3
"""``data.packing_window``: 3 samples per micro-batch (under the plan's window, which then takes it)."""


def _write(folder: Path, shards: int, image_shards: set[int], strategies: list, grad_accum: int) -> str:
    """The skewed JSONL (module docstring) and its config in ``folder``; the config's path."""
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


def _config(folder: Path, strategies: list, grad_accum: int, name: str = "config.yaml") -> str:
    cfg = {
        "run": {"seed": 0},
        "model": cases.model_dict(),
        "data": {"train": "skewed.jsonl", "max_tokens": 512, "packing_window": WINDOW, "num_workers": 0},
        "train": {"grad_accum": grad_accum},
        "parallel": {"strategies": strategies},
    }
    (folder / name).write_text(yaml.safe_dump(cfg))
    return str(folder / name)


def _plan(capsys, path: str, ranks: int) -> tuple[dict, str]:
    """``omnicore plan PATH --world-size RANKS``: its ``encoder_costs`` (``--json``) and its text."""
    from omnicore.testing import cli_main

    assert cli_main(["plan", path, "--world-size", str(ranks), "--json"]) == 0
    costs = json.loads(capsys.readouterr().out)["encoder_costs"]
    assert cli_main(["plan", path, "--world-size", str(ranks)]) == 0
    return costs, capsys.readouterr().out


def _one_item_flops() -> dict[str, float]:
    """Model FLOPs of a forward and backward of each encoder on one item, on real tensors
    (``FlopCounterMode``; a fused attention backward without its recomputed scores, as the plan
    and training count it)."""
    from omnicore.api import EncoderOutput, flop_counter

    model = cases.build_model()
    procs = model.encoder_processors()
    items = {"image": procs["image"].preprocess(cases._image(0)), "audio": procs["audio"].preprocess(cases._clip(2.0, 0))}
    out = {}
    for m, features in items.items():
        with flop_counter(model_flops=True) as counter:
            rows = model.encoders[m](procs[m].collate([features]))
            rows = [rows.embeds, *rows.layer_embeds] if isinstance(rows, EncoderOutput) else [rows]
            sum(r.float().sum() for r in rows).backward()
        out[m] = float(counter.get_total_flops())
    return out


def _expected(items: list[list[int]], one: float) -> tuple[list[float], list[float], list[float]]:
    """``items[r][k]``: rank ``r``'s items at micro-step ``k``. (own, balanced per micro-step as the
    hook runs, balanced over the whole step)."""
    ranks, steps = len(items), len(items[0])
    own = [one * sum(row) for row in items]
    balanced = [0.0] * ranks
    for k in range(steps):
        after = assign([[one] * items[r][k] for r in range(ranks)], min_spread=1.05).after
        balanced = [x + y for x, y in zip(balanced, after)]
    whole = assign([[one] * sum(row) for row in items], min_spread=1.05).after
    return own, balanced, whole


def _check(costs: dict, text: str, want: dict[str, tuple[list[float], list[float]]], ranks: int) -> None:
    assert costs["data_ranks"] == costs["ranks_read"] == ranks
    for m, (own, balanced) in want.items():
        got = costs["per_modality"][m]
        # Whisper on the meta device takes every frame as valid (its mask as all true): within 1%
        rel = 1e-9 if m == "image" else 0.01
        assert got["own"] == pytest.approx(own, rel=rel), m
        assert got["balanced"] == pytest.approx(balanced, rel=rel) and got["balanced_by"] == "encoder_balance", m
        assert got["own_spread"] == spread(got["own"]) and got["balanced_spread"] == spread(got["balanced"])
        rows = text.split(f"  encoder.{m} ")[1].split("\n")
        assert rows[0].split()[:2] == ["own", "balanced"] and "as encoder_balance would assign the items" in rows[0]
        for r in range(ranks):
            assert rows[1 + r].split() == ["rank", str(r), f"{got['own'][r]:.3g}", f"{got['balanced'][r]:.3g}"]
        assert rows[1 + ranks].split() == ["max", "/", "mean", f"{spread(got['own']):.2f}", f"{spread(got['balanced']):.2f}"]


@pytest.mark.slow
def test_plan_on_two_ranks_shows_own_and_balanced_encoder_flops(tmp_path, capsys):
    """2 data ranks, one micro-step: rank 0 reads 3 images, rank 1 3 clips; each balanced to 2
    and 1. With ``options.modalities: [image]`` the clips stay where they are, and the plan shows
    their own FLOPs only."""
    one = _one_item_flops()
    path = _write(tmp_path, 2, {0}, ["encoder_balance", "fsdp2"], grad_accum=1)
    costs, text = _plan(capsys, path, 2)
    image, audio = _expected([[3], [0]], one["image"]), _expected([[0], [3]], one["audio"])
    assert image[1] == [2 * one["image"], one["image"]] and audio[1] == [one["audio"], 2 * one["audio"]]
    _check(costs, text, {"image": image[:2], "audio": audio[:2]}, 2)

    only = {"name": "encoder_balance", "options": {"modalities": ["image"]}}
    costs, text = _plan(capsys, _config(tmp_path, [only, "fsdp2"], 1, "only_image.yaml"), 2)
    assert costs["per_modality"]["image"]["balanced"] == pytest.approx(image[1], rel=1e-9)
    assert costs["per_modality"]["audio"]["own"] == pytest.approx(audio[0], rel=0.01)
    assert costs["per_modality"]["audio"]["balanced"] is None and costs["per_modality"]["audio"]["balanced_by"] is None
    assert text.split("  encoder.audio ")[1].split("\n")[0].split() == ["own"]


@pytest.mark.slow
def test_plan_on_four_ranks_balances_each_micro_step(tmp_path, capsys):
    """4 data ranks, 2 micro-steps: rank 0 reads 3 images on each, rank 3 3 clips on its second.
    Balanced per micro-step (as the hook runs) differs from balancing the whole step."""
    one = _one_item_flops()
    path = _write(tmp_path, 8, {0, 1}, [{"name": "encoder_balance", "options": {"min_spread": 1.05}}, "fsdp2"], grad_accum=2)
    costs, text = _plan(capsys, path, 4)
    image = _expected([[3, 3], [0, 0], [0, 0], [0, 0]], one["image"])
    audio = _expected([[0, 0], [0, 0], [0, 0], [0, 3]], one["audio"])
    assert image[1] == [2 * one["image"]] * 3 + [0.0] and image[1] != image[2], "the data should tell per-step from whole-step"
    _check(costs, text, {"image": image[:2], "audio": audio[:2]}, 4)
