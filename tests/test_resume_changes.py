"""``--resume`` says what changed and applies it or refuses it: a new learning rate is the one the
resumed steps train and log (equal to a straight run at that rate), a ``max_steps`` at or below the
checkpoint's step is an error, a changed model shape or ``train.freeze`` is refused naming the
setting with both values, and the ``continue with:`` command keeps the user's overrides and the
torchrun launch."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import tiny_config_dict

from omnicore.checkpoint import changes
from omnicore.checkpoint.changes import ResumeError, continue_command
from omnicore.config import Config, ConfigError

STEPS = 6


def _cfg(text_jsonl: Path, out: Path, **train) -> Config:
    d = tiny_config_dict(str(text_jsonl), decoders=False, output_dir=str(out), **dict({"max_steps": STEPS, "warmup_steps": 1}, **train))
    d["model"]["encoders"] = {}
    return Config.model_validate(d)


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def stopped(text_jsonl, tmp_path_factory) -> Path:
    """A run at lr 1e-3 stopped after 3 of 6 steps (train.stop_after): the folder to resume; each
    test resumes a copy of it."""
    from omnicore.train.loop import train

    out = tmp_path_factory.mktemp("stopped") / "run"
    train(_cfg(text_jsonl, out, lr=1e-3, stop_after=3))
    return out


@pytest.fixture
def run(stopped, tmp_path) -> Path:
    import shutil

    shutil.copytree(stopped, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.slow
def test_a_resumed_run_at_a_new_lr_trains_and_logs_the_new_lr(text_jsonl, run, tmp_path, caplog):
    """After 3 steps at 1e-3, --resume --train.lr 1e-2: steps 4-6 log (and train at) the learning
    rates of a straight run at 1e-2 (6.891e-03 at step 4, not the 6.891e-04 of the old rate)."""
    from omnicore.train.loop import train

    with caplog.at_level(logging.INFO, logger="omnicore"):
        train(_cfg(text_jsonl, run, lr=1e-2), resume=True)
    straight = tmp_path / "straight"
    train(_cfg(text_jsonl, straight, lr=1e-2))
    got, want = _rows(run), _rows(straight)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in got[3:]] == pytest.approx([r["lr"] for r in want[3:]], rel=1e-12)
    assert got[3]["lr"] == pytest.approx(6.891e-3, rel=1e-3)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("resume from step 3"))
    assert "train.lr 0.001 -> 0.01 (applied)" in line and "train.stop_after 3 -> None (applied)" in line
    assert "the learning rate of step 4 is 0.006891 (the checkpoint's schedule: 0.0006891)" in line


@pytest.mark.slow
def test_resume_without_changes_says_so_and_equals_a_straight_run(text_jsonl, run, tmp_path, caplog):
    from omnicore.train.loop import train

    with caplog.at_level(logging.INFO, logger="omnicore"):
        train(_cfg(text_jsonl, run, lr=1e-3, stop_after=3).model_copy(update={"train": _cfg(text_jsonl, run, lr=1e-3).train}), resume=True)
    assert any("train.stop_after 3 -> None (applied)" in r.getMessage() for r in caplog.records)
    straight = tmp_path / "straight"
    train(_cfg(text_jsonl, straight, lr=1e-3))
    assert [r["loss"] for r in _rows(run)] == pytest.approx([r["loss"] for r in _rows(straight)], rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("max_steps", [2, 3])
def test_max_steps_at_or_below_the_resumed_step_is_an_error(text_jsonl, run, max_steps):
    from omnicore.train.loop import train

    with pytest.raises(
        ConfigError, match=rf"train.max_steps {max_steps} is at or below the checkpoint's step 3 .*nothing is left to train"
    ):
        train(_cfg(text_jsonl, run, lr=1e-3, max_steps=max_steps), resume=True)


@pytest.mark.slow
def test_a_changed_model_shape_is_refused_naming_it(text_jsonl, run):
    from omnicore.train.loop import train

    cfg = _cfg(text_jsonl, run, lr=1e-3)
    cfg.model.foundation.options["config"]["intermediate_size"] = 96
    with pytest.raises(ResumeError) as info:
        train(cfg, resume=True)
    msg = str(info.value)
    assert "model.foundation.options.config.intermediate_size: 64 in the checkpoint, 96 now (the model's parameters)" in msg
    assert "Missing key" not in msg and "--model.init_from" in msg


@pytest.mark.slow
def test_a_changed_freeze_is_refused_naming_it(text_jsonl, run):
    from omnicore.train.loop import train

    with pytest.raises(
        ResumeError, match=r"train.freeze: \[\] in the checkpoint, \['lm.model.embed_tokens'\] now \(which parameters train"
    ):
        train(_cfg(text_jsonl, run, lr=1e-3, freeze=["lm.model.embed_tokens"]), resume=True)


def test_changes_sorted_into_applied_and_refused(text_jsonl, tmp_path):
    a = _cfg(text_jsonl, tmp_path / "a", lr=1e-3)
    d = json.loads(json.dumps(a.model_dump(mode="json")))
    d["run"]["output_dir"] = str(tmp_path / "b")  # where the checkpoint was found: not compared
    d["train"].update(lr=2e-3, grad_accum=2)
    d["data"].update(num_workers=3, max_tokens=256)
    d["model"]["kernels"] = {"attention": "eager"}
    got = {c.key: (c.was, c.now, c.refused) for c in changes.resume_changes(changes.config_json(a), Config.model_validate(d))}
    assert got == {
        "train.lr": (1e-3, 2e-3, ""),
        "train.grad_accum": (1, 2, ""),
        "data.num_workers": (2, 3, ""),
        "data.max_tokens": (512, 256, "the data stream (which samples come next)"),
        "model.kernels.attention": (None, "eager", ""),
    }


def test_continue_command_keeps_the_overrides_and_the_torchrun_launch(text_jsonl, tmp_path, monkeypatch):
    cfg = _cfg(text_jsonl, tmp_path / "run")
    cfg.source = "cfg.yaml"
    cfg.command = ["train", "cfg.yaml", "--train.max_steps", "800", "--run.output_dir", "runs/x"]
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert continue_command(cfg) == "omnicore train cfg.yaml --train.max_steps 800 --run.output_dir runs/x --resume"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    script = "/opt/venv/bin/torchrun"  # the console script, as the launcher's /proc/PID/cmdline shows it
    launcher = Path(script).name
    launch = ["/usr/bin/python3", script, "--nproc-per-node", "2", "-m", "omnicore", "train", "cfg.yaml"]
    monkeypatch.setattr(changes, "_parent_command", lambda: launch)
    rest = "train cfg.yaml --train.max_steps 800 --run.output_dir runs/x --resume"
    assert continue_command(cfg) == f"{launcher} --nproc-per-node 2 -m omnicore {rest}"
    monkeypatch.setattr(changes, "_parent_command", lambda: [])  # no /proc: rebuilt from the launcher's environment
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert continue_command(cfg) == f"{launcher} --nnodes=2 --nproc-per-node=4 -m omnicore {rest}"


def test_a_checkpoint_without_a_config_still_says_what_a_missing_key_means(text_jsonl, stopped, tmp_path):
    """Loading into a model of another shape (as a checkpoint written before configs were kept
    would be): the error says that the model or the trained parameters differ, not just the key."""
    import torch

    from omnicore.checkpoint.dcp import CheckpointError, load_checkpoint
    from omnicore.model.build import build_omni_model
    from omnicore.parallel.state import ParallelState

    cfg = _cfg(text_jsonl, tmp_path / "other", lr=1e-3)
    cfg.model.foundation.options["config"]["num_hidden_layers"] = 3
    model, _ = build_omni_model(cfg)
    with pytest.raises(CheckpointError, match=r"Missing key.*; this run's model \(its shape, model.lora\) or its trained parameters"):
        load_checkpoint(stopped / "checkpoints" / "step-00000003", model, None, None, ParallelState(0, 1, 0, torch.device("cpu")))


def test_changes_to_a_finished_run_say_no_step_trains_with_them():
    """A resume of a run that ended at its max_steps (only exported again) lists a new lr as applied
    but names no learning rate of a step that will not run; it says how to train on instead. An
    unfinished run names the next step's rate under both schedules."""
    from omnicore.checkpoint.changes import Change, describe_changes

    changes = [Change("train.lr", 0.001, 0.0005)]
    done = describe_changes(changes, 20, 1e-4, 5e-5, finished=True)
    assert done == (
        "resume from step 20: 1 setting(s) differ from the checkpoint's: train.lr 0.001 -> 0.0005 (applied); the run finished "
        "at step 20 (train.max_steps), so no step trains with them: to train on, give --train.max_steps N with N > 20"
    )
    assert describe_changes(changes, 20, 1e-4, 5e-5).endswith("the learning rate of step 21 is 5e-05 (the checkpoint's schedule: 0.0001)")
