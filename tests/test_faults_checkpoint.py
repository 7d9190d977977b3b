"""Faults in signals and checkpoints (issue 27, item 10): two SIGTERMs close together, on one process
and in the Slurm pattern under torchrun, leave a verified checkpoint.

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
