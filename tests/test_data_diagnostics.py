"""Data diagnostics: a bad sample skipped under ``data.on_error: skip`` is counted when the stream is
consumed past it, once (not for every epoch the packing window reads ahead: one bad line in a 20-line
file reported ``skipped: 52``), and the first ones are named ``FILE:LINE: why`` in the log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import tiny_config_dict

from omnicore.config import Config, DataConfig, SourceConfig
from omnicore.data.chat import ChatProcessor
from omnicore.data.pipeline import NAMED_SKIPS, DataPipeline
from omnicore.data.sources import open_source


@pytest.fixture(scope="module")
def chat():
    from omnicore.model.build import prepare_tokenizer
    from omnicore.model.foundation import byte_tokenizer

    return ChatProcessor(prepare_tokenizer(byte_tokenizer(), [], []), {}, {}, max_tokens=64)


def _write(path: Path, n: int, bad: set[int]) -> Path:
    """``n`` chat lines of one length (so first-fit rows follow the file's order); the lines
    ``bad`` (1-based) are not JSON."""
    with path.open("w") as fh:
        for line in range(1, n + 1):
            if line in bad:
                fh.write('{"messages": [oops\n')
            else:
                fh.write(
                    json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"{line:02d}"}]}) + "\n"
                )
    return path


def _pipeline(path: Path, chat, *, rank: int = 0, groups: int = 1, **data_kw) -> DataPipeline:
    kw = {"num_workers": 0, "max_tokens": 64, "shuffle": False, "on_error": "skip", **data_kw}
    data = DataConfig(sources=[SourceConfig(path=str(path))], **kw)
    return DataPipeline([open_source(s, path.parent) for s in data.source_list()], chat, data, 0, data_rank=rank, data_size=groups,
                        grad_accum=1)  # fmt: skip


def test_one_bad_line_in_twenty_is_counted_as_the_stream_passes_it(tmp_path, chat):
    """The issue's input: line 7 of 20 bad, the default packing window (1024 positions: 51 epochs of
    the file read ahead). The count after each step is how often the consumed samples passed line
    7, i.e. how many of them are line 8 (rows hold whole samples in file order here): 0, then 1,
    then 2 in the second epoch; never 51."""
    f = _write(tmp_path / "train.jsonl", 20, bad={7})
    pipe = _pipeline(f, chat)
    consumed: list[str] = []
    got, want = [], []
    for _ in range(16):  # 2 samples a row: 32 of the file's 19 usable samples a pass
        consumed += [w for mb in pipe.step() for w in mb.wheres]
        got.append(pipe.counts()[1][0])
        want.append(sum(w == f"{f}:8" for w in consumed))
    assert got == want
    assert got[0] == 0 and 1 in got and got[-1] == 2, got
    assert pipe.counts()[0][0] == len(consumed)


@pytest.mark.parametrize("method", ["first_fit", "ffd"])
def test_each_bad_sample_of_a_window_is_counted_once_when_the_window_is_used_up(tmp_path, chat, method):
    """Whatever the packer's row order: once a window's rows are all taken, its bad samples (here 3
    of 32) were each counted once; a resume in the middle of the window counts none twice."""
    f = _write(tmp_path / "train.jsonl", 64, bad={2, 17, 32})
    pipe = _pipeline(f, chat, packing=method, packing_window=32)
    packer = pipe.packers[0]
    saved = None
    while not (packer.filled and packer.state.window_start == 0 and packer.next_row == len(packer.rows)):
        pipe.step()
        if saved is None:
            saved = json.loads(json.dumps(pipe.state_dict()))  # as a checkpoint keeps it, after step 1
            at_save = pipe.counts()
    assert pipe.counts()[1] == [3]
    again = _pipeline(f, chat, packing=method, packing_window=32)
    again.load_state_dict(saved)
    assert again.counts() == at_save
    while again.packers[0].next_row != len(packer.rows) or not again.packers[0].filled:
        again.step()
    assert again.counts() == pipe.counts()


def test_two_ranks_count_the_bad_line_once(tmp_path, chat):
    """Two data groups: the bad line lives in one shard; the run total (both ranks' counts) is 1 once
    every shard's first epoch is consumed."""
    f = _write(tmp_path / "train.jsonl", 20, bad={7})
    pipes = [_pipeline(f, chat, rank=r, groups=2, packing_window=64) for r in range(2)]
    for pipe in pipes:
        for _ in range(4):  # 4 rows of 2 samples: 8 of the shard's 9 usable samples, past line 7 or 8
            pipe.step()
    assert sum(p.counts()[1][0] for p in pipes) == 1


def test_the_first_bad_samples_are_named_once_then_counted(tmp_path, chat, caplog):
    """Seven bad lines: the first five are named ``FILE:LINE: why`` (in stream order, each once though
    two epochs pass them), then one line says later ones are counted only."""
    bad = {2, 4, 6, 8, 10, 12, 14}
    f = _write(tmp_path / "train.jsonl", 20, bad=bad)
    pipe = _pipeline(f, chat, packing_window=64)
    caplog.set_level(logging.WARNING, logger="omnicore")
    lines = [int(w.rsplit(":", 1)[1]) for _ in range(16) for mb in pipe.step() for w in mb.wheres]  # 32 usable: 2.5 passes of 13
    usable = [n for n in range(1, 21) if n not in bad]
    passed = sum(len([b for b in bad if usable[usable.index(n) - 1] < b < n] if n != usable[0] else []) for n in lines)
    assert pipe.counts()[1] == [passed] and passed == 19  # 7 + 7 + lines 2..10 of the third pass
    lines = [r.getMessage() for r in caplog.records]
    named = [
        f"data: skipped a bad sample (data.on_error: skip): {f}:{n}: not valid JSON (Expecting value at column 15)"
        for n in (2, 4, 6, 8, 10)
    ]
    assert lines == [
        *named,
        f"data: {NAMED_SKIPS} bad samples named; later ones are counted, not named (skipped/<source> in metrics.jsonl)",
    ]


@pytest.mark.slow
def test_a_run_on_twenty_lines_with_one_bad_reports_skipped_1(tmp_path, caplog):
    """The issue's run: ``train`` on the 20-line file reports ``skipped/train: 1`` in its metrics rows
    (and ``metrics.jsonl``), names the line once and ends with the count."""
    from omnicore.train.loop import train

    f = _write(tmp_path / "train.jsonl", 20, bad={7})
    d = tiny_config_dict(str(f), decoders=False, output_dir=str(tmp_path / "run"), max_steps=3)
    d["model"]["encoders"] = {}
    d["data"].update(on_error="skip", max_tokens=128, num_workers=0, shuffle=False)
    caplog.set_level(logging.WARNING, logger="omnicore")
    history = train(Config.model_validate(d))
    # rows in file order: line 7 is passed with the 7th usable sample (line 8), within the first pass
    want = [int(6 < r["samples/train"] <= 19 + 6) for r in history]
    assert [r["skipped/train"] for r in history] == want and want[-1] == 1
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped/train"] for r in rows] == want
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"data: skipped a bad sample (data.on_error: skip): {f}:7: not valid JSON (Expecting value at column 15)",
        "data: bad samples skipped once in all (train 1; data.on_error: skip; a bad line counts again at each pass over its "
        "source); the first are named above",
    ]


