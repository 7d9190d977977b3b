"""``model.init_from``: stage 2 starts from exactly stage 1's weights (export and checkpoint form),
with a fresh optimizer, LR schedule and data position; ``--resume`` continues stage 2 itself; bad
folders and component mismatches fail before training, naming what is wrong."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_LM, tiny_config_dict

from omnicore.checkpoint.errors import CheckpointError
from omnicore.checkpoint.init_from import apply_export, peft_base_key, resolve_init_from
from omnicore.config import Config, LoraConfig

STEPS = 2


def _cfg(d: dict, source: Path, **model) -> Config:
    d = copy.deepcopy(d)
    d["model"].update(model)
    cfg = Config.model_validate(d)
    cfg.source = str(source)
    return cfg


@pytest.fixture(scope="module")
def stage1(digits_jsonl, tmp_path_factory):
    """Stage 1: the tiny omni model (image and audio encoders, image decoder) trained 2 steps,
    checkpointed every step and exported; returns (work folder, config dict, final weights)."""
    from omnicore.eval.loading import load_trained
    from omnicore.train.loop import train

    work = tmp_path_factory.mktemp("stages")
    d = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(work / "run1"), max_steps=STEPS, save_every=1, export=True)
    d["data"]["num_workers"] = 0
    d["train"]["warmup_steps"] = 2
    train(_cfg(d, work / "stage1.yaml"))
    final, _, _ = load_trained(_cfg(d, work / "stage1.yaml"), checkpoint=str(work / "run1" / "checkpoints" / f"step-{STEPS:08d}"))
    return work, d, {k: v.detach().clone() for k, v in final.state_dict().items()}


def _stage2(stage1, name: str, init_from: str | None, **train_kw):
    work, d, _ = stage1
    d2 = copy.deepcopy(d)
    d2["run"]["output_dir"] = str(work / name)
    d2["train"].update(train_kw)
    return _cfg(d2, work / "stage2.yaml", init_from=init_from)


def _state_of_setup(cfg: Config, **kw):
    from omnicore.train.loop import setup

    run = setup(cfg, **kw)
    run.data.close()
    return run, {k: v.detach().clone() for k, v in run.model.state_dict().items()}


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    different = [k for k in want if not torch.equal(got[k], want[k])]
    assert not different, different[:5]


@pytest.mark.slow
@pytest.mark.parametrize("form", ["export", "checkpoint"])
def test_stage2_starts_from_stage1_weights_with_fresh_optimizer(stage1, form):
    from omnicore.model.build import build_omni_model

    work, d, final = stage1
    # relative to the config file (work/stage2.yaml)
    rel = "run1/export" if form == "export" else f"run1/checkpoints/step-{STEPS:08d}"
    cfg = _stage2(stage1, f"run2-{form}", rel)
    run, weights = _state_of_setup(cfg)
    _assert_same(weights, final)
    # not trivially so: stage 1's training moved every weight of the foundation away from the seed's init
    init, _ = build_omni_model(_cfg(d, work / "stage1.yaml"))
    assert not torch.equal(init.state_dict()["lm.model.embed_tokens.weight"], final["lm.model.embed_tokens.weight"])
    # weights only: no AdamW state, the schedule at its first step (warm-up 1 of 2: lr / 2), no steps done
    assert len(run.optimizer.state) == 0
    assert run.scheduler.last_epoch == 0
    assert [g["lr"] for g in run.optimizer.param_groups] == [pytest.approx(3e-3 / 2)] * len(run.optimizer.param_groups)
    assert run.start == 0 and run.skipped_steps == 0
    if form == "export":
        # the exported foundation's tensors, read straight from its safetensors file
        from safetensors.torch import load_file

        files = sorted((work / "run1" / "export" / "foundation").glob("*.safetensors"))
        tensors = {k: v for f in files for k, v in load_file(f).items()}
        assert "model.layers.0.self_attn.q_proj.weight" in tensors
        for k, v in tensors.items():
            assert torch.equal(weights[f"lm.{k}"], v), k
        # the run's own export will be self-contained: init_from is consumed
        assert run.cfg.model.init_from is None


@pytest.mark.slow
def test_data_position_is_fresh(stage1):
    """The data pipeline starts where a run without init_from starts, not where stage 1 stopped."""
    run, _ = _state_of_setup(_stage2(stage1, "run2-data", "run1"))
    fresh, _ = _state_of_setup(_stage2(stage1, "run2-fresh", None))
    assert run.data.state_dict() == fresh.data.state_dict()


@pytest.mark.slow
def test_resume_continues_stage2_not_stage1(stage1):
    from omnicore.eval.loading import load_trained
    from omnicore.train.loop import train

    work, d, final = stage1
    cfg = _stage2(stage1, "run2-resume", f"run1/checkpoints/step-{STEPS:08d}", stop_after=1)
    train(cfg)
    ckpt = work / "run2-resume" / "checkpoints" / "step-00000001"
    own, _, _ = load_trained(_cfg(d, work / "x.yaml"), checkpoint=str(ckpt))
    run, weights = _state_of_setup(cfg, resume=True)
    assert run.start == 1
    _assert_same(weights, own.state_dict())
    assert not torch.equal(weights["lm.model.embed_tokens.weight"], final["lm.model.embed_tokens.weight"])
    assert len(run.optimizer.state) > 0 and run.scheduler.last_epoch == 1


@pytest.mark.slow
def test_run_folder_resolves_to_export_else_newest_checkpoint(stage1, tmp_path):
    work, d, _ = stage1
    cfg = _stage2(stage1, "r", str(work / "run1"))
    assert resolve_init_from(cfg) == resolve_init_from(_stage2(stage1, "r", "run1/export"))
    assert resolve_init_from(cfg).kind == "export" and resolve_init_from(cfg).folder == (work / "run1" / "export").resolve()
    # a run folder without an export (stopped early): its newest checkpoint that verifies
    shutil.copytree(work / "run1" / "checkpoints", tmp_path / "stopped" / "checkpoints")
    got = resolve_init_from(_stage2(stage1, "r", str(tmp_path / "stopped")))
    assert (got.kind, got.folder.name) == ("checkpoint", f"step-{STEPS:08d}")
    # ... skipping a corrupt newest one
    (tmp_path / "stopped" / "checkpoints" / f"step-{STEPS:08d}" / "trainer_state.json").write_text("{}")
    got = resolve_init_from(_stage2(stage1, "r", str(tmp_path / "stopped")))
    assert (got.kind, got.folder.name) == ("checkpoint", f"step-{STEPS - 1:08d}")


@pytest.mark.slow
def test_bad_folders_are_named(stage1, tmp_path):
    with pytest.raises(CheckpointError, match=r"model.init_from: nowhere .*no such folder"):
        resolve_init_from(_stage2(stage1, "r", "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"neither an export \(no omnicore.yaml\), a checkpoint"):
        resolve_init_from(_stage2(stage1, "r", str(tmp_path / "empty")))
    # a corrupt checkpoint named directly: the bad file is named
    work = stage1[0]
    bad = tmp_path / "step-00000002"
    shutil.copytree(work / "run1" / "checkpoints" / f"step-{STEPS:08d}", bad)
    (bad / "trainer_state.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"model.init_from: checkpoint .* is corrupt: .*trainer_state.json"):
        resolve_init_from(_stage2(stage1, "r", str(bad)))


@pytest.mark.slow
def test_cli_reports_a_bad_init_from_in_one_line(stage1, tmp_path, capsys):
    import yaml

    from omnicore.cli import main

    work, d, _ = stage1
    d2 = copy.deepcopy(d)
    d2["run"]["output_dir"] = str(tmp_path / "out")
    d2["model"]["init_from"] = "missing-run"
    path = tmp_path / "stage2.yaml"
    path.write_text(yaml.safe_dump(d2))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # start-up status lines (omnicore.logs), then one error line
    assert not any("Traceback" in x for x in err)
    assert [x for x in err if x.startswith("error:")] == err[-1:] == [f"error: model.init_from: missing-run ({(tmp_path / 'missing-run').resolve()}): no such folder; give a run folder, "
                   "its export/ or a checkpoint (checkpoints/step-NNNNNNNN)"]  # fmt: skip


@pytest.mark.slow
def test_component_mismatch_with_the_export_is_named(stage1):
    work, d, _ = stage1
    export = work / "run1" / "export"
    cfg = _stage2(stage1, "r", "run1/export")
    no_audio = cfg.model_copy(update={"model": cfg.model.model_copy(update={"encoders": {"image": cfg.model.encoders["image"]}})})
    with pytest.raises(CheckpointError, match=r"also holds model.encoders.audio, which this config lacks"):
        apply_export(no_audio, export)
    video = dict(cfg.model.encoders, video=cfg.model.encoders["image"])
    with pytest.raises(CheckpointError, match=r"holds no model.encoders.video"):
        apply_export(cfg.model_copy(update={"model": cfg.model.model_copy(update={"encoders": video})}), export)
    other = {"image": cfg.model.decoders["image"].model_copy(update={"name": "other_tokenizer"})}
    with pytest.raises(CheckpointError, match=r"model.decoders.image is 'other_tokenizer' here but 'movqgan' in"):
        apply_export(cfg.model_copy(update={"model": cfg.model.model_copy(update={"decoders": other})}), export)
    # a matching config: every component points at its export folder, architecture options dropped, others kept
    got = apply_export(cfg, export).model
    assert got.foundation.options == {"checkpoint": str(export / "foundation")}
    assert got.encoders["audio"].options == {"checkpoint": str(export / "encoders" / "audio"), "chunk_seconds": 2.5, "pool": 5}
    assert got.decoders["image"].options == {"checkpoint": str(export / "decoders" / "image"), "image_size": 32}


@pytest.mark.slow
def test_an_export_with_its_adapter_apart_is_refused(stage1, tmp_path):
    """model.lora.export: adapter leaves the trained adapter in foundation_lora/: starting from the
    folders alone would silently drop it."""
    import shutil

    work, _, _ = stage1
    export = tmp_path / "export"
    shutil.copytree(work / "run1" / "export", export)
    (export / "foundation_lora").mkdir()
    cfg = _stage2(stage1, "r-adapter", "run1/export")
    with pytest.raises(CheckpointError, match=r"holds its LoRA adapter apart \(foundation_lora/.*Start from that run's checkpoint"):
        apply_export(cfg, export)


@pytest.mark.slow
def test_checkpoint_that_does_not_fit_the_model_names_the_keys(stage1):
    """Checkpoint form, strict: stage 2 without the audio encoder meets stage 1's audio tensors."""
    cfg = _stage2(stage1, "r-strict", f"run1/checkpoints/step-{STEPS:08d}")
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"encoders": {"image": cfg.model.encoders["image"]}})})
    with pytest.raises(CheckpointError, match=r"does not fit this model: \d+ tensor\(s\) this model does not have: encoders\.audio\."):
        _state_of_setup(cfg)


