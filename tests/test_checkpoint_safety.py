"""Checkpoints and the run folder (issue 10): no code runs from a checkpoint's files, checksums catch
corrupt bytes, a corrupt newest checkpoint names its bad file and offers the previous one, one run
per folder, pruning keeps the run's own checkpoints, and a full disk leaves the previous one usable.

Tiny ``nn.Sequential`` models on one process; a 2-process FSDP2 round trip through
:func:`omnicore.testing.distributed.run_distributed`.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omnicore.checkpoint.dcp import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from omnicore.checkpoint.lock import RunLock, RunLockError
from omnicore.checkpoint.resume import find_good_checkpoint, resolve_resume
from omnicore.checkpoint.safety import SafeLoadPlanner
from omnicore.parallel.state import ParallelState

ONE = ParallelState(0, 1, 0, torch.device("cpu"))


class _Marker:
    """A pickle payload: unpickling it creates the file ``path`` (what an attacker's code would do)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('ran')",))


def _parts(seed: int = 0, wrap=None):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    if wrap is not None:
        wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def _train(model, opt, sched, steps: int = 1) -> None:
    for _ in range(steps):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def _save(root: Path, step: int, keep: int = 2, seed: int = 0) -> Path:
    model, opt, sched = _parts(seed)
    _train(model, opt, sched)
    return save_checkpoint(root, step, model, opt, sched, {"micro_batches": step}, ONE, keep)


def _rewrite_manifest(folder: Path) -> None:
    """Recompute manifest.json as an attacker who edits the checksums too would."""
    files = {p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in folder.iterdir()}
    files.pop("manifest.json", None)
    (folder / "manifest.json").write_text(json.dumps({"format": 1, "files": files}))


def _flip(path: Path, offset: int = -20) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# ---- round trip, manifest, RNG as JSON ------------------------------------------------------------


def test_round_trip_restores_weights_optimizer_rng_and_writes_checksums(tmp_path):
    model, opt, sched = _parts(0)
    _train(model, opt, sched, 2)
    torch.manual_seed(123)
    random.seed(7)
    folder = save_checkpoint(tmp_path, 2, model, opt, sched, {"micro_batches": 2}, ONE)
    expect_torch, expect_py = torch.rand(3), random.random()

    names = sorted(p.name for p in folder.iterdir())
    assert names == [".metadata", "__0_0.distcp", "manifest.json", "rng-rank0.json", "trainer_state.json"]
    manifest = json.loads((folder / "manifest.json").read_text())["files"]
    assert sorted(manifest) == [n for n in names if n != "manifest.json"]
    for name, entry in manifest.items():  # against hashlib over the whole file, read another way
        data = (folder / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    json.loads((folder / "rng-rank0.json").read_text())  # plain JSON, no pickle

    fresh, fopt, fsched = _parts(1)
    meta = load_checkpoint(latest_checkpoint(tmp_path), fresh, fopt, fsched, ONE)
    assert meta["step"] == 2 and meta["micro_batches"] == 2
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], fopt.state_dict()["state"][0]["exp_avg"])
    assert fopt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] and fsched.last_epoch == sched.last_epoch == 2
    assert torch.equal(torch.rand(3), expect_torch) and random.random() == expect_py


# ---- nothing runs from the files ------------------------------------------------------------------


