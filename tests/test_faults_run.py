"""Faults of issue 27 item 10, part B: each injected as the fault tests found it, each asserting the
message, checkpoint or export it must leave.

* non-finite hyperparameters are config errors naming the field, and nothing non-finite is saved;
* a full disk during export: one line with the space needed and free, no ``.export.tmp`` left, and
  ``--resume`` of the finished run exports it;
* a damaged export (truncated or garbled safetensors, bad ``tokenizer.json`` or ``omnicore.yaml``)
  is one line naming the file, for ``eval --export`` and ``model.init_from`` alike;
* a data worker killed with SIGKILL: no error from an arbitrary line, the documented message where
  data is read, and the data position of the last whole step kept;
* a huge JSONL line is refused before it is read whole or tokenized (peak memory measured);
* a logger raising ``SystemExit`` or ``KeyboardInterrupt`` stops the run like a signal, after saving.

Runs go through the CLI in process (``omnicore.cli.main``) on the tiny text model.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import re
import shutil
import signal
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from conftest import tiny_config_dict

from omnicore import cli
from omnicore.checkpoint.errors import CheckpointError
from omnicore.config import Config, ConfigError, load_config

# ---- helpers ----------------------------------------------------------------------------------------


def _config_file(text_jsonl: Path, folder: Path, **train) -> Path:
    """A config file for the tiny text model writing to ``folder/run``; returns its path."""
    d = tiny_config_dict(str(text_jsonl), decoders=False, output_dir=str(folder / "run"), **dict({"max_steps": 2}, **train))
    d["model"]["encoders"] = {}
    d["data"]["num_workers"] = 0
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "c.yaml").write_text(json.dumps(d))
    return folder / "c.yaml"


# ---- non-finite hyperparameters ---------------------------------------------------------------------


def test_nonfinite_hyperparameters_are_config_errors_naming_the_field(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {train: t.jsonl}\ntrain: {lr: .inf}\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert str(info.value) == f"{cfg}: train.lr: inf is not a finite number; give a finite value"
    cfg.write_text("data: {train: t.jsonl}\nmodel: {foundation: {name: hf_causal_lm}}\n")
    cases = {
        ("--train.betas", "[0.9, .nan]"): "command line (--train.betas): train.betas.1: nan is not a finite number; give a finite value",
        ("--train.weight_decay", "-.inf"): "command line (--train.weight_decay): train.weight_decay: -inf is not a finite number; "
        "give a finite value",
        ("--train.warmup_steps", ".inf"): "command line (--train.warmup_steps): train.warmup_steps: inf is not a finite number; "
        "give a finite value",
        ("--train.lr_multipliers", "{lm: .nan}"): "command line (--train.lr_multipliers.lm): train.lr_multipliers.lm: nan is not a "
        "finite number; give a finite value",
        ("--generate.temperature", ".nan"): "command line (--generate.temperature): generate.temperature: nan is not a finite number; "
        "give a finite value",
        # free-form options (the foundation's transformers config: eps, loss weights, ...) too, at any depth
        ("--model.foundation.options", "{config: {rms_norm_eps: .inf}}"): "command line (--model.foundation.options.config.rms_norm_eps): "
        "model.foundation.options.config.rms_norm_eps: inf is not a finite number; give a finite value",
    }
    for override, want in cases.items():
        with pytest.raises(ConfigError) as info:
            load_config(cfg, list(override))
        assert str(info.value) == want
    assert load_config(cfg, ["--train.lr", "1e39"]).train.lr == 1e39  # finite, however large: accepted


def test_nonfinite_tensors_names_weights_and_optimizer_state():
    from omnicore.train.optim import nonfinite_tensors

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert nonfinite_tensors(model, opt) == []
    with torch.no_grad():
        model[1].bias[0] = float("nan")
    opt.state[model[0].weight]["exp_avg_sq"][0, 0] = float("inf")
    assert nonfinite_tensors(model, opt) == ["1.bias", "0.weight: exp_avg_sq"]
    assert nonfinite_tensors(model) == ["1.bias"]


@pytest.mark.slow
def test_weights_made_nonfinite_at_a_finite_loss_are_never_saved(text_jsonl, tmp_path, monkeypatch):
    """lr 1e39 (finite, so accepted) makes step 1's update overflow: its loss and gradient norm are
    finite, the weights after it are not. Step 2 says so (not "the last finite step"), and a save
    of those weights is refused, writing nothing."""
    from omnicore.train import loop
    from omnicore.train.optim import NonFiniteError

    runs = []
    real_setup = loop.setup
    monkeypatch.setattr(loop, "setup", lambda *a, **k: runs.append(real_setup(*a, **k)) or runs[-1])
    cfg = load_config(_config_file(text_jsonl, tmp_path, lr=1e39, max_steps=3, save_every=2, export=True))
    with pytest.raises(NonFiniteError) as info:
        loop.train(cfg)
    run = runs[0]
    bad = [n for n, p in run.model.named_parameters() if not torch.isfinite(p).all()]  # the reference: torch itself
    assert bad, "lr 1e39 should have made the weights non-finite"
    msg = str(info.value)
    assert msg.startswith("non-finite training step 2: loss nan, gradient norm nan; the weights themselves already hold NaN or inf (")
    first = re.search(r"\((\d+) tensor\(s\), the first ([^)]+)\)", msg)
    assert int(first.group(1)) == len(bad) and first.group(2) == bad[0], msg
    assert "the weights are those of the last finite step" not in msg
    with pytest.raises(NonFiniteError) as info:  # the guard at save time: nothing is written
        loop.save(run, 1)
    assert str(info.value).startswith(f"step 1: not saved: the weights or optimizer state hold NaN or inf ({len(bad)} tensor(s), ")
    assert "no checkpoint was written" in str(info.value)
    ckpts = tmp_path / "run" / "checkpoints"
    assert not ckpts.exists() or not any(ckpts.iterdir())
    assert not (tmp_path / "run" / "export").exists()


# ---- a full disk during export, then --resume exports ------------------------------------------------


def _fail_with(exc: BaseException):
    """A stand-in for write_export that writes part of the export, then fails with ``exc``."""

    def write_export(model, tokenizer, cfg, out, registry=None):
        (out / "foundation").mkdir(parents=True)
        (out / "foundation" / "model.safetensors").write_bytes(b"\0" * 1000)
        raise exc

    return write_export


@pytest.fixture(scope="module")
def full_disk_run(text_jsonl, tmp_path_factory):
    """A 2-step run whose export hits a full disk (OSError ENOSPC), then a --resume that hits it
    again (safetensors' own error text), then a --resume with room: returns the folder, the return
    codes and the error lines of each."""
    from safetensors import SafetensorError

    from omnicore.checkpoint import export

    folder = tmp_path_factory.mktemp("fulldisk")
    cfg = _config_file(text_jsonl, folder, export=True)
    out = folder / "run"
    rust = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')
    results = []
    real = export.write_export
    for failure, args in [
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / ".export.tmp" / "foundation" / "model.safetensors")), []),
        (rust, ["--resume"]),
        (None, ["--resume"]),
    ]:
        export.write_export = real if failure is None else _fail_with(failure)
        err = io.StringIO()  # capsys is function-scoped: the module's runs capture stderr by hand
        try:
            with contextlib.redirect_stderr(err):
                rc = cli.main(["train", str(cfg), *args])
        finally:
            export.write_export = real
        results.append((rc, [x for x in err.getvalue().splitlines() if x.startswith("error:")], err.getvalue()))
    return folder, results


@pytest.mark.slow
def test_a_full_disk_during_export_is_one_line_and_resume_exports(full_disk_run):
    from safetensors import safe_open

    folder, results = full_disk_run
    out = folder / "run"
    (rc1, errors1, _), (rc2, errors2, _), (rc3, errors3, log3) = results
    export_dir = out / "export"
    # what the weights take, read back from the export written at last (another way than the message's sum)
    need = 0
    for f in export_dir.rglob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            need += sum(st.get_tensor(k).numel() * st.get_tensor(k).element_size() for k in st.keys())
    size = f"{need / 1e3:.1f} kB"
    assert rc1 == 2 and len(errors1) == 1, errors1
    again = f"omnicore train {folder / 'c.yaml'} --resume"
    assert re.fullmatch(
        rf"error: cannot write the export {re.escape(str(export_dir))}: the disk is full at {re.escape(str(out / '.export.tmp'))}"
        rf"/foundation/model\.safetensors \(the export needs about {re.escape(size)} for the weights, [\d.]+ [kMG]B are free there\); "
        rf"the partial export was removed; free space, then export the finished run with: {re.escape(again)}",
        errors1[0],
    ), errors1[0]
    # safetensors' Rust error (no OSError) is read for its errno: the same line
    assert rc2 == 2 and len(errors2) == 1 and f"the disk is full at {out} (the export needs about {size}" in errors2[0], errors2
    assert rc3 == 0 and errors3 == [] and "the run finished at this step (train.max_steps); nothing is left to train" in log3
    assert (export_dir / "omnicore.yaml").is_file() and not (out / ".export.tmp").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step-")) == ["step-00000002"]


# ---- a damaged export: one line naming the file ----------------------------------------------------


def _damaged(export: Path, tmp_path: Path, name: str, damage) -> Path:
    copy = tmp_path / name / "export"
    shutil.copytree(export, copy)
    damage(copy)
    return copy


def _truncate(path: Path, n: int = 100) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-n])


def _garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:24] = b"\xff" * 16
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_damaged_export_is_one_line_naming_the_file(full_disk_run, tmp_path, text_jsonl):
    from omnicore.checkpoint.export_files import EXPORT_DAMAGED
    from omnicore.checkpoint.init_from import apply_export
    from omnicore.eval.loading import model_config_from_export

    export = full_disk_run[0] / "run" / "export"
    weights = export / "foundation" / "model.safetensors"
    size = weights.stat().st_size
    header = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
    cases = {
        "truncated": (lambda e: _truncate(e / "foundation" / "model.safetensors"), "foundation/model.safetensors",
                      f"truncated: {size - 100} bytes, its header describes {size}"),
        "cut_in_header": (lambda e: _truncate(e / "foundation" / "model.safetensors", size - header + 10), "foundation/model.safetensors",
                          f"truncated or not a safetensors file: its header length {header - 8} does not fit its {header - 10} bytes"),
        "garbled": (lambda e: _garble_header(e / "foundation" / "model.safetensors"), "foundation/model.safetensors",
                    "not a safetensors file: its header is not valid JSON ("),
        "tokenizer_not_json": (lambda e: (e / "foundation" / "tokenizer.json").write_text("{not json"), "foundation/tokenizer.json",
                               "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        "tokenizer_wrong": (lambda e: (e / "foundation" / "tokenizer.json").write_text('{"version": "1.0"}'), "foundation/tokenizer.json",
                            "not a tokenizer the tokenizers library can load ("),
        "yaml_broken": (lambda e: (e / "omnicore.yaml").write_text("model: [unclosed\n"), "omnicore.yaml:2",
                        "not valid YAML (while parsing a flow sequence, expected ',' or ']', but got '<stream end>')"),
        "yaml_empty": (lambda e: (e / "omnicore.yaml").write_text("model: 3\n"), "omnicore.yaml", "no model.foundation section"),
    }  # fmt: skip
    cfg = Config.model_validate(json.loads(_config_file(text_jsonl, tmp_path / "cfg").read_text()))
    for name, (damage, file, what) in cases.items():
        bad = _damaged(export, tmp_path, name, damage)
        for load, prefix in [(model_config_from_export, ""), (lambda e: apply_export(cfg, e), "model.init_from: ")]:
            with pytest.raises(CheckpointError) as info:
                load(bad)
            msg = str(info.value)
            assert msg.startswith(f"{prefix}{bad / file}: {what}") and msg.endswith(f"; {EXPORT_DAMAGED}"), (name, msg)
            assert "\n" not in msg
    assert model_config_from_export(export).foundation.options["checkpoint"] == str((export / "foundation").resolve())  # intact: loads


# ---- a data worker killed with SIGKILL ----------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_data_worker_raises_where_data_is_read_and_keeps_the_position(tmp_path):
    from omnicore.config import DataConfig, SourceConfig
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.loader import DataWorkerError
    from omnicore.data.pipeline import DataPipeline
    from omnicore.data.sources import open_source
    from omnicore.model.build import prepare_tokenizer
    from omnicore.model.foundation import byte_tokenizer

    rows = [{"messages": [{"role": "user", "content": "q" * (1 + i % 17)}, {"role": "assistant", "content": f"a{i}"}]} for i in range(4000)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    chat = ChatProcessor(prepare_tokenizer(byte_tokenizer(), [], []), {}, {}, max_tokens=64)
    data = DataConfig(sources=[SourceConfig(path="a.jsonl")], num_workers=2, max_tokens=64, packing_window=32, shuffle_buffer=50)
    pipe = DataPipeline([open_source(s, tmp_path) for s in data.source_list()], chat, data, 7, data_rank=0, data_size=1, grad_accum=1)
    try:
        pipe.step()
        os.kill(pipe._it._workers[1].pid, signal.SIGKILL)
        time.sleep(1.0)  # the training process's own work: torch's SIGCHLD handler used to raise in here
        for _ in range(2000):
            before = json.dumps(pipe.state_dict(), sort_keys=True)
            try:
                pipe.step()
            except DataWorkerError as exc:
                assert re.fullmatch(r"a data worker died: DataLoader worker \(pid\(s\) \d+\) exited unexpectedly; data\.num_workers 2 "
                                    r"\(too little memory for the workers\? try fewer, or 0 to read in the training process and see the error\)",
                                    str(exc)), str(exc)  # fmt: skip
                assert json.dumps(pipe.state_dict(), sort_keys=True) == before  # the position of the last whole step
                break
        else:
            pytest.fail("the dead worker was never reported")
    finally:
        pipe.close()


def test_a_dead_data_worker_saves_the_steps_trained_then_stops(monkeypatch, tmp_path):
    """The training loop's side: the DataWorkerError of a step is agreed by every rank (one all-reduce),
    the data position is put back to the last whole step and those steps are saved (unless just saved)
    before the error names the checkpoint and the command that continues."""
    from types import SimpleNamespace

    from omnicore.data.loader import DataWorkerError
    from omnicore.parallel.state import ParallelState
    from omnicore.train import loop

    calls = []

    class Data:
        def step(self):
            raise DataWorkerError("a data worker died: DataLoader worker (pid(s) 7) exited unexpectedly")

        def rewind(self):
            calls.append("rewind")

    monkeypatch.setattr(loop, "save", lambda run, done: calls.append(("save", done)))
    cfg = Config.model_validate({"data": {"train": "t.jsonl"}, "run": {"output_dir": str(tmp_path)}})
    run = SimpleNamespace(data=Data(), state=ParallelState(0, 1, 0, torch.device("cpu")), history=[{"step": 3}], start=0, saved_at=2,
                          cfg=cfg, ckpt_root=tmp_path / "checkpoints")  # fmt: skip
    with pytest.raises(DataWorkerError) as info:
        loop._step_batches(run)
    assert calls == ["rewind", ("save", 3)]
    assert str(info.value) == (
        "a data worker died: DataLoader worker (pid(s) 7) exited unexpectedly; the 3 steps trained are saved in "
        f"{tmp_path / 'checkpoints' / 'step-00000003'}; continue with: omnicore train CONFIG --run.output_dir {tmp_path} --resume"
    )


# ---- a huge line -----------------------------------------------------------------------------------------


def test_a_huge_line_is_refused_before_it_is_read_whole_or_tokenized(tmp_path):
    from omnicore.config import SourceConfig
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.jsonl import LINE_SLACK, Message, Part, Sample, SampleError, line_byte_limit
    from omnicore.data.sources import open_source
    from omnicore.model.build import prepare_tokenizer
    from omnicore.model.foundation import byte_tokenizer

    small = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]})
    huge = json.dumps({"messages": [{"role": "user", "content": "word " * (2 * 2**20)}, {"role": "assistant", "content": "ok"}]})
    path = tmp_path / "huge.jsonl"
    path.write_text(f"{small}\n{huge}\n{small}\n")
    assert len(huge) > 10 * 2**20 and line_byte_limit(64) == 64 * 64 + LINE_SLACK
    src = open_source(SourceConfig(path="huge.jsonl"), tmp_path, max_tokens=64)
    tracemalloc.start()
    try:
        got = []
        for rec in src.records(0, 0, 1, 0, False):
            try:
                got.append(src.to_sample(rec).messages[0].parts[0].value)
            except SampleError as exc:
                got.append(str(exc))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [
        "hi",
        f"{path}:2: line longer than {64 * 64 + 2**20} bytes (1.0 MiB), the most a sample of data.max_tokens=64 tokens can take "
        "(64 bytes per token and 1 MiB for the rest); refused before it is parsed or tokenized: split it, or raise data.max_tokens "
        "(data.on_error: skip drops it)",
        "hi",
    ]
    # a few copies of the 1 MiB bound in reading buffers, not the line (reading it whole alone takes 10 MiB)
    assert peak < len(huge) / 2, f"{peak / 2**20:.1f} MiB traced: the 10 MiB line was read whole"

    # under the byte bound (a table's cell, a large max_tokens): the text is counted in pieces, never tokenized whole
    chat = ChatProcessor(prepare_tokenizer(byte_tokenizer(), [], []), {}, {}, max_tokens=64)
    text = "word " * (2**20 // 5 * 2)  # 2 MiB, a token per byte
    sample = Sample([Message("user", [Part("text", text)]), Message("assistant", [Part("text", "ok")])], "t.jsonl", 3)
    tracemalloc.start()
    try:
        with pytest.raises(SampleError) as info:
            chat.encode(sample)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    piece = text.rfind(" ", 2**15, 2**16)  # where the first piece is cut, at a space
    assert str(info.value) == (
        f"t.jsonl:3: sample has more than data.max_tokens=64 tokens: {piece} in the first {piece} of its {len(text) + 2} characters "
        "of text (counted in pieces, never tokenized whole); raise data.max_tokens or shorten the sample (data.on_error: skip drops it)"
    )
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB traced: the 2 MiB text was tokenized whole"


# ---- a logger that raises SystemExit or KeyboardInterrupt ---------------------------------------------


def test_a_logger_raising_system_exit_or_keyboard_interrupt_is_a_stop_request():
    from omnicore.train.loggers import LoggerError, Loggers, LoggerWarning, _Slot, start_loggers

    class Exiting:
        def __init__(self, exc):
            self.exc = exc

        def start(self, info):
            raise self.exc

        def log_metrics(self, step, row, split):
            raise self.exc

    loggers = Loggers([_Slot("run.loggers[0] (a)", Exiting(KeyboardInterrupt())), _Slot("run.loggers[1] (b)", Exiting(SystemExit(3)))])
    with pytest.warns(LoggerWarning) as warned:
        loggers.log_metrics(5, {"loss": 1.0})
        loggers.log_metrics(6, {"loss": 1.0})  # skipped from now on: no second warning
    assert [str(w.message) for w in warned] == [
        "run.loggers[0] (a): log_metrics raised KeyboardInterrupt: the run stops after this step, once it is saved; this logger is "
        "skipped from now on",
        "run.loggers[1] (b): log_metrics raised SystemExit(3): the run stops after this step, once it is saved; this logger is "
        "skipped from now on",
    ]
    assert (loggers.stop_request.describe(), loggers.stop_request.exit_code) == (
        "run.loggers[0] (a): log_metrics raised KeyboardInterrupt",
        130,
    )
    assert loggers.failed == ["run.loggers[0] (a)", "run.loggers[1] (b)"]

    class Registry:  # before step 1, a logger's sys.exit in start is an error naming it
        def build(self, kind, name, options):
            return Exiting(SystemExit("no server"))

    cfg = Config.model_validate({"data": {"train": "t.jsonl"}, "run": {"loggers": ["x"]}})
    with pytest.raises(LoggerError, match=r"^run\.loggers\[0\] \(x\): start failed: SystemExit: no server$"):
        start_loggers(cfg, Registry(), is_main=True)


@pytest.mark.slow
def test_a_logger_calling_sys_exit_stops_the_run_like_a_signal_and_saves(text_jsonl, tmp_path, monkeypatch, capsys):
    """The built-in jsonl logger made to call ``sys.exit(3)`` when it logs step 2 of 4: the run
    saves step 2 and exits with status 3 naming the logger (it used to exit 3 silently, losing the
    steps since the last save)."""
    from omnicore.checkpoint.dcp import verify_checkpoint
    from omnicore.train.loggers import JsonlLogger

    real = JsonlLogger.log_metrics

    def log_metrics(self, step, row, split):
        real(self, step, row, split)
        if step == 2:
            raise SystemExit(3)

    monkeypatch.setattr(JsonlLogger, "log_metrics", log_metrics)
    cfg = _config_file(text_jsonl, tmp_path, max_steps=4)
    assert cli.main(["train", str(cfg)]) == 3
    out = tmp_path / "run"
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"stopped after step 2 of 4: run.loggers[0] (jsonl): log_metrics raised SystemExit(3); saved {out / 'checkpoints' / 'step-00000002'}; "
        f"continue with: omnicore train {cfg} --resume"
    )
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    verify_checkpoint(out / "checkpoints" / "step-00000002")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
