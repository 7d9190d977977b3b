"""SIGTERM and SIGINT during training, on 1 and on 2 processes: the run finishes its step, saves a
checkpoint, says how to resume and exits with 128 + the signal; ``--resume`` then ends with the
losses of an uninterrupted run. (A second signal within the grace period, and one after it:
tests/test_faults_checkpoint.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_LM

pytestmark = pytest.mark.cli

STEPS = 30


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("signals")
    rows = []
    for i in range(64):
        q = "Count " + " ".join(str((i * 7 + k) % 10) for k in range(2 + i % 9))
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 5)}]})
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "run": {"output_dir": "unused", "seed": 0},
        "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM), "tokenizer": "byte"}}},
        "data": {"train": "train.jsonl", "max_tokens": 512},
        "train": {"max_steps": STEPS, "lr": 3e-3, "warmup_steps": 1, "progress": False, "export": False},
    }
    (folder / "config.yaml").write_text(json.dumps(cfg))
    return folder / "config.yaml"


def _cmd(config: Path, out: Path, nproc: int, resume: bool = False) -> list[str]:
    args = ["-m", "omnicore", "train", str(config), "--run.output_dir", str(out)] + (["--resume"] if resume else [])
    if nproc == 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


def _continue(config: Path, out: Path, nproc: int) -> str:
    """The ``continue with:`` command of a run started by :func:`_cmd`: the same launch and
    overrides, then ``--resume`` (the interpreter by name when it is the one on PATH)."""
    import shlex
    import shutil

    cmd = _cmd(config, out, nproc)
    if nproc == 1:
        return shlex.join(["omnicore", *cmd[3:], "--resume"])
    name = Path(sys.executable).name
    return shlex.join([name if shutil.which(name) == sys.executable else sys.executable, *cmd[1:], "--resume"])


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in rows}


def _rows(out: Path) -> int:
    try:
        return len((out / "metrics.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


def _signal_after_steps(cmd: list[str], out: Path, signals: list[int], steps: int = 3, timeout: float = 240) -> subprocess.CompletedProcess:
    """Start ``cmd``, wait until ``steps`` metrics rows exist, send ``signals`` (to the launcher:
    torchrun forwards them to its workers), and wait for the end."""
    p = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while _rows(out) < steps:
        assert p.poll() is None, f"the run ended before it was signalled:\n{p.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "no metrics rows in time"
        time.sleep(0.02)
    for s in signals:
        p.send_signal(s)
        time.sleep(0.01)
    stdout, stderr = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def straight(config, tmp_path_factory) -> dict[int, dict[int, float]]:
    """Uninterrupted runs on 1 and 2 processes: step -> loss."""
    out = {}
    for nproc in (1, 2):
        folder = tmp_path_factory.mktemp(f"straight{nproc}")
        r = subprocess.run(_cmd(config, folder, nproc), env=_env(), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        out[nproc] = _losses(folder)
    return out


@pytest.mark.multiprocess  # the straight fixture and two of the cases run 2 processes
@pytest.mark.parametrize(("nproc", "sig"), [(1, signal.SIGTERM), (1, signal.SIGINT), (2, signal.SIGTERM), (2, signal.SIGINT)])
def test_signal_saves_and_resume_equals_a_straight_run(config, straight, tmp_path, nproc, sig):
    out = tmp_path / "run"
    r = _signal_after_steps(_cmd(config, out, nproc), out, [sig])
    name = signal.Signals(sig).name
    if nproc == 1:
        assert r.returncode == 128 + sig, (r.returncode, r.stderr[-3000:])
    else:
        assert r.returncode != 0, r.stderr[-3000:]  # torchrun reports its workers' failure
    assert f"stopped by {name} after step " in r.stderr, r.stderr[-3000:]
    assert f"continue with: {_continue(config, out, nproc)}\n" in r.stderr, r.stderr[-3000:]  # the launch and overrides kept
    if nproc == 1:
        assert "Traceback" not in r.stderr
    latest = (out / "checkpoints" / "latest").read_text().strip()
    stopped_at = int(latest.split("-")[1])
    assert 3 <= stopped_at < STEPS  # it stopped early, after the step it was in
    assert max(_losses(out)) == stopped_at  # and that step is the last one logged: nothing was lost
    r2 = subprocess.run(_cmd(config, out, nproc, resume=True), env=_env(), capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0, r2.stderr[-3000:]
    got, want = _losses(out), straight[nproc]
    assert sorted(got) == sorted(want)
    assert all(got[s] == pytest.approx(want[s], rel=1e-6) for s in want)
