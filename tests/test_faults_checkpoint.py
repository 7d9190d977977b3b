"""Faults in signals and checkpoints (issue 27, item 10): two SIGTERMs close together, on one process
and in the Slurm pattern under torchrun, leave a verified checkpoint; a bad ``latest`` falls back to
the newest checkpoint that verifies; checkpoints and exports without a checksum manifest are refused
unless the user asks; a resume on rewritten data files is refused, naming the file.

Trainings run in this process on a tiny text-only model (about 1 s each); one test starts torchrun.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TINY_LM

from omnicore.checkpoint.dcp import latest_checkpoint, verify_checkpoint
from omnicore.config import Config


def _rows(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines() if x.strip()]
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module")
def text_jsonl(tmp_path_factory) -> Path:
    rows = []
    for i in range(48):
        q = "Count " + " ".join(str((i * 7 + k) % 10) for k in range(2 + i % 9))
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 5)}]})
    path = tmp_path_factory.mktemp("faults") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg_dict(data: Path, out: Path, **train) -> dict:
    t = {"max_steps": 6, "lr": 3e-3, "warmup_steps": 1, "progress": False, "export": False}
    t.update(train)
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM), "tokenizer": "byte"}}},
        "data": {"train": str(data), "max_tokens": 512, "num_workers": 0},
        "train": t,
    }


def _cfg(data: Path, out: Path, **train) -> Config:
    return Config.model_validate(_cfg_dict(data, out, **train))


# ---- two SIGTERMs close together ---------------------------------------------------------------------


class _Said(logging.Handler):
    """Collects the messages of ``omnicore.train.signals`` and flags the first acknowledgement."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.first = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if record.getMessage().startswith("received SIGTERM: finishing this step"):
            self.first.set()


def test_two_sigterms_20ms_apart_leave_a_verified_checkpoint(text_jsonl, tmp_path, monkeypatch):
    """The real handler and real signals in this process; only the handler's "exit at once" (a
    re-sent default SIGTERM, which would end pytest) is recorded instead of done."""
    from omnicore.train import signals
    from omnicore.train.loop import train
    from omnicore.train.signals import Interrupted

    out = tmp_path / "run"
    real_kill, kills = os.kill, []
    monkeypatch.setattr(signals, "os", SimpleNamespace(getpid=os.getpid, kill=lambda pid, sig: kills.append(sig)))
    said = _Said()
    logging.getLogger("omnicore.train.signals").addHandler(said)
    done = threading.Event()

    def send() -> None:  # once 2 steps are logged: SIGTERM, then another 20 ms later
        while len(_rows(out)) < 2 and not done.is_set():
            time.sleep(0.005)
        if done.is_set():
            return
        t0 = time.monotonic()
        real_kill(os.getpid(), signal.SIGTERM)
        said.first.wait(10)  # handled before the second is sent: two signals, not one merged pending one
        time.sleep(max(0.0, 0.02 - (time.monotonic() - t0)))
        if not done.is_set():
            real_kill(os.getpid(), signal.SIGTERM)

    spare = signal.signal(signal.SIGTERM, lambda s, f: None)  # a late signal after the run must not end pytest
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        with pytest.raises(Interrupted) as info:
            train(_cfg(text_jsonl, out, max_steps=100000))
    finally:
        done.set()
        sender.join(10)
        signal.signal(signal.SIGTERM, spare)
        logging.getLogger("omnicore.train.signals").removeHandler(said)
    assert info.value.signum == signal.SIGTERM and info.value.exit_code == 143
    assert kills == []  # the second signal did not end the process
    assert any(line.startswith("received SIGTERM again ") and "still finishing the step and saving" in line for line in said.lines)
    folder = latest_checkpoint(out / "checkpoints")
    verify_checkpoint(folder)
    assert (folder / "manifest.json").is_file()
    assert json.loads((folder / "trainer_state.json").read_text())["step"] == _rows(out)[-1]["step"] >= 2


