"""Training recipe: FSDP2 on 2 processes equals 1 process, resume equals straight, export equals trained.

These run the real command line (``omnicore train`` and ``torchrun -m omnicore train``) on a small
real-data set built from the shipped digits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_config_dict

pytestmark = pytest.mark.cli

STEPS = 4


def _write_cfg(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _omnicore(*args: str, nproc: int = 1, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    if nproc == 1:
        cmd = [sys.executable, "-m", "omnicore", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "omnicore", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def one_process_run(digits_jsonl, tmp_path_factory):
    """4 steps on one process with grad_accum=2, saving a checkpoint every step and exporting."""
    work = tmp_path_factory.mktemp("one")
    cfg = tiny_config_dict(
        str(digits_jsonl / "train.jsonl"), output_dir=str(work / "run"), max_steps=STEPS, grad_accum=2, save_every=2, export=True
    )
    path = _write_cfg(work / "cfg.yaml", cfg)
    (work / "train.log").write_text(_omnicore("train", str(path), cwd=work).stderr)
    return work / "run", cfg


def test_later_epochs_take_target_codes_from_the_cache(one_process_run, digits_jsonl):
    """The 4 steps go round the small training set more than once: the frozen MoVQGAN's codes of
    each drawn target are kept once (as many targets as distinct target images in the file) and
    found again in later epochs (train.code_cache_mb, on by default)."""
    import re

    run, _ = one_process_run
    line = next(x for x in (run.parent / "train.log").read_text().splitlines() if "code cache:" in x)
    m = re.search(r"code cache: ([\d,]+) targets \(([\d.]+) MiB of 256 MiB\), ([\d.]+)% of lookups hit", line)
    assert m, line
    rows = [json.loads(x) for x in (digits_jsonl / "train.jsonl").read_text().splitlines()]
    drawn = {p["path"] for r in rows if r["task"] == "text_to_image" for p in r["messages"][1]["content"] if p["type"] == "image"}
    assert int(m.group(1).replace(",", "")) == len(drawn) and 0 < float(m.group(3)) < 100


@pytest.mark.multiprocess
def test_fsdp2_two_processes_match_one_process(one_process_run, digits_jsonl, tmp_path):
    """Same global batch (1 process x 2 micro-batches vs 2 processes x 1): same losses, rtol 1e-5.

    The loss is normalised by the global target count, so only the order of floating-point sums
    differs between the runs; measured differences are around 1e-7.
    """
    run1, cfg = one_process_run
    cfg2 = json.loads(json.dumps(cfg))
    cfg2["run"]["output_dir"] = str(tmp_path / "run")
    cfg2["train"].update(grad_accum=1, export=False, save_every=0)
    _omnicore("train", str(_write_cfg(tmp_path / "cfg.yaml", cfg2)), nproc=2, cwd=tmp_path)
    one, two = _losses(run1), _losses(tmp_path / "run")
    assert len(one) == len(two) == STEPS
    assert one[0] > one[-1]  # it learns
    assert two == pytest.approx(one, rel=1e-5)


def test_resume_matches_straight_run(one_process_run, tmp_path):
    """2 steps, stop, then --resume for 2 more gives the losses of 4 steps straight."""
    run1, cfg = one_process_run
    cfg2 = json.loads(json.dumps(cfg))
    cfg2["run"]["output_dir"] = str(tmp_path / "run")
    cfg2["train"].update(stop_after=STEPS // 2, export=False)
    path = _write_cfg(tmp_path / "cfg.yaml", cfg2)
    _omnicore("train", str(path), cwd=tmp_path)
    assert len(_losses(tmp_path / "run")) == STEPS // 2
    _omnicore("train", str(path), "--resume", "--train.stop_after", "null", cwd=tmp_path)
    assert _losses(tmp_path / "run") == pytest.approx(_losses(run1), rel=1e-6)


def test_checkpoint_is_atomic_and_latest_points_to_complete(one_process_run):
    run1, _ = one_process_run
    root = run1 / "checkpoints"
    assert (root / "latest").read_text().strip() == f"step-{STEPS:08d}"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [f"step-{STEPS // 2:08d}", f"step-{STEPS:08d}"]
    meta = json.loads((root / f"step-{STEPS:08d}" / "trainer_state.json").read_text())
    assert meta["step"] == STEPS
    # the data position: grad_accum 2 -> two virtual shards; the samples they used are those the metrics counted
    data = meta["data"]
    assert data["num_shards"] == 2 and sorted(data["shards"]) == ["0", "1"] and data["sources"] == ["train"]
    used = sum(sh["seen"][0] for sh in data["shards"].values())
    last = json.loads((run1 / "metrics.jsonl").read_text().splitlines()[-1])
    assert used == last["samples/train"] > STEPS * 2
    assert not list(root.glob(".tmp-*"))


def test_export_loads_with_transformers_and_matches_checkpoint(one_process_run, digits_jsonl):
    """The exported foundation loads with AutoModelForCausalLM and gives the trained model's logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnicore.config import Config
    from omnicore.eval.loading import load_trained

    run1, cfg = one_process_run
    trained, tok, _ = load_trained(Config.model_validate(cfg), checkpoint=str(run1 / "checkpoints" / f"step-{STEPS:08d}"))
    hf = AutoModelForCausalLM.from_pretrained(run1 / "export" / "foundation").eval()
    hf_tok = AutoTokenizer.from_pretrained(run1 / "export" / "foundation")
    ids = torch.tensor([hf_tok.encode("<|im_start|>user\nWhich digit is this?<|im_end|>\n")])
    assert ids.tolist() == [tok.encode("<|im_start|>user\nWhich digit is this?<|im_end|>\n")]
    with torch.no_grad():
        want = trained.lm(input_ids=ids).logits
        got = hf(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    # the trained weights really moved away from initialisation
    from omnicore.model.build import build_omni_model

    fresh, _ = build_omni_model(Config.model_validate(cfg))
    assert not torch.allclose(fresh.lm(input_ids=ids).logits, want)
    # encoders and decoders reload from the export too, with identical weights
    from omnicore.eval.loading import model_config_from_export

    mcfg = model_config_from_export(run1 / "export")
    reloaded, _ = build_omni_model(Config.model_validate(dict(cfg, model=mcfg.model_dump())))
    for name, p in trained.state_dict().items():
        assert torch.equal(p, reloaded.state_dict()[name]), name


def test_eval_cli_with_relative_export_path(one_process_run, digits_jsonl, tmp_path):
    """`omnicore eval CONFIG --export RELATIVE` resolves the export against the current directory
    (not the config's folder) and prints one accuracy line per task."""
    run1, cfg = one_process_run
    cfg2 = json.loads(json.dumps(cfg))
    cfg2["data"]["eval"] = str(digits_jsonl / "eval.jsonl")
    conf_dir = tmp_path / "configs"
    conf_dir.mkdir()
    path = _write_cfg(conf_dir / "cfg.yaml", cfg2)
    rel = os.path.relpath(run1 / "export", run1.parent.parent)
    out = _omnicore("eval", str(path), "--export", rel, "--limit", "6", cwd=run1.parent.parent).stdout
    lines = [line for line in out.splitlines() if "accuracy" in line]
    assert [line.split(":")[0] for line in lines] == ["audio_to_text", "image_to_text", "overall"]  # one line per task, sorted
    assert "/6, the tasks with text answers)" in lines[-1]


def test_fresh_run_into_a_used_output_dir_is_refused(one_process_run, tmp_path):
    """Training again into a folder with checkpoints neither overwrites them nor appends to their
    metrics: it stops with a message that says how to continue."""
    run1, cfg = one_process_run
    before = (run1 / "metrics.jsonl").read_text()
    path = _write_cfg(tmp_path / "cfg.yaml", cfg)
    proc = subprocess.run([sys.executable, "-m", "omnicore", "train", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        [x for x in proc.stderr.strip().splitlines() if x.startswith("error:")]
        == proc.stderr.strip().splitlines()[-1:]
        == [
            f"error: {run1 / 'checkpoints'} already holds a run (latest: step-{STEPS:08d}); continue it with --resume, or pick another --run.output_dir"
        ]
    )
    assert (run1 / "metrics.jsonl").read_text() == before


@pytest.mark.multiprocess
def test_sp2_by_overrides_only_matches_one_process(one_process_run, tmp_path):
    """Ulysses SP=2 on 2 processes chosen on the command line only (the recipe of
    examples/digits/README.md): both ranks read the same micro-batches and each handles half of
    every packed row; the first 3 steps' losses equal one process's (rtol 1e-5). ``stop_after``
    keeps the learning-rate schedule of the 4-step reference."""
    run1, cfg = one_process_run
    cfg2 = json.loads(json.dumps(cfg))
    cfg2["run"]["output_dir"] = str(tmp_path / "run")
    cfg2["train"].update(export=False, save_every=0)
    path = _write_cfg(tmp_path / "cfg.yaml", cfg2)
    overrides = ["--parallel.sp", "2", "--parallel.dp_shard", "1", "--parallel.strategies", "[ulysses]", "--train.stop_after", "3"]
    out = _omnicore("train", str(path), *overrides, nproc=2, cwd=tmp_path).stderr  # status lines are logged on stderr
    assert (
        "parallel: dp_replicate=1 x dp_shard=1 x ep=1 x sp=2 (world 2); strategies: ulysses; data split into 1 shard(s), one per data-parallel group"
        in out
    )
    one, two = _losses(run1)[:3], _losses(tmp_path / "run")
    assert len(two) == 3
    print(f"SP=2 vs one process: max loss rel diff {max(abs(a - b) / abs(b) for a, b in zip(two, one)):.2e}")
    assert two == pytest.approx(one, rel=1e-5)


TINY_MOE = {
    "model_type": "qwen2_moe",
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "decoder_sparse_step": 1,
    "max_position_embeddings": 1024,
}


@pytest.mark.multiprocess
def test_ep2_train_on_a_moe_foundation_matches_one_process(digits_jsonl, tmp_path):
    """`omnicore train` end to end with expert parallelism on a Qwen2-MoE foundation (routed and
    shared experts) and the multimodal data: EP=2 with FSDP2 on 2 processes (each rank reads its own
    micro-batch; the experts are split over the ranks, the dense weights sharded) equals one process
    with grad_accum=2 in losses (rtol 1e-5) and gradient norms (rtol 1e-5), which also checks
    gradient clipping over parameters on two meshes."""
    cfg = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(tmp_path / "one"), max_steps=3, grad_accum=2)
    cfg["model"]["foundation"]["options"]["config"] = dict(TINY_MOE)
    _omnicore("train", str(_write_cfg(tmp_path / "one.yaml", cfg)), cwd=tmp_path)
    cfg["run"]["output_dir"] = str(tmp_path / "ep")
    cfg["train"]["grad_accum"] = 1
    cfg["parallel"] = {"ep": 2, "dp_shard": 1, "strategies": ["ep", "fsdp2"]}
    out = _omnicore("train", str(_write_cfg(tmp_path / "ep.yaml", cfg)), nproc=2, cwd=tmp_path).stderr
    assert "ep=2" in out and "strategies: ep, fsdp2" in out
    rows = [[json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()] for r in ("one", "ep")]
    assert [r["loss"] for r in rows[1]] == pytest.approx([r["loss"] for r in rows[0]], rel=1e-5)
    assert [r["grad_norm"] for r in rows[1]] == pytest.approx([r["grad_norm"] for r in rows[0]], rel=1e-5)
    assert rows[0][0]["loss"] > rows[0][-1]["loss"]