# ---- data.eval: several files, and validation's task accuracy ---------------------------------------


def _qa(path: Path, answers: list[str], bad: set[int] = frozenset()) -> Path:
    """Held-out lines asking for each answer of ``answers``; lines ``bad`` (1-based) are not JSON."""
    lines = ['{"messages": [oops' if i + 1 in bad else json.dumps({"messages": [
        {"role": "user", "content": f"Say {a}."}, {"role": "assistant", "content": a}]}) for i, a in enumerate(answers)]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(x + "\n" for x in lines))
    return path


def _eval_cfg(tmp_path: Path, eval_spec, *, every: int = 0, task_samples: int = 0, max_new_tokens: int = 8, **data_kw) -> Config:
    d = tiny_config_dict(str(tmp_path / "train.jsonl"), decoders=False, output_dir=str(tmp_path / "run"))
    d["model"]["encoders"] = {}
    d["data"].update(eval=eval_spec, **data_kw)
    d["eval"] = {"every": every, "task_samples": task_samples}
    d["generate"] = {"max_new_tokens": max_new_tokens, "temperature": 0}
    cfg = Config.model_validate(d)
    cfg.source = str(tmp_path / "cfg.yaml")  # relative entries are relative to the config's folder
    return cfg


def test_data_eval_takes_a_list_of_files_folders_and_globs(tmp_path):
    """``data.eval`` as ``data.train``: a glob, a folder or a file, or a list of them, read in the order
    given (a glob's files sorted, a file named twice once); an entry that names nothing is refused
    naming it, as given and as resolved."""
    from omnicore.config import ConfigError
    from omnicore.eval.heldout import eval_files
    from omnicore.train.loop import check_eval_file

    b, a = _qa(tmp_path / "held" / "b.jsonl", ["1"]), _qa(tmp_path / "held" / "a.jsonl", ["2"])
    c = _qa(tmp_path / "more" / "c.jsonl", ["3"])
    assert eval_files(_eval_cfg(tmp_path, "held/*.jsonl")) == [a, b]
    assert eval_files(_eval_cfg(tmp_path, ["more/c.jsonl", "held", str(a)])) == [c, a, b]
    check_eval_file(_eval_cfg(tmp_path, ["held/*.jsonl", "more/c.jsonl"], every=1))
    with pytest.raises(ConfigError) as info:
        check_eval_file(_eval_cfg(tmp_path, ["held/*.jsonl", "nope/*.jsonl"], every=1))
    assert str(info.value) == (
        f"{tmp_path / 'cfg.yaml'}: data.eval: 'nope/*.jsonl' (resolved to {tmp_path / 'nope/*.jsonl'}) matches no file; eval.every "
        "reads it for validation: fix the path (relative to the config file's folder) or set eval.every: 0"
    )
    for bad in ([], [""]):
        with pytest.raises(ValueError, match=r"data\.eval: give a file, folder or glob, or a list of them \(no empty entry\)"):
            _eval_cfg(tmp_path, bad)