@pytest.mark.cli
def test_a_signal_after_the_grace_period_ends_the_process_at_once(tmp_path):
    """A second SIGTERM within the grace period is ignored; one after it ends the process by the
    signal itself (a person who means "now")."""
    script = (
        "import sys, time\n"
        "from omnicore.train.signals import GracefulStop\n"
        "with GracefulStop(grace_s=0.3) as stop:\n"
        "    print('ready', flush=True)\n"
        "    while not stop.requested: time.sleep(0.005)\n"
        "    print('stopping', flush=True)\n"
        "    time.sleep(30)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    p.send_signal(signal.SIGTERM)
    assert p.stdout.readline() == "stopping\n"
    p.send_signal(signal.SIGTERM)  # within the grace period: ignored
    time.sleep(0.1)
    assert p.poll() is None
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)  # after it: at once
    assert p.wait(timeout=10) == -signal.SIGTERM


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds torchrun's workers through /proc")
def test_slurm_pattern_under_torchrun_leaves_a_verified_checkpoint(text_jsonl, tmp_path):
    """Slurm signals every task of the step: each rank gets SIGTERM 20 ms before the launcher, which
    forwards its own SIGTERM to the ranks. The ranks finish the step, save and say so."""
    out = tmp_path / "run"
    (tmp_path / "cfg.yaml").write_text(json.dumps(_cfg_dict(text_jsonl, out, max_steps=100000)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "omnicore", "train"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    p = subprocess.Popen([*cmd, str(tmp_path / "cfg.yaml")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while len(_rows(out)) < 2:
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no metrics rows in time"
            time.sleep(0.01)
        workers = [c for c in _children(p.pid) if b"omnicore" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(workers) == 2
        for w in workers:
            os.kill(w, signal.SIGTERM)
        time.sleep(0.02)
        p.send_signal(signal.SIGTERM)
        _, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert "stopped by SIGTERM after step " in stderr, stderr[-3000:]
    folder = latest_checkpoint(out / "checkpoints")
    verify_checkpoint(folder)
    files = json.loads((folder / "manifest.json").read_text())["files"]
    assert {"__0_0.distcp", "__1_0.distcp", "rng-rank0.json", "rng-rank1.json"} <= set(files)
    assert json.loads((folder / "trainer_state.json").read_text())["step"] == _rows(out)[-1]["step"]


# ---- a bad `latest` -----------------------------------------------------------------------------------

ONE = None  # ParallelState of one process, made on first use (torch imported lazily)


def _one():
    global ONE
    if ONE is None:
        import torch

        from omnicore.parallel.state import ParallelState

        ONE = ParallelState(0, 1, 0, torch.device("cpu"))
    return ONE


def _parts(seed: int):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def _save(root: Path, step: int, seed: int):
    from omnicore.checkpoint.dcp import save_checkpoint

    model, opt, sched = _parts(seed)
    save_checkpoint(root, step, model, opt, sched, {}, _one())
    return model


def _weights_of(folder: Path) -> list:
    from omnicore.checkpoint.dcp import load_checkpoint

    model, opt, sched = _parts(99)
    load_checkpoint(folder, model, opt, sched, _one(), verify=False)
    return [p.detach().clone() for p in model.parameters()]


def _same(a, b) -> bool:
    import torch

    return all(torch.equal(x, y.detach()) for x, y in zip(a, b, strict=True))


def _flip(path: Path, offset: int = -20) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


class _Killed(BaseException):
    """The process dies here (nothing after it runs, no clean-up)."""


def test_a_crash_while_resaving_a_step_falls_back_to_the_newest_that_verifies(tmp_path, monkeypatch):
    """Run 1 saved steps 2 and 4; run 2 resumed from step 2 and, saving step 4 again, died between
    moving the old step-4 aside and renaming the new one into place: `latest` names a missing folder."""
    import omnicore.checkpoint.dcp as dcp_mod
    from omnicore.checkpoint.dcp import save_checkpoint
    from omnicore.checkpoint.resume import find_good_checkpoint

    _save(tmp_path, 2, seed=0)
    first = _save(tmp_path, 4, seed=1)
    real = os.replace

    def dies_before_renaming(src, dst):
        if Path(src).name == ".tmp-step-00000004":
            raise _Killed
        return real(src, dst)

    monkeypatch.setattr(dcp_mod.os, "replace", dies_before_renaming)
    model, opt, sched = _parts(2)
    with pytest.raises(_Killed):
        save_checkpoint(tmp_path, 4, model, opt, sched, {}, _one())
    monkeypatch.undo()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".old-step-00000004", ".tmp-step-00000004", "latest", "step-00000002"]
    assert (tmp_path / "latest").read_text() == "step-00000004"
    for name in (".old-step-00000004", ".tmp-step-00000004", "step-00000002"):
        verify_checkpoint(tmp_path / name)  # all three verify

    new, old = tmp_path / ".tmp-step-00000004", tmp_path / ".old-step-00000004"
    folder, message = find_good_checkpoint(tmp_path)
    assert folder == new
    assert message == (
        f"{tmp_path / 'latest'} names step-00000004, which does not exist (a save that replaced it was interrupted?); resuming "
        f"from the newest checkpoint that verifies, {new} (the complete save of step 4, not yet renamed to step-00000004 when "
        "it was interrupted)"
    )
    assert _same(_weights_of(folder), list(model.parameters()))  # run 2's weights, the newest

    _flip(new / "__0_0.distcp")  # the new save damaged too: the step as it was before
    folder, message = find_good_checkpoint(tmp_path)
    assert folder == old and _same(_weights_of(folder), list(first.parameters()))
    assert message.startswith(f"{tmp_path / 'latest'} names step-00000004, which does not exist")
    assert f"skipped 1 corrupt checkpoint(s) (checkpoint {new} is corrupt: {new / '__0_0.distcp'}: sha256 differs" in message
    assert message.endswith(f"resuming from the previous good one, {old} (step-00000004 as it was before an interrupted save replaced it)")

    _save(tmp_path, 5, seed=3)  # the run goes on: the next save removes what the interrupted one left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000002", "step-00000005"]


@pytest.mark.parametrize(
    ("latest", "says"),
    [
        (None, "is missing"),
        (b"", "is empty"),
        (b"\xff\xfe\x00garbage", "is unreadable (UnicodeDecodeError)"),
        (b"garbage\n", "holds 'garbage', not a step-NNNNNNNN folder name"),
        (b"step-00000009\n", "names step-00000009, which does not exist (a save that replaced it was interrupted?)"),
    ],
)
def test_a_bad_latest_takes_the_newest_checkpoint_that_verifies(tmp_path, latest, says):
    from omnicore.checkpoint.resume import find_good_checkpoint

    _save(tmp_path, 2, seed=0)
    newest = _save(tmp_path, 4, seed=1)
    pointer = tmp_path / "latest"
    pointer.unlink()
    if latest is not None:
        pointer.write_bytes(latest)
    folder, message = find_good_checkpoint(tmp_path)
    assert folder == tmp_path / "step-00000004" and _same(_weights_of(folder), list(newest.parameters()))
    assert message == f"{pointer} {says}; resuming from the newest checkpoint that verifies, {folder}"


# ---- what cannot be verified ------------------------------------------------------------------------------


def test_a_checkpoint_without_manifest_is_refused_unless_asked(tmp_path):
    from omnicore.checkpoint.dcp import CheckpointError, load_checkpoint
    from omnicore.checkpoint.resume import find_good_checkpoint

    older = _save(tmp_path, 2, seed=0)
    saved = _save(tmp_path, 4, seed=1)
    folder = tmp_path / "step-00000004"
    (folder / "manifest.json").unlink()  # whatever its tensors hold now, nothing can tell
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder, *_parts(5), _one())
    assert str(err.value) == (
        f"checkpoint {folder} cannot be verified: {folder / 'manifest.json'}: missing, so its files cannot be verified (a save "
        "that did not finish, or written before checksums); use another checkpoint, or load it unchecked with --no-verify "
        "(run.verify: false)"
    )
    good, message = find_good_checkpoint(tmp_path)  # plain --resume: the newest that verifies
    assert good == tmp_path / "step-00000002" and _same(_weights_of(good), list(older.parameters()))
    assert message.startswith(f"skipped 1 corrupt checkpoint(s) (checkpoint {folder} cannot be verified: ")
    assert find_good_checkpoint(tmp_path, verify=False)[0] == folder  # asked: taken unchecked
    assert load_checkpoint(folder, *_parts(5), _one(), verify=False)["step"] == 4
    assert _same(_weights_of(folder), list(saved.parameters()))


def test_no_verify_sets_run_verify_and_is_not_repeated_on_continue():
    from omnicore.cli import _flag_overrides, build_parser

    for argv in (
        ["train", "c.yaml", "--resume", "--no-verify"],
        ["eval", "c.yaml", "--no-verify"],
        ["generate", "c.yaml", "--prompt", "x", "--no-verify"],
    ):
        args, extra = build_parser().parse_known_args(argv)
        assert _flag_overrides(args) == ["--run.verify", "false"] and extra == []
    args, _ = build_parser().parse_known_args(["eval", "c.yaml"])
    assert _flag_overrides(args) == []


def _digest(path: Path) -> dict:
    import hashlib

    data = path.read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.fixture(scope="module")
def exported(text_jsonl, tmp_path_factory) -> Path:
    """A finished 2-step run with its export."""
    from omnicore.train.loop import train

    out = tmp_path_factory.mktemp("exported") / "run"
    train(_cfg(text_jsonl, out, max_steps=2, export=True))
    return out / "export"


def test_an_export_carries_checksums_and_changed_weights_are_refused_unless_asked(text_jsonl, exported, tmp_path):
    import shutil

    import torch

    from omnicore.checkpoint.errors import CheckpointError
    from omnicore.checkpoint.init_from import resolve_init_from
    from omnicore.eval.loading import load_trained

    export = tmp_path / "export"
    shutil.copytree(exported, export)
    listed = json.loads((export / "manifest.json").read_text())["files"]
    files = sorted(p.relative_to(export).as_posix() for p in export.rglob("*") if p.is_file() and p != export / "manifest.json")
    assert sorted(listed) == files and {"omnicore.yaml", "foundation/model.safetensors", "foundation/config.json"} <= set(files)
    assert all(listed[n] == _digest(export / n) for n in files)  # against hashlib over each whole file
    cfg = _cfg(text_jsonl, tmp_path / "x")
    model, _, _ = load_trained(cfg, export=str(export))
    assert all(torch.isfinite(p).all() for p in model.parameters())

    weights = export / "foundation" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"  # float32 inf over the last weight: header and size unchanged
    weights.write_bytes(bytes(data))
    damaged = (
        f"export {export} is damaged: {weights}: sha256 differs from the manifest (corrupt bytes); restore it from a copy or export "
        "the run again from its checkpoint, or load it unchecked with --no-verify (run.verify: false)"
    )
    with pytest.raises(CheckpointError) as err:
        load_trained(cfg, export=str(export))
    assert str(err.value) == damaged
    d = _cfg_dict(text_jsonl, tmp_path / "y")
    d["model"]["init_from"] = str(export)
    with pytest.raises(CheckpointError) as err:
        resolve_init_from(Config.model_validate(d))
    assert str(err.value) == f"model.init_from: {damaged}"

    asked = _cfg(text_jsonl, tmp_path / "x").model_copy(update={"run": cfg.run.model_copy(update={"verify": False})})
    model, _, _ = load_trained(asked, export=str(export))  # loaded as asked: the inf is in the model
    assert not all(torch.isfinite(p).all() for p in model.parameters())

    (export / "manifest.json").unlink()
    with pytest.raises(CheckpointError) as err:
        load_trained(cfg, export=str(export))
    assert str(err.value).startswith(f"export {export} cannot be verified: {export / 'manifest.json'}: missing")


# ---- a resume on other data ---------------------------------------------------------------------------------


def test_the_fingerprint_sees_reordered_and_rewritten_bytes(tmp_path):
    import hashlib

    from omnicore.data.fingerprint import BLOCK_BYTES, BLOCKS, WHOLE_BYTES, compare_fingerprints, file_fingerprint

    lines = [json.dumps({"i": i, "text": "x" * (i % 40)}) + "\n" for i in range(50000)]
    big = tmp_path / "big.jsonl"
    big.write_text("".join(lines))
    data = big.read_bytes()
    n = len(data)
    assert n > WHOLE_BYTES
    blocks = b"".join(data[(n - BLOCK_BYTES) * i // (BLOCKS - 1) :][:BLOCK_BYTES] for i in range(BLOCKS))
    fp = file_fingerprint(big)
    assert fp == f"{n}:{hashlib.sha256(blocks).hexdigest()[:16]}"  # the sampled blocks, cut another way
    small = tmp_path / "small.jsonl"
    small.write_text("".join(lines[:100]))
    assert file_fingerprint(small) == f"{small.stat().st_size}:{hashlib.sha256(small.read_bytes()).hexdigest()[:16]}"

    big.write_text("".join(reversed(lines)))  # the same samples, the same size
    assert big.stat().st_size == n and file_fingerprint(big) != fp
    big.write_bytes(data[:-2] + b"9\n")  # one digit of the last line
    assert file_fingerprint(big) != fp
    was, now = {"train": [[str(big), fp]]}, {"train": [[str(big), file_fingerprint(big)]]}
    assert compare_fingerprints(was, now) == (
        f"data source 'train': {big} is not the file the checkpoint's run read (the same size, other bytes: rewritten or reordered)"
    )
    big.write_bytes(data + lines[0].encode())
    assert compare_fingerprints(was, {"train": [[str(big), file_fingerprint(big)]]}) == (
        f"data source 'train': {big} is not the file the checkpoint's run read ({n} bytes then, {n + len(lines[0])} now)"
    )
    big.write_bytes(data)
    assert compare_fingerprints(was, {"train": [[str(big), file_fingerprint(big)]]}) is None
    assert compare_fingerprints(None, now) is None  # a checkpoint from before fingerprints


@pytest.fixture(scope="module")
def stopped(text_jsonl, tmp_path_factory) -> Path:
    """A 6-step run stopped after step 4 (checkpoints at steps 2 and 4); each test resumes a copy."""
    from omnicore.train.loop import train

    out = tmp_path_factory.mktemp("stopped") / "run"
    train(_cfg(text_jsonl, out, save_every=2, stop_after=4))
    return out


@pytest.fixture
def run(stopped, tmp_path) -> Path:
    import shutil

    shutil.copytree(stopped, tmp_path / "run")
    return tmp_path / "run"


def test_plain_resume_with_a_deleted_latest_says_what_it_took(text_jsonl, run, caplog):
    from omnicore.train.loop import train

    (run / "checkpoints" / "latest").unlink()
    with caplog.at_level(logging.INFO, logger="omnicore"):
        train(_cfg(text_jsonl, run), resume=True)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "resuming from" in r.getMessage()]
    assert said == [
        f"{run / 'checkpoints' / 'latest'} is missing; resuming from the newest checkpoint that verifies, {run / 'checkpoints' / 'step-00000004'}"
    ]
    assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4, 5, 6]


def test_a_resume_on_a_rewritten_data_file_is_refused_naming_it(text_jsonl, run, caplog):
    from omnicore.data.state import DataResumeError
    from omnicore.train.loop import train

    original = text_jsonl.read_bytes()
    text_jsonl.write_text("".join(reversed(original.decode().splitlines(keepends=True))))  # the samples reversed, same size
    try:
        with pytest.raises(DataResumeError) as err:
            train(_cfg(text_jsonl, run), resume=True)
        assert str(err.value) == (
            f"{run / 'checkpoints' / 'step-00000004'}: data source 'train': {text_jsonl} is not the file the checkpoint's run read "
            "(the same size, other bytes: rewritten or reordered); a resume must read the data its checkpoint was trained on, or "
            "it trains on other samples than a run without the stop: restore the file, or start a new run from the checkpoint's "
            "weights (model.init_from), or resume anyway with --no-verify (run.verify: false)"
        )
        assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4]  # nothing trained
        d = _cfg_dict(text_jsonl, run)
        d["run"]["verify"] = False
        with caplog.at_level(logging.WARNING, logger="omnicore"):
            train(Config.model_validate(d), resume=True)  # asked: it resumes, and says what differs
        assert any(r.getMessage().startswith(f"data: data source 'train': {text_jsonl} is not the file") for r in caplog.records)
        assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4, 5, 6]
    finally:
        text_jsonl.write_bytes(original)
