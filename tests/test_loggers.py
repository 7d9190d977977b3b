"""Loggers as a plugin kind (``run.loggers``): the built-in ``jsonl`` logger writes metrics.jsonl as
before, several loggers run at once, a logger that raises while logging is reported once and the run
goes on, one that cannot start stops the run before step 1 with one ``error:`` line; and the
LoggerContract suite passes on good loggers and catches a broken one."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import logger_fakes
import pytest
from conftest import tiny_config_dict

from omnicore import cli
from omnicore.config import Config
from omnicore.testing import LoggerContract, isolated_registry
from omnicore.train import loop
from omnicore.train.loggers import LoggerError, Loggers, LoggerWarning, start_loggers


def _cfg(text_jsonl: Path, out: Path, loggers: list | None = None, **train) -> Config:
    d = tiny_config_dict(str(text_jsonl), decoders=False, output_dir=str(out), max_steps=3, **train)
    d["model"]["encoders"] = {}
    if loggers is not None:
        d["run"]["loggers"] = loggers
    return Config.model_validate(d)


def _registry():
    return isolated_registry([(logger_fakes, "fakes")], builtins=True)


def _calls(name: str, method: str) -> list:
    return [arg for who, what, arg in logger_fakes.CALLS if who == name and what == method]


@pytest.fixture(autouse=True)
def _fresh_calls():
    logger_fakes.CALLS.clear()


@pytest.mark.slow
def test_default_jsonl_writes_the_rows_as_before(text_jsonl, tmp_path):
    cfg = _cfg(text_jsonl, tmp_path / "run", log_every=1)
    assert cfg.run.loggers == ["jsonl"]  # the default
    history = loop.train(cfg)
    # today's format, computed the way log_step wrote it before loggers existed
    clean = [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()} for r in history]
    want = "".join(json.dumps(r, allow_nan=False) + "\n" for r in clean)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == want
    assert [r["step"] for r in history] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in history)


@pytest.mark.slow
def test_two_loggers_and_one_that_fails_mid_run(text_jsonl, tmp_path):
    cfg = _cfg(text_jsonl, tmp_path / "run", ["jsonl", "recording", "failing_log"], log_every=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = loop.train(cfg, registry=_registry())
    assert [r["step"] for r in history] == [1, 2, 3]  # the run went on
    ours = [w for w in caught if issubclass(w.category, LoggerWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]  # reported once, not once per step
    assert str(ours[0].message) == (
        "run.loggers[2] (failing_log): log_metrics raised ConnectionError: server went away; this logger is skipped for the rest of the run"
    )
    assert len(_calls("failing_log", "log_metrics")) == 1  # skipped after its failure
    assert len(_calls("failing_log", "close")) == 1  # still closed (it may hold files)
    # the recording logger got every row, with the values metrics.jsonl holds
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    got = _calls("recording", "log_metrics")
    assert [(step, split) for step, _, split in got] == [(1, "train"), (2, "train"), (3, "train")]
    assert [row["loss"] for _, row, _ in got] == [r["loss"] for r in rows] == [r["loss"] for r in history]
    (info,) = _calls("recording", "start")
    assert info["output_dir"] == str(tmp_path / "run") and info["run_name"] == "run" and info["resume"] is False
    assert info["config"]["run"]["loggers"] == ["jsonl", "recording", "failing_log"] and info["start_step"] == 0
    assert len(_calls("recording", "close")) == 1


@pytest.mark.slow
def test_resume_after_a_crash_leaves_one_row_per_step(text_jsonl, tmp_path):
    """The state a kill -9 leaves after step 3 was logged but before it was saved (checkpoint of
    step 2, rows of steps 1-3 and half a line of step 4, validation row of step 3): after --resume
    metrics.jsonl and the other loggers hold each step once, with the resumed run's values."""
    import shutil

    import torch

    val = tmp_path / "val.jsonl"
    shutil.copy(text_jsonl, val)
    d = tiny_config_dict(
        str(text_jsonl), eval=str(val), decoders=False, output_dir=str(tmp_path / "run"), max_steps=4, save_every=2, log_every=1
    )
    d["model"]["encoders"], d["run"]["loggers"], d["eval"] = {}, ["jsonl", "recording"], {"every": 3}
    cfg = Config.model_validate(d)
    loop.train(cfg, registry=_registry())
    run = tmp_path / "run"
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    (run / "checkpoints" / "latest").write_text("step-00000002")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    want = [(1, None), (2, None), (3, None), (3, "val"), (4, None), (4, "val")]  # validation every 3 steps and at the end
    assert [(json.loads(x)["step"], json.loads(x).get("split")) for x in lines] == want
    (run / "metrics.jsonl").write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:40])  # killed while writing step 4's row
    torch.manual_seed(123)  # the resumed run's RNG comes from the checkpoint, not from here
    resumed = loop.train(cfg, resume=True, registry=_registry())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("split")) for r in rows] == want
    assert [r["loss"] for r in rows if r.get("split") is None][2:] == [r["loss"] for r in resumed]
    stored = logger_fakes.read_back(run, "recording")
    assert [s for s, _ in stored[("train", "loss")]] == [1, 2, 3, 4] and [s for s, _ in stored[("val", "val_loss")]] == [3, 4]


@pytest.mark.slow
def test_log_every_applies_to_every_logger(text_jsonl, tmp_path):
    loop.train(_cfg(text_jsonl, tmp_path / "run", ["recording"], log_every=2), registry=_registry())
    assert [step for step, _, _ in _calls("recording", "log_metrics")] == [2, 3]  # every 2nd step and the last
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # jsonl not chosen: no metrics file