@pytest.fixture
def tiny_text(tmp_path):
    """A tiny text-only model (byte tokenizer) and its chat processor."""
    from omnicore.model.build import build_omni_model

    cfg = _eval_cfg(tmp_path, "x.jsonl")
    model, tokenizer = build_omni_model(cfg)
    return model, tokenizer, ChatProcessor.for_model(tokenizer, model, cfg.data)


def test_validation_reads_every_file_warns_of_long_answers_and_names_skips(tmp_path, tiny_text, caplog):
    """Validation on ``data.eval: [glob, file]``: its held-out loss equals that of one file holding the
    same lines (the reference: ``heldout_loss`` of the concatenation), the bad line of one file is
    skipped and named (``data.on_error: skip``), and, before step 1, answers longer than
    ``generate.max_new_tokens`` are warned about as ``omnicore eval`` warns (byte tokenizer: one token
    per byte)."""
    import torch

    from omnicore.eval.heldout import heldout_loss
    from omnicore.eval.validate import Validator
    from omnicore.parallel.state import ParallelState

    model, tokenizer, processor = tiny_text
    answers = [["7", "12345", "42"], ["123", "9"], ["31415926", "0"]]
    files = [_qa(tmp_path / "held" / "p1.jsonl", answers[0]), _qa(tmp_path / "held" / "p2.jsonl", answers[1], bad={2}),
             _qa(tmp_path / "last.jsonl", answers[2])]  # fmt: skip
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(f.read_text() for f in files).replace('{"messages": [oops\n', ""))
    cfg = _eval_cfg(tmp_path, ["held/*.jsonl", "last.jsonl"], every=1, task_samples=4, max_new_tokens=2, on_error="skip")
    state = ParallelState(0, 1, 0, torch.device("cpu"))
    caplog.set_level(logging.WARNING, logger="omnicore")
    rows: list = []
    validator = Validator(cfg, tokenizer=tokenizer, processor=processor, state=state, data_rank=0, data_size=1, replicas=1,
                          autocast=__import__("contextlib").nullcontext, log_row=lambda *a: rows.append(a), log=lambda *a: None)  # fmt: skip
    first4 = ["7", "12345", "42", "123"]  # the task accuracy's first 4 answers (line 2 of p2 skipped)
    assert [r.getMessage() for r in caplog.records] == [
        f"eval.task_samples: default: {sum(len(x) > 2 for x in first4)} of 4 expected answers need more than "
        f"generate.max_new_tokens=2 tokens (up to {max(map(len, first4))}); they are cut short and score 0: raise "
        f"generate.max_new_tokens to at least {max(map(len, first4))} (--generate.max_new_tokens {max(map(len, first4))}, "
        "or in the config's generate section)"
    ]
    caplog.clear()
    row = validator.run(model, 1)
    ref = heldout_loss(model, processor, whole, cfg.data.max_tokens)
    assert row["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-6) and row["val_samples"] == ref["val_samples"] == 6
    assert row["val_skipped"] == 1 and row["val_acc_samples"] == 4
    named = f"validation: skipped a bad held-out sample (data.on_error: skip): {files[1]}:2: not valid JSON (Expecting value at column 15)"
    assert [r.getMessage() for r in caplog.records] == [named]
    caplog.clear()
    validator.run(model, 2)
    assert caplog.records == []  # named once per run