def test_peft_base_key():
    assert peft_base_key("lm.base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == (
        "lm.model.layers.0.self_attn.q_proj.weight"
    )
    assert peft_base_key("lm.model.embed_tokens.weight") == "lm.model.embed_tokens.weight"


@pytest.mark.slow
def test_checkpoint_form_into_a_model_with_lora_adapters(stage1):
    """Stage 2 with model.lora from a stage-1 checkpoint without adapters: every base weight is
    stage 1's (matched through PEFT's base_layer names), the adapters keep their fresh init."""
    work, d, final = stage1
    cfg = _stage2(stage1, "r-lora", f"run1/checkpoints/step-{STEPS:08d}")
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": LoraConfig(r=4, modules=["lm"])})})
    _, weights = _state_of_setup(cfg)
    adapters = {k for k in weights if ".lora_" in k}
    assert len(adapters) == 2 * 4 * TINY_LM["num_hidden_layers"]  # lora_A and lora_B of q, k, v, o per layer
    assert all(not weights[k].any() for k in adapters if ".lora_B." in k)  # B starts at zero: the model is stage 1's
    base = {peft_base_key(k): v for k, v in weights.items() if k not in adapters}
    _assert_same(base, final)


@pytest.mark.cli
@pytest.mark.multiprocess
@pytest.mark.parametrize("form", ["export", "checkpoint"])
def test_fsdp2_two_processes_start_from_the_same_weights(stage1, tmp_path, form):
    """init_from under FSDP2 on 2 processes (each rank fills its shards) gives the first-step loss
    of 1 process (same global batch: 2 micro-batches on 1 process, 1 on each of 2), rel 1e-6; and
    that loss is stage 1's model on the new data, not a fresh model's."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    from omnicore.train.loop import train

    work, d, _ = stage1
    rel = "run1/export" if form == "export" else f"run1/checkpoints/step-{STEPS:08d}"
    one = _stage2(stage1, f"one-{form}", rel, max_steps=1, grad_accum=2, export=False)
    loss_one = train(one)[0]["loss"]
    two = copy.deepcopy(d)
    two["run"]["output_dir"] = str(tmp_path / "two")
    two["model"]["init_from"] = str(work / rel)
    two["train"].update(max_steps=1, grad_accum=1, export=False)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(two))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "omnicore", "train", "cfg.yaml"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    loss_two = json.loads((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    assert loss_two == pytest.approx(loss_one, rel=1e-6)
    fresh = train(_stage2(stage1, f"fresh-{form}", None, max_steps=1, grad_accum=2, export=False))[0]["loss"]
    assert abs(fresh - loss_one) > 1e-3
