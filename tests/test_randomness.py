"""Randomness per sample and per rank (:mod:`omnicore.data.seeds`): a sample's augmentation draws
come from its own stream (``run.seed`` and its place in the data stream), so they differ between
ranks and do not depend on the layout; dropout's stream differs per rank; and the digits config
(which augments images) trained on 2 processes equals 1 process with ``grad_accum 2`` again, runs
repeat exactly and resume stays exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import DIGITS

from omnicore.config import Config, load_config
from omnicore.data.seeds import ITEM_SEEDS, item_generators, rank_seed

STEPS = 4


def digits_config(data: Path, out: Path, **train) -> Config:
    """examples/digits/config.yaml (image augmentation on) on the small ``digits_jsonl`` set: the
    byte tokenizer (the shipped config's is fitted by run.sh), a 1-step warm-up so that 4 steps
    learn, no validation, samples or export."""
    overrides = {
        "run": {"output_dir": str(out)},
        "model": {"foundation": {"options": {"tokenizer": "byte"}}},
        "data": {"train": str(data / "train.jsonl"), "eval": str(data / "eval.jsonl")},
        "train": dict(
            {"max_steps": STEPS, "warmup_steps": 1, "save_every": 2, "log_every": 1, "progress": False, "export": False}, **train
        ),
        "eval": {"every": 0},
        "samples": {"every": 0},
    }
    cfg = load_config(DIGITS / "config.yaml", overrides)
    assert cfg.model.encoders["image"].options["augment"] == {"shift": 0.1, "rotate": 10, "scale": 0.1}
    return cfg


def _pipeline(cfg: Config, data_rank: int, data_size: int, grad_accum: int, workers: int = 0):
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.pipeline import DataPipeline
    from omnicore.data.sources import open_source
    from omnicore.model.build import build_omni_model

    model, tok = build_omni_model(cfg)
    chat = ChatProcessor.for_model(tok, model, cfg.data, budget=True)
    sources = [open_source(s, Path(cfg.source).parent) for s in cfg.data.source_list()]
    data = cfg.data.model_copy(update={"num_workers": workers})
    return DataPipeline(sources, chat, data, cfg.run.seed, data_rank=data_rank, data_size=data_size, grad_accum=grad_accum)


def _image_seeds(pipe, steps: int = 2) -> list[list[list[int]]]:
    """``[step][micro-batch]`` -> the seeds of the micro-batch's images."""
    try:
        return [[mb.encoder_inputs["image"][ITEM_SEEDS].tolist() for mb in pipe.step()] for _ in range(steps)]
    finally:
        pipe.close(now=True)


def test_item_seeds_follow_the_samples_not_the_layout(digits_jsonl, tmp_path):
    """Rank 0 and rank 1 of 2 get other seeds; 1 rank with grad_accum 2 gets rank 0's in its first
    micro-batch and rank 1's in its second; DataLoader workers change nothing."""
    cfg = digits_config(digits_jsonl, tmp_path / "run")
    r0, r1 = _image_seeds(_pipeline(cfg, 0, 2, 1)), _image_seeds(_pipeline(cfg, 1, 2, 1))
    one = _image_seeds(_pipeline(cfg, 0, 1, 2))
    assert [s[0] for s in one] == [s[0] for s in r0] and [s[1] for s in one] == [s[0] for s in r1]
    assert not set(sum((s[0] for s in r0), [])) & set(sum((s[0] for s in r1), []))  # no two images alike
    assert _image_seeds(_pipeline(cfg, 0, 2, 1, workers=2)) == r0


def test_augmentation_draws_come_from_the_items_seeds():
    """The siglip augmentation of a batch with seeds: each image's change from its own seed, the same
    in any batch it lands in; two seeds give other changes; no seeds: torch's global generator."""
    from omnicore_image_siglip.augment import AugmentOptions, random_affine

    opts = AugmentOptions(shift=0.1, rotate=10, scale=0.1)
    pixels = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    batch = {"pixel_values": pixels, ITEM_SEEDS: torch.tensor([11, 22, 33])}
    both = random_affine(pixels, opts, item_generators(batch))
    alone = random_affine(pixels[1:2], opts, item_generators({ITEM_SEEDS: torch.tensor([22])}))
    assert torch.equal(both[1:2], alone)  # image 1 changed alike in a batch of 3 and alone
    other = random_affine(pixels[1:2], opts, item_generators({ITEM_SEEDS: torch.tensor([23])}))
    assert not torch.allclose(other, alone)
    assert item_generators({"pixel_values": pixels}) is None


def test_rank_streams_differ():
    assert len({rank_seed(0, r) for r in range(8)}) == 8 and rank_seed(0, 1) == rank_seed(0, 1) != rank_seed(1, 1)


def _first_draws(cfg_json: str) -> dict:
    """On each rank of a 2-rank group: set the run up as training does, then the first augmentation
    draw of each image of its first micro-batch and the next dropout draw (torch's global RNG)."""
    from omnicore.parallel.state import init_parallel_state
    from omnicore.train.loop import setup

    cfg = Config.model_validate(json.loads(cfg_json))
    cfg.source = str(DIGITS / "config.yaml")
    state = init_parallel_state("cpu", "gloo", cfg.parallel)
    run = setup(cfg, state=state)
    try:
        batch = run.data.step()[0].encoder_inputs["image"]
        augment = [torch.rand(2, generator=g).tolist() for g in item_generators(batch)]
        return {"augment": augment, "dropout": torch.rand(4).tolist()}
    finally:
        run.data.close(now=True)


@pytest.mark.multiprocess
def test_two_ranks_draw_differently(digits_jsonl, tmp_path):
    """With the digits config on 2 FSDP2 ranks, the ranks' augmentation draws differ (they were
    ``[0.023257, 0.897781]`` on each), and so do their dropout streams."""
    from omnicore.testing.distributed import run_distributed

    cfg = digits_config(digits_jsonl, tmp_path / "run")
    ranks = run_distributed(_first_draws, 2, args=(json.dumps(cfg.model_dump(mode="json")),), timeout=600)
    a, b = ranks[0]["augment"], ranks[1]["augment"]
    assert a and b and not {tuple(x) for x in a} & {tuple(x) for x in b}
    assert ranks[0]["dropout"] != ranks[1]["dropout"]


def _losses(out: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"split"' not in x]


@pytest.fixture(scope="module")
def one_process(digits_jsonl, tmp_path_factory) -> list[float]:
    """The digits config, 4 steps on 1 process with grad_accum 2: its losses."""
    from omnicore.train.loop import train

    out = tmp_path_factory.mktemp("one") / "run"
    history = train(digits_config(digits_jsonl, out, grad_accum=2))
    assert [r["step"] for r in history] == [1, 2, 3, 4]
    return _losses(out)


@pytest.mark.slow
def test_a_run_repeats_exactly_and_resume_stays_exact(digits_jsonl, one_process, tmp_path):
    from omnicore.train.loop import train

    train(digits_config(digits_jsonl, tmp_path / "again", grad_accum=2))
    assert _losses(tmp_path / "again") == one_process  # bit for bit
    train(digits_config(digits_jsonl, tmp_path / "resumed", grad_accum=2, stop_after=2))
    train(digits_config(digits_jsonl, tmp_path / "resumed", grad_accum=2), resume=True)
    assert _losses(tmp_path / "resumed") == one_process


@pytest.mark.cli
@pytest.mark.multiprocess
def test_digits_config_on_two_processes_equals_one_with_grad_accum_2(digits_jsonl, one_process, tmp_path):
    """FSDP2 on 2 processes (gloo) x grad_accum 1 against 1 process x grad_accum 2, augmentation on:
    the same losses at every step, rel 1e-5 (6.4e-5 apart when every rank drew alike)."""
    cfg = digits_config(digits_jsonl, tmp_path / "run", grad_accum=1)
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(cfg.model_dump(mode="json")))
    (tmp_path / "movq").symlink_to(DIGITS / "movq")  # the config's own relative checkpoint path
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "omnicore", "train", str(path)]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = _losses(tmp_path / "run")
    assert len(two) == STEPS and one_process[0] > one_process[-1]
    print(f"2 processes vs 1: max loss rel diff {max(abs(a - b) / abs(b) for a, b in zip(two, one_process)):.2e}")
    assert two == pytest.approx(one_process, rel=1e-5)
