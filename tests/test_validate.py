"""Validation during training (``eval.every``): the held-out loss equals ``omnicore eval``'s
loss on the same checkpoint (1 and 2 processes), equals a sample-by-sample reference, leaves no
gradient and the model in train mode, and is off by default."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import first_fit_by_scan, tiny_config_dict

from omnicore.config import Config
from omnicore.data.chat import IGNORE_INDEX
from omnicore.data.packing import collate
from omnicore.testing.distributed import run_distributed

STEPS = 4


def _cfg(digits_jsonl: Path, out: Path, eval_file: Path | None = None, eval_every: int = 0) -> Config:
    d = tiny_config_dict(
        str(digits_jsonl / "train.jsonl"), eval=str(eval_file or digits_jsonl / "eval.jsonl"), output_dir=str(out), max_steps=STEPS
    )
    d["train"].update(save_every=2)
    d["eval"] = {"every": eval_every}
    cfg = Config.model_validate(d)
    cfg.source = str(out.parent / "config.yaml")
    return cfg


def _val_rows(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r.get("split") == "val"}


def _eval_loss(cfg: Config, step: int) -> dict:
    from omnicore.eval.heldout import heldout_loss_of
    from omnicore.eval.loading import load_trained

    model, _, processor = load_trained(cfg, checkpoint=str(Path(cfg.run.output_dir) / "checkpoints" / f"step-{step:08d}"))
    return heldout_loss_of(cfg, model, processor)


def _reference(model, processor, path: Path, max_samples: int | None = None) -> dict[str, float]:
    """Sample by sample, from the whole logits (the model's ``return_logits`` path) and plain cross-entropy."""
    from omnicore.data.jsonl import read_jsonl

    sums = {"text": 0.0, "decoder.image": 0.0}
    counts = {"text": 0, "decoder.image": 0}
    with torch.no_grad():
        for s in read_jsonl(path)[:max_samples]:
            mb = collate([processor.encode(s)], processor.encoders, processor.decoders)
            out = model(mb, return_logits=True)
            labels = mb.labels.view(-1)
            ce = torch.nn.functional.cross_entropy(out.logits.view(-1, out.logits.shape[-1]), labels, reduction="sum")
            sums["text"] += float(ce)
            counts["text"] += int((labels != IGNORE_INDEX).sum())
            for m, v in out.decoder_loss_sums.items():
                sums[f"decoder.{m}"] += float(v)
                counts[f"decoder.{m}"] += out.decoder_targets[m]
    ref = {"loss": sum(sums.values()) / sum(counts.values())}
    ref.update({f"loss/{k}": sums[k] / counts[k] for k in sums if counts[k]})
    return ref


def _gen_lines(digits_jsonl: Path) -> list[str]:
    """The text-to-image samples of the training file (103 tokens each): decoder targets to validate on."""
    return [x for x in (digits_jsonl / "train.jsonl").read_text().splitlines() if '"text_to_image"' in x]


@pytest.fixture(scope="module")
def val_file(digits_jsonl) -> Path:
    """The 12 held-out samples (image and audio questions, 48-58 tokens) with 4 drawing samples
    interleaved: 16 samples with text and decoder targets (next to the images it names)."""
    lines = (digits_jsonl / "eval.jsonl").read_text().splitlines()
    gen = _gen_lines(digits_jsonl)[:4]
    mixed = [x for i, line in enumerate(lines) for x in ([line, gen[i // 3]] if i % 3 == 2 else [line])]
    path = digits_jsonl / "val_mixed.jsonl"
    path.write_text("\n".join(mixed) + "\n")
    return path


@pytest.fixture(scope="module")
def one_process(digits_jsonl, val_file, tmp_path_factory):
    """4 steps on one process with validation every 2 steps and a checkpoint every 2 steps."""
    from omnicore.train.loop import train

    out = tmp_path_factory.mktemp("val1") / "run"
    cfg = _cfg(digits_jsonl, out, val_file, eval_every=2)
    history = train(cfg)
    return cfg, history


@pytest.mark.slow
def test_validation_loss_equals_eval_loss_one_process(one_process, digits_jsonl):
    cfg, history = one_process
    val = _val_rows(Path(cfg.run.output_dir))
    assert sorted(val) == [2, 4]
    assert all("split" not in r for r in history)  # training rows stay as they were
    for step in (2, 4):
        got = _eval_loss(cfg, step)
        row = val[step]
        assert row["val_samples"] == 16 and row["val_targets"] == got["loss_targets"] > 0
        assert set(got) == {"loss", "loss/text", "loss/decoder.image", "loss_targets"}
        for k in ("loss", "loss/text", "loss/decoder.image"):
            assert row[f"val_{k}"] == pytest.approx(got[k], rel=1e-6)
    assert val[4]["val_loss"] != pytest.approx(val[2]["val_loss"], rel=1e-3)  # the model changed in between


@pytest.mark.slow
def test_eval_loss_equals_sample_by_sample_reference(one_process, val_file):
    """``omnicore eval``'s loss (packed rows, the cross-entropy kernel) against one sample at a time
    from the whole logits; ``eval.max_samples`` caps both."""
    from omnicore.eval.heldout import heldout_loss_of
    from omnicore.eval.loading import load_trained

    cfg, _ = one_process
    model, _, processor = load_trained(cfg, checkpoint=str(Path(cfg.run.output_dir) / "checkpoints" / f"step-{STEPS:08d}"))
    for cap in (None, 4):
        c = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"max_samples": cap})})
        got = heldout_loss_of(c, model, processor)
        ref = _reference(model, processor, val_file, cap)
        assert set(got) - {"loss_targets"} == set(ref)
        for k, v in ref.items():
            assert got[k] == pytest.approx(v, rel=1e-5)


@pytest.mark.slow
def test_validation_leaves_train_mode_and_no_gradients(one_process, val_file):
    from omnicore.eval.heldout import heldout_loss
    from omnicore.eval.loading import load_trained

    cfg, _ = one_process
    model, _, processor = load_trained(cfg)
    model.train()
    model.decoders["image"].eval()  # a part kept in eval mode must stay so
    modes = [m.training for m in model.modules()]
    assert True in modes and False in modes
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = heldout_loss(model, processor, val_file, cfg.data.max_tokens)
    assert out["val_loss"] > 0
    assert model.training and [m.training for m in model.modules()] == modes
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_eval_rows_shard_the_file_and_pack_as_training_packs(one_process, val_file):
    """Sample ``j`` goes to group ``j % n``; each group's rows are first-fit over its samples in file
    order (training's packer, ``data.packing: first_fit``), window by window, within the budget."""
    from omnicore.data.jsonl import read_jsonl
    from omnicore.eval.heldout import eval_rows
    from omnicore.eval.loading import load_trained

    cfg, _ = one_process
    _, _, processor = load_trained(cfg)
    path = val_file
    samples = read_jsonl(path)
    lengths = {s.where: len(processor.encode(s)) for s in samples}
    whole = [e.where for row in eval_rows(path, processor, 512) for e in row]
    assert sorted(whole) == sorted(lengths) and len(whole) == 16
    budget = 200
    for shard in (0, 1):
        mine = [s.where for s in samples[:7]][shard::2]
        for window in (1024, 2):
            rows = [
                [e.where for e in row]
                for row in eval_rows(path, processor, budget, shard=shard, num_shards=2, max_samples=7, window=window)
            ]
            want = []
            for w in range(0, len(mine), window):  # each window packed on its own
                part = mine[w : w + window]
                want += [[part[i] for i in r] for r in first_fit_by_scan([lengths[x] for x in part], budget)]
            assert rows == want
            assert len(rows) >= 2 and all(sum(lengths[x] for x in row) <= budget for row in rows)


@pytest.mark.slow
def test_eval_every_zero_logs_no_validation_and_validation_leaves_training_alone(one_process, digits_jsonl, val_file, tmp_path):
    """Off by default: no val rows; and the training losses of the run with validation every 2
    steps are those of this run without it (validation changes no weight, data position or RNG)."""
    from omnicore.train.loop import train

    cfg = _cfg(digits_jsonl, tmp_path / "run", val_file)
    assert cfg.eval.every == 0
    history = train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert not any("val_loss" in r or "split" in r for r in rows)
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in one_process[1]], rel=1e-6)