def test_a_logger_that_cannot_start_stops_the_run_before_step_1(text_jsonl, tmp_path, monkeypatch):
    steps = []
    monkeypatch.setattr(loop, "train_step", lambda run, step: steps.append(step))
    cfg = _cfg(text_jsonl, tmp_path / "run", ["recording", "failing_start"])
    with pytest.raises(LoggerError) as ei:
        loop.train(cfg, registry=_registry())
    assert str(ei.value) == "run.loggers[1] (failing_start): start failed: PermissionError: cannot write to /nowhere/events"
    assert steps == []  # no step ran
    assert len(_calls("recording", "close")) == 1  # the logger started before it was closed


def test_cli_prints_one_error_line_for_a_logger_that_cannot_start(text_jsonl, tmp_path, monkeypatch, capsys):
    reg = _registry()
    monkeypatch.setattr(loop, "registry_for", lambda cfg: reg)
    d = tiny_config_dict(str(text_jsonl), decoders=False, output_dir=str(tmp_path / "run"), max_steps=3)
    d["model"]["encoders"], d["run"]["loggers"] = {}, ["jsonl", "failing_start"]
    (tmp_path / "c.json").write_text(json.dumps(d))
    assert cli.main(["train", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: run.loggers[1] (failing_start): start failed: PermissionError: cannot write to /nowhere/events"
    assert [ln for ln in err if ln.startswith("error:")] == [err[-1]]


def test_unknown_logger_fails_before_the_model_is_built(text_jsonl, tmp_path, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("the model was built before the loggers were checked")

    monkeypatch.setattr(loop, "_model_to_train", no_build)
    with pytest.raises(LoggerError) as ei:
        loop.train(_cfg(text_jsonl, tmp_path / "run", ["jsonl", "jsnl"]))
    assert str(ei.value).startswith("run.loggers[1] (jsnl): no logger named 'jsnl'; did you mean 'jsonl'?")
    with pytest.raises(LoggerError, match=r"^run.loggers\[0\] \(jsonl\): options of logger/jsonl: every: unknown key"):
        loop.train(_cfg(text_jsonl, tmp_path / "run2", [{"name": "jsonl", "options": {"every": 2}}]))


def test_only_rank_0_builds_loggers(tmp_path):
    cfg = Config.model_validate({"run": {"output_dir": str(tmp_path), "loggers": ["recording"]}, "data": {"train": "x.jsonl"}})
    other = start_loggers(cfg, _registry(), is_main=False)
    assert len(other) == 0 and logger_fakes.CALLS == []
    main = start_loggers(cfg, _registry(), is_main=True)
    assert len(main) == 1 and [c[:2] for c in logger_fakes.CALLS] == [("recording", "start")]
    main.close()
    main.close()  # idempotent
    assert len(_calls("recording", "close")) == 1


def test_jsonl_writes_validation_rows_with_their_split(tmp_path):
    cfg = Config.model_validate({"run": {"output_dir": str(tmp_path)}, "data": {"train": "x.jsonl"}})
    logs = start_loggers(cfg, isolated_registry(builtins=True), is_main=True)
    logs.log_metrics(2, {"step": 2, "loss": 1.5, "grad_norm": float("inf")}, "train")
    logs.log_metrics(2, {"loss": 1.75}, "val")
    logs.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines == ['{"step": 2, "loss": 1.5, "grad_norm": null}', '{"step": 2, "split": "val", "loss": 1.75}']


def test_loggers_without_any():
    logs = Loggers()
    logs.log_metrics(1, {"loss": 1.0})
    logs.log_images(1, "x", [])
    logs.close()
    assert logs.failed == []


# ---- the contract suite, on the built-in and on fakes -------------------------------------------


class TestJsonlContract(LoggerContract):
    name = "jsonl"
    plugin = logger_fakes  # an isolated registry: the built-ins plus the fakes
    provider = "fakes"
    hook_module = "omnicore.builtins"

    def read_back(self, output_dir):
        out: dict = {}
        for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            for key, value in row.items():
                if key not in ("step", "split") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    out.setdefault((row.get("split", "train"), key), []).append((row["step"], value))
        return out


class TestRecordingContract(LoggerContract):
    name = "recording"
    plugin = logger_fakes
    provider = "fakes"

    def read_back(self, output_dir):
        return logger_fakes.read_back(output_dir, "recording")


def test_contract_catches_a_logger_that_stores_wrong_values(tmp_path):
    class Broken(LoggerContract):
        name = "wrong_values"
        plugin = logger_fakes
        provider = "fakes"

        def read_back(self, output_dir):
            return logger_fakes.read_back(output_dir, "wrong_values")

    with pytest.raises(AssertionError, match="loss"):
        Broken().test_stored_values_match_logged(tmp_path)


def test_contract_catches_a_logger_that_keeps_rows_after_the_resumed_step(tmp_path):
    class Stale(LoggerContract):
        name = "stale_rows"
        plugin = logger_fakes
        provider = "fakes"

        def read_back(self, output_dir):
            return logger_fakes.read_back(output_dir, "stale_rows")

    with pytest.raises(AssertionError, match=r"train 'loss' stored at steps \[1, 2, 2\], logged at \[1, 2\]"):
        Stale().test_resume_drops_rows_after_the_resumed_step(tmp_path)


def test_contract_catches_a_logger_that_raises(tmp_path):
    class Raising(LoggerContract):
        name = "failing_log"
        plugin = logger_fakes
        provider = "fakes"

    with pytest.raises(ConnectionError):
        Raising().test_logs_rows_and_images_without_raising(tmp_path)
