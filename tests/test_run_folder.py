"""The run folder through the CLI: a second run into a folder a live run holds is refused (naming
its PID and host); plain ``--resume`` skips a corrupt newest checkpoint and says so, and
``--resume CHECKPOINT`` on a corrupt one names the bad file and offers the previous one."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest
from test_signals import _cmd, _env, _losses, _rows, config  # noqa: F401  (config is a fixture)

pytestmark = pytest.mark.cli


def test_second_run_into_a_held_folder_is_refused(config, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    first = subprocess.Popen(
        _cmd(config, out, 1) + ["--train.max_steps", "100000"], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while _rows(out) < 1:
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() is not None else "timeout"
            time.sleep(0.05)
        second = subprocess.run(_cmd(config, out, 1), env=_env(), capture_output=True, text=True, timeout=120)
    finally:
        first.terminate()
        first.wait(60)
    assert second.returncode == 2, second.stderr
    err = [x for x in second.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and f"PID {first.pid}" in err[0] and socket.gethostname() in err[0], second.stderr
    assert not (out / "run.lock").exists()  # the first run released it when it stopped


def _two_checkpoints(config, out):  # noqa: F811
    """A run of the module's config stopped after 4 steps, saving every 2: step-2 and step-4."""
    r = subprocess.run(
        _cmd(config, out, 1) + ["--train.stop_after", "4", "--train.save_every", "2"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    bad = out / "checkpoints" / "step-00000004" / "__0_0.distcp"
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the newest checkpoint's tensors
    bad.write_bytes(bytes(data))
    return bad


def test_resume_skips_a_corrupt_newest_checkpoint(config, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    bad = _two_checkpoints(config, out)
    r = subprocess.run(
        _cmd(config, out, 1, resume=True) + ["--train.max_steps", "6"], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert bad.name in r.stderr and "step-00000002" in r.stderr and "resumed from step 2" in r.stderr, r.stderr  # logged
    assert sorted(_losses(out)) == [1, 2, 3, 4, 5, 6]


def test_resume_from_a_named_corrupt_checkpoint_names_the_file_and_the_previous_one(config, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    bad = _two_checkpoints(config, out)
    cmd = _cmd(config, out, 1) + ["--resume", "step-00000004"]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and bad.name in err[0] and "step-00000002" in err[0] and "--resume" in err[0], r.stderr
    ok = subprocess.run(_cmd(config, out, 1) + ["--resume", str(out / "checkpoints" / "step-00000002"), "--train.max_steps", "3"],
                        env=_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ok.returncode == 0 and "resumed from step 2" in ok.stderr, ok.stderr[-2000:]
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
