"""Console logging (:mod:`omnicore.logs`): the rank-aware format, ranks other than 0 quiet below
WARNING, ``--log-level`` / ``OMNICORE_LOG_LEVEL``, warnings routed through logging with the known
noisy ones filtered, timed start-up phases, and a missing ``data.eval`` found before the build."""

from __future__ import annotations

import json
import logging
import re
import time
import warnings
from pathlib import Path

import pytest
import yaml
from conftest import tiny_config_dict

from omnicore.cli import main
from omnicore.logs import QUIET_WARNINGS, Phase, reset_logging, resolve_level, setup_logging

LINE = re.compile(r"^(\[rank\d+\] )?\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR) [\w.]+: ")


@pytest.fixture
def clean_logging():
    """Undo :func:`setup_logging` after the test (``main`` undoes its own on return)."""
    root, filters, show = logging.getLogger(), list(warnings.filters), warnings.showwarning
    handlers, level = list(root.handlers), root.level
    yield
    reset_logging()
    assert root.handlers == handlers and root.level == level
    assert warnings.filters == filters and warnings.showwarning is show


def _lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_one_process_format_has_no_rank(clean_logging, capsys):
    setup_logging("info", rank=0, world_size=1)
    logging.getLogger("omnicore.train.loop").info("model: %d M parameters", 3)
    logging.getLogger("omnicore.train.loop").debug("not shown at info")
    (line,) = _lines(capsys)
    assert re.fullmatch(r"\d\d:\d\d:\d\d INFO omnicore\.train\.loop: model: 3 M parameters", line), line


def test_plugins_log_like_the_core_and_other_libraries_only_warn(clean_logging, capsys):
    setup_logging("info", rank=0, world_size=1)
    logging.getLogger("omnicore_image_movqgan.fit").info("fitting")  # a plugin's module logger
    logging.getLogger("urllib3.connectionpool").info("connection noise")
    logging.getLogger("urllib3.connectionpool").warning("retrying")
    assert [x.split(" ", 1)[1] for x in _lines(capsys)] == [
        "INFO omnicore_image_movqgan.fit: fitting",
        "WARNING urllib3.connectionpool: retrying",
    ]


def test_other_ranks_show_warnings_with_their_rank_and_no_info(clean_logging, capsys):
    setup_logging("info", rank=1, world_size=2)
    log = logging.getLogger("omnicore.train.loop")
    log.info("rank 0 says this")
    log.warning("something to look at")
    (line,) = _lines(capsys)
    assert re.fullmatch(r"\[rank1\] \d\d:\d\d:\d\d WARNING omnicore\.train\.loop: something to look at", line), line
    setup_logging("debug", rank=1, world_size=2)  # debugging: every rank's lines
    log.info("now every rank")
    (line,) = _lines(capsys)
    assert line.startswith("[rank1] ") and line.endswith(" INFO omnicore.train.loop: now every rank")
    setup_logging("info", rank=0, world_size=2)
    log.info("rank 0")
    assert _lines(capsys)[0].startswith("[rank0] ")


def test_levels_from_flag_then_environment(monkeypatch):
    monkeypatch.delenv("OMNICORE_LOG_LEVEL", raising=False)
    assert resolve_level(None) == logging.INFO
    monkeypatch.setenv("OMNICORE_LOG_LEVEL", "Warning")
    assert resolve_level(None) == logging.WARNING
    assert resolve_level("debug") == logging.DEBUG  # the flag wins
    monkeypatch.setenv("OMNICORE_LOG_LEVEL", "loud")
    with pytest.raises(ValueError, match=r"^OMNICORE_LOG_LEVEL=loud: not a log level; use one of debug, info, warning, error$"):
        resolve_level(None)