def test_eval_every_needs_data_eval(digits_jsonl, tmp_path):
    import yaml

    from omnicore.config import ConfigError, load_config

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**tiny_config_dict(str(digits_jsonl / "train.jsonl")), "eval": {"every": 2}}))
    with pytest.raises(ConfigError, match=r"cfg.yaml: eval: eval.every needs data.eval"):
        load_config(path)


def _two_ranks(cfg_dict: dict) -> dict:
    from omnicore.train.loop import train

    cfg = Config.model_validate(cfg_dict)
    cfg.source = str(Path(cfg.run.output_dir).parent / "config.yaml")
    train(cfg)
    return {}


@pytest.mark.multiprocess
def test_validation_loss_equals_eval_loss_two_processes_fsdp2(digits_jsonl, tmp_path):
    """2 processes (FSDP2, gloo): the eval set is sharded over the two data groups with uneven rows
    (rank 0 packs 3 rows of one 103-token drawing each in a 128-token budget, rank 1 one row of two
    58-token questions, so rank 1 runs two filler rows whose loss is dropped); the val rows equal
    one-process eval (other packing) on the checkpoints the run wrote."""
    questions = (digits_jsonl / "eval.jsonl").read_text().splitlines()
    gen = _gen_lines(digits_jsonl)
    eval_file = digits_jsonl / "val_uneven.jsonl"
    eval_file.write_text("\n".join([gen[0], questions[0], gen[1], questions[1], gen[2]]) + "\n")
    cfg = _cfg(digits_jsonl, tmp_path / "run", eval_file, eval_every=2)
    cfg.data.max_tokens = 128
    d = copy.deepcopy(cfg.model_dump(mode="json"))
    d["parallel"] = {"strategies": ["fsdp2"]}
    run_distributed(_two_ranks, 2, args=(d,))
    val = _val_rows(tmp_path / "run")
    assert sorted(val) == [2, 4]
    for step in (2, 4):
        got = _eval_loss(cfg, step)
        assert val[step]["val_samples"] == 5 and val[step]["val_targets"] == got["loss_targets"]
        for k in ("loss", "loss/text", "loss/decoder.image"):
            assert val[step][f"val_{k}"] == pytest.approx(got[k], rel=1e-6)