def test_tampered_metadata_is_refused_without_running(tmp_path):
    folder = _save(tmp_path, 1)
    marker = tmp_path / "MARKER"
    (folder / ".metadata").write_bytes(pickle.dumps(_Marker(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata: \d+ bytes, the manifest says \d+"):  # caught by the manifest first
        load_checkpoint(folder, *_parts(1), ONE)
    _rewrite_manifest(folder)  # an attacker who also fixes the checksums meets the restricted unpickler
    with pytest.raises(CheckpointError, match=r"\.metadata: not a valid DCP metadata file.*builtins\.exec"):
        load_checkpoint(folder, *_parts(1), ONE)
    assert not marker.exists()


def test_tampered_rng_file_is_refused_without_running(tmp_path):
    folder = _save(tmp_path, 1)
    marker = tmp_path / "MARKER"
    # a checkpoint of the old layout: rng-rank0.pt, read with weights_only=True
    (folder / "rng-rank0.json").unlink()
    torch.save(_Marker(marker), folder / "rng-rank0.pt")
    _rewrite_manifest(folder)
    with pytest.raises(CheckpointError, match=r"rng-rank0\.pt: not a valid RNG state file \(UnpicklingError"):
        load_checkpoint(folder, *_parts(1), ONE)
    assert not marker.exists()

    (folder / "rng-rank0.pt").unlink()
    (folder / "rng-rank0.json").write_text('{"torch": "!!", "python": [3, [1], null]}')
    _rewrite_manifest(folder)
    with pytest.raises(CheckpointError, match=r"rng-rank0\.json: not a valid RNG state file"):
        load_checkpoint(folder, *_parts(1), ONE)


def test_checkpoint_of_the_old_layout_loads_when_asked(tmp_path):
    """Written before checksums and JSON RNG: no manifest.json, rng-rank0.pt from torch.save. It
    cannot be verified, so it is refused unless the user asks (run.verify: false)."""
    folder = _save(tmp_path, 1)
    (folder / "manifest.json").unlink()
    (folder / "rng-rank0.json").unlink()
    torch.manual_seed(11)
    random.seed(12)
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, folder / "rng-rank0.pt")
    expect = (torch.rand(2), random.random())
    with pytest.raises(CheckpointError, match=r"cannot be verified: .*manifest\.json: missing.*--no-verify"):
        load_checkpoint(folder, *_parts(1), ONE)
    assert load_checkpoint(folder, *_parts(1), ONE, verify=False)["step"] == 1
    assert torch.equal(torch.rand(2), expect[0]) and random.random() == expect[1]


def test_non_tensor_values_load_with_weights_only():
    """DCP's own planner reads optimizer hyper-parameters with weights_only=False; ours refuses code."""
    marker = Path(os.environ.get("TMPDIR", "/tmp")) / f"omnicore-marker-{os.getpid()}"
    buf = io.BytesIO()
    torch.save(_Marker(marker), buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="exec"):
        SafeLoadPlanner().load_bytes(None, buf)
    assert not marker.exists()


# ---- checksums, corrupt newest checkpoint, explicit folder ------------------------------------------


def test_flipped_byte_in_tensor_file_is_named(tmp_path):
    folder = _save(tmp_path, 1)
    _flip(folder / "__0_0.distcp")
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp: sha256 differs from the manifest"):
        load_checkpoint(folder, *_parts(1), ONE)
    (folder / "extra.bin").write_bytes(b"x")
    _rewrite_manifest(folder)
    (folder / "extra2.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"extra2\.bin: not in the checkpoint's manifest"):
        load_checkpoint(folder, *_parts(1), ONE)


def test_corrupt_newest_names_file_and_offers_previous(tmp_path):
    first = _save(tmp_path, 1)
    newest = _save(tmp_path, 2, seed=1)
    assert resolve_resume(tmp_path, None) == newest
    _flip(newest / "__0_0.distcp")
    with pytest.raises(CheckpointError) as err:
        resolve_resume(tmp_path, None)
    assert str(err.value) == (
        f"checkpoint {newest} is corrupt: {newest / '__0_0.distcp'}: sha256 differs from the manifest (corrupt bytes); "
        f"the previous checkpoint {first} verifies: resume from it with --resume {first}"
    )
    assert resolve_resume(tmp_path, "step-00000001") == first
    assert resolve_resume(tmp_path, str(first)) == first
    with pytest.raises(CheckpointError, match="--resume step-9: no such checkpoint folder"):
        resolve_resume(tmp_path, "step-9")

    folder, message = find_good_checkpoint(tmp_path)
    assert folder == first
    assert message.startswith(f"skipped 1 corrupt checkpoint(s) (checkpoint {newest} is corrupt: {newest / '__0_0.distcp'}")
    assert message.endswith(f"resuming from the previous good one, {first}")
    model, opt, sched = _parts(5)
    assert load_checkpoint(folder, model, opt, sched, ONE)["step"] == 1

    _flip(first / ".metadata", 5)
    with pytest.raises(CheckpointError, match=r"no usable checkpoint under .*: .*__0_0\.distcp.*; .*\.metadata"):
        find_good_checkpoint(tmp_path)


# ---- pruning -----------------------------------------------------------------------------------------


def test_fresh_run_keeps_its_checkpoint_beside_older_runs_later_steps(tmp_path):
    """The issue's example: step-2 and step-4 of an earlier run, no `latest`; a fresh run saves step 1."""
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    (tmp_path / "latest").unlink()
    new = _save(tmp_path, 1, seed=3)
    assert (tmp_path / "latest").read_text() == "step-00000001"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step-00000001", "step-00000002", "step-00000004"]
    assert resolve_resume(tmp_path, None) == new
    assert load_checkpoint(new, *_parts(1), ONE)["step"] == 1


def test_prune_keeps_the_newest_by_step_number(tmp_path):
    for step in (9, 10, 11, 100):  # by name "step-00000100" sorts after; by step too; 9 < 10 as numbers
        _save(tmp_path, step, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step-00000010", "step-00000011", "step-00000100"]
    _save(tmp_path, 12, keep=1)  # the step-100 folder is of a later step: not this save's to prune
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step-00000012", "step-00000100"]


# ---- I/O errors during save ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "says"),
    [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "is not writable"), (errno.EFBIG, "exceeds the file-size limit")],
)
def test_failed_save_leaves_previous_checkpoint_usable(tmp_path, monkeypatch, code, says):
    import torch.distributed.checkpoint.filesystem as fs

    previous = _save(tmp_path, 1)
    size_mb = sum(p.stat().st_size for p in previous.iterdir()) / 1e6
    real, calls = fs._write_item, []

    def failing(*args, **kwargs):  # the third tensor write fails, mid-file
        calls.append(1)
        if len(calls) == 3:
            raise OSError(code, os.strerror(code), str(tmp_path / ".tmp-step-00000002" / "__0_0.distcp"))
        return real(*args, **kwargs)

    monkeypatch.setattr(fs, "_write_item", failing)
    with pytest.raises(CheckpointError) as err:
        _save(tmp_path, 2, seed=1)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"cannot save checkpoint {tmp_path / 'step-00000002'}: ")
    assert says in message and message.endswith(f"the previous checkpoint {previous} is intact")
    if code == errno.ENOSPC:
        assert f"a checkpoint takes about {size_mb:.1f} MB, the size of step-00000001" in message
    assert len(calls) == 3
    assert (tmp_path / "latest").read_text() == "step-00000001"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000001"]  # no .tmp left
    monkeypatch.undo()
    model, opt, sched = _parts(1)
    assert load_checkpoint(resolve_resume(tmp_path, None), model, opt, sched, ONE)["step"] == 1


# ---- one run per folder ----------------------------------------------------------------------------------


def test_second_run_is_refused_and_lock_released(tmp_path):
    with RunLock(tmp_path) as lock:
        assert lock.message is None
        held = json.loads((tmp_path / "run.lock").read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        with pytest.raises(RunLockError) as err:
            RunLock(tmp_path).acquire()
        assert f"is in use by the running PID {os.getpid()} on host {socket.gethostname()}" in str(err.value)
        assert "use another run.output_dir" in str(err.value)
    assert not (tmp_path / "run.lock").exists()


@pytest.mark.cli
def test_stale_lock_is_taken_over_and_foreign_host_is_not(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its PID no longer runs (and is not reused within this test in practice)
    (tmp_path / "run.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "then"}))
    with RunLock(tmp_path) as lock:
        assert lock.message == (
            f"took over the stale lock {tmp_path / 'run.lock'} of PID {dead.pid} on {socket.gethostname()} (started then), "
            "which is no longer running"
        )
        assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()

    (tmp_path / "run.lock").write_text(json.dumps({"pid": os.getpid(), "host": "other-host.example", "started": "t"}))
    with pytest.raises(RunLockError, match=r"in use by PID \d+ on host other-host\.example .*delete .*run\.lock if that run is gone"):
        RunLock(tmp_path).acquire()
    # our own PID with another process start time: a reused PID, so the lock is stale
    (tmp_path / "run.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "proc_start": "1", "started": "t"}))
    with RunLock(tmp_path) as lock:
        assert lock.message is not None and "took over the stale lock" in lock.message
    (tmp_path / "run.lock").write_text("garbage")
    with pytest.raises(RunLockError, match=r"run\.lock is unreadable \(not a run lock\); if no run is using"):
        RunLock(tmp_path).acquire()


# ---- two processes --------------------------------------------------------------------------------------


def _two_rank_round_trip(root: str) -> dict:
    from torch.distributed.fsdp import fully_shard

    from omnicore.checkpoint.manifest import verify_manifest
    from omnicore.parallel.state import init_parallel_state

    state = init_parallel_state("cpu", "gloo", None)

    def shard(m):
        return fully_shard(m, mesh=state.fsdp_mesh())

    model, opt, sched = _parts(0, shard)
    _train(model, opt, sched, 1)
    folder = save_checkpoint(root, 1, model, opt, sched, {}, state)
    manifest = sorted(json.loads((folder / "manifest.json").read_text())["files"])
    fresh, fopt, fsched = _parts(1, shard)
    load_checkpoint(folder, fresh, fopt, fsched, state)
    same = all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(model.parameters(), fresh.parameters(), strict=True))
    state.barrier()
    if state.is_main:
        _flip(folder / "__1_0.distcp")  # rank 0 verifies it (sorted files [0::2]); both ranks must fail
    state.barrier()
    try:
        load_checkpoint(folder, fresh, fopt, fsched, state)
        error = None
    except CheckpointError as e:
        error = str(e)
    return {"manifest": manifest, "same": same, "error": error, "own_share": verify_manifest(folder, (state.rank, 2))}


@pytest.mark.multiprocess
def test_two_process_save_load_with_manifest(tmp_path):
    from omnicore.testing.distributed import run_distributed

    ranks = run_distributed(_two_rank_round_trip, 2, args=(str(tmp_path),))
    bad = tmp_path / "step-00000001" / "__1_0.distcp"
    want = [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-rank0.json", "rng-rank1.json", "trainer_state.json"]
    for r in ranks:
        assert r["manifest"] == want and r["same"] is True
        assert r["error"] == f"checkpoint {tmp_path / 'step-00000001'} is corrupt: {bad}: sha256 differs from the manifest (corrupt bytes)"
    # the work is split: rank 0's share ([0::2] of the sorted names) holds the bad file, rank 1's does not
    assert ranks[0]["own_share"] == f"{bad}: sha256 differs from the manifest (corrupt bytes)"
    assert ranks[1]["own_share"] is None


def test_full_disk_reported_as_a_writer_error_is_named_as_full_disk(tmp_path, monkeypatch):
    """torch's zip writer reports a full disk as ``RuntimeError: ... unexpected pos 704 vs 598``;
    with the file system nearly full, the error says the disk is full, and the previous checkpoint
    stays usable. With space left, the same RuntimeError is a bug and propagates as it is."""
    from collections import namedtuple

    import torch.distributed.checkpoint.filesystem as fs

    import omnicore.checkpoint.dcp as dcp_mod

    previous = _save(tmp_path, 1)
    real = fs._write_item

    def failing(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598")

    usage = namedtuple("usage", "total used free")
    real_usage = dcp_mod.shutil.disk_usage
    monkeypatch.setattr(fs, "_write_item", failing)
    monkeypatch.setattr(dcp_mod.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(CheckpointError) as err:
        _save(tmp_path, 2, seed=1)
    assert "the disk is full" in str(err.value) and str(err.value).endswith(f"the previous checkpoint {previous} is intact")
    assert (tmp_path / "latest").read_text() == "step-00000001"
    monkeypatch.setattr(dcp_mod.shutil, "disk_usage", real_usage)
    with pytest.raises(BaseException) as bug:  # DCP wraps it in its CheckpointException (a BaseException)
        _save(tmp_path, 2, seed=1)
    assert "unexpected pos 704 vs 598" in str(bug.value) and not isinstance(bug.value, CheckpointError)
    monkeypatch.setattr(fs, "_write_item", real)