def test_cli_log_level_on_every_subcommand_and_a_bad_environment_value(clean_logging, monkeypatch, capsys):
    from omnicore.cli import EXAMPLES, build_parser

    parser = build_parser()
    positional = {"plugins": [], "plot": ["runs/x"], "plan": ["c.yaml", "--world-size", "2"], "generate": ["c.yaml", "--prompt", "p"]}
    positional["fit-tokenizer"] = ["c.yaml", "--vocab-size", "300", "--out", "tok"]
    for name in EXAMPLES:
        args, _ = parser.parse_known_args([name, *positional.get(name, ["c.yaml"]), "--log-level", "warning"])
        assert args.log_level == "warning", name
    monkeypatch.setenv("OMNICORE_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit) as exc:
        main(["plugins", "--no-load"])
    assert exc.value.code == 2
    assert "error: OMNICORE_LOG_LEVEL=loud: not a log level" in capsys.readouterr().err


def test_warnings_become_one_log_line_and_known_noise_is_filtered(clean_logging, capsys):
    setup_logging("info", rank=0, world_size=1)
    warnings.warn("a plugin said\n  something", UserWarning, stacklevel=1)
    noisy = "`is_gradient_checkpointing` is deprecated and will be removed in v6. Use `is_activation_checkpointing` instead."
    assert any(re.match(pattern, noisy) for pattern, _ in QUIET_WARNINGS)  # what transformers 5 says when peft applies LoRA
    warnings.warn(noisy + " (from a library)", FutureWarning, stacklevel=1)
    (line,) = _lines(capsys)
    assert re.fullmatch(r"\d\d:\d\d:\d\d WARNING py\.warnings: UserWarning: a plugin said something \(test_logs\.py:\d+\)", line), line
    setup_logging("debug", rank=0, world_size=1)  # debugging shows the filtered ones too
    warnings.warn(noisy + " (again)", FutureWarning, stacklevel=1)
    (line,) = _lines(capsys)
    assert f"FutureWarning: {noisy} (again)" in line


def test_our_logger_warning_stays_visible(clean_logging, capsys):
    from omnicore.train.loggers import LoggerWarning

    setup_logging("warning", rank=0, world_size=1)
    warnings.warn("jsonl: log raised OSError; this logger is skipped", LoggerWarning, stacklevel=1)
    (line,) = _lines(capsys)
    assert "WARNING py.warnings: LoggerWarning: jsonl: log raised OSError; this logger is skipped" in line


def test_phase_logs_its_duration_and_says_when_it_is_slow(caplog):
    caplog.set_level(logging.INFO, logger="omnicore")
    log = logging.getLogger("omnicore.test")
    with Phase(log, "building the model", first_s=0.01, every_s=60.0) as ph:
        deadline = time.monotonic() + 10.0  # wait for the watcher's line (no timing assert: only that it comes)
        while not any("still running" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.01)
        ph.detail = "3.00 M parameters"
    messages = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"building the model: still running, \d+ s so far", messages[0]), messages
    assert messages[-1] == f"building the model: 3.00 M parameters ({ph.seconds:.1f} s)"
    caplog.clear()
    with pytest.raises(KeyError), Phase(log, "failing"):
        raise KeyError("x")
    assert caplog.records == []  # no "done" line for a phase that raised


def _text_run(tmp_path: Path, eval_every: int = 0, **train) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    rows = [{"messages": [{"role": "user", "content": f"count to {i}"}, {"role": "assistant", "content": "1 2 3"[: 1 + i % 5]}]}
            for i in range(16)]  # fmt: skip
    (tmp_path / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = tiny_config_dict("text.jsonl", decoders=False, output_dir=str(tmp_path / "run"), **train)
    d["model"]["encoders"] = {}
    if eval_every:
        d["eval"] = {"every": eval_every}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


PHASES = [
    "reading the config",
    "importing torch and starting the process group",
    "loading the plugins",
    "building the model",
    "opening the data",
    "moving the model to cpu and applying the parallel strategies",
    "starting the loggers",
    "step 1: reading the first micro-batches",
]


@pytest.mark.slow
def test_every_startup_phase_logs_one_timed_line(clean_logging, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OMNICORE_LOG_LEVEL", raising=False)
    assert main(["train", str(_text_run(tmp_path, max_steps=1)), "--run.device", "cpu"]) == 0
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert all(LINE.match(x) for x in lines), lines  # every status line in the one format
    timed = [x.split(": ", 1)[1] for x in lines if re.search(r"\(\d+\.\d s\)$", x)]
    starts = [next((i for i, t in enumerate(timed) if t.startswith(p)), None) for p in PHASES]
    assert None not in starts and starts == sorted(starts), (starts, timed)
    assert out.out.startswith("done: step 1, loss ")  # the command's result stays on stdout
    assert main(["train", str(_text_run(tmp_path / "quiet", max_steps=1)), "--run.device", "cpu", "--log-level", "warning"]) == 0
    assert capsys.readouterr().err == ""


def test_a_missing_eval_file_is_found_before_the_build(clean_logging, tmp_path, capsys, caplog):
    from omnicore.config import ConfigError, load_config
    from omnicore.train.loop import check_eval_file

    path = _text_run(tmp_path, eval_every=2)
    assert main(["train", str(path), "--data.eval", "held-out.jsonl"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert not any("building the model" in x for x in lines), lines  # stopped before the (slow) build
    assert lines[-1] == (
        f"error: {path}: data.eval: 'held-out.jsonl' (resolved to {tmp_path / 'held-out.jsonl'}) is not a file; eval.every "
        "reads it for validation: fix the path (relative to the config file's folder) or set eval.every: 0"
    )
    cfg = load_config(path, ["--data.eval", "held-out.jsonl", "--eval.every", "0"])
    caplog.set_level(logging.WARNING, logger="omnicore")
    caplog.clear()
    check_eval_file(cfg)  # not read by training: a warning, for `omnicore eval` later
    assert [r.getMessage() for r in caplog.records] == [
        f"data.eval: 'held-out.jsonl' (resolved to {tmp_path / 'held-out.jsonl'}) is not a file; training does not read it, "
        "but `omnicore eval` will"
    ]
    (tmp_path / "held-out.jsonl").write_text("")
    check_eval_file(load_config(path, ["--data.eval", "held-out.jsonl"]))  # present: nothing to say
    with pytest.raises(ConfigError):
        check_eval_file(load_config(path, ["--data.eval", "nope.jsonl"]))
