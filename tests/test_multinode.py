"""Two "nodes" on one machine: two torchrun agents meeting through the c10d rendezvous (the
multi-node launch of docs/parallelism.md, ``--nnodes 2 --nproc-per-node 1``) train exactly like one process with
``train.grad_accum 2``.

Each agent starts one worker; the rendezvous (a TCP store on ``localhost:PORT``, hosted by whichever
agent binds the port first) gives them global ranks 0 and 1, and the workers then run FSDP2 (the
default strategy on several processes) over gloo. The output folder is one folder both "nodes" see,
as a shared file system would be.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, tiny_config_dict

pytestmark = [pytest.mark.cli, pytest.mark.multiprocess]  # both tests start two torchrun agents

STEPS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp: Path, digits: Path, name: str, grad_accum: int) -> Path:
    cfg = tiny_config_dict(str(digits / "train.jsonl"), output_dir=str(tmp / name), max_steps=STEPS, grad_accum=grad_accum)
    cfg["data"]["num_workers"] = 0  # the pipeline is the same with workers; 0 saves start-up time here
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc; torchrun starts its workers in sessions of their own,
    so killing the agent's process group does not reach them)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        kids = [c for c, p in parent.items() if p == todo.pop()]
        out += kids
        todo += kids
    return out


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a still-running ``proc`` and everything it started, so a hang cannot outlive the test."""
    if proc.poll() is None:
        for pid in [*_descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def _two_agents(config: Path, cwd: Path, timeout: float = 600) -> list[tuple[int, str]]:
    """Start two torchrun agents as two nodes of one job; return each one's (exit code, output)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"multinode-{port}"]
    cmd += ["-m", "omnicore", "train", str(config)]
    logs = [cwd / f"agent{i}.log" for i in range(2)]
    agents = []
    try:
        for log in logs:  # output to files: a full pipe of one agent must not stall it while we wait on the other
            with open(log, "w") as f:
                agents.append(subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=f, stderr=subprocess.STDOUT))
        codes = [p.wait(timeout=timeout) for p in agents]
    finally:
        for p in agents:
            _kill_tree(p)
    return [(code, log.read_text()) for code, log in zip(codes, logs)]


@pytest.fixture(scope="module")
def reference(digits_jsonl, tmp_path_factory) -> list[float]:
    """Losses of one process with grad_accum 2 (the global batch of 2 nodes x 1 micro-batch)."""
    tmp = tmp_path_factory.mktemp("one")
    one = _config(tmp, digits_jsonl, "one", grad_accum=2)
    proc = subprocess.run(
        [sys.executable, "-m", "omnicore", "train", str(one)], cwd=tmp, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = _losses(tmp / "one")
    assert len(losses) == STEPS and losses[-1] < losses[0]  # it learns
    return losses


def test_two_nodes_equal_one_process_with_grad_accum_2(reference, digits_jsonl, tmp_path):
    """Losses per step of 2 nodes x 1 process equal 1 process x 2 micro-batches (rel 1e-5).

    The global batch is the same (2 micro-batches); the loss is normalised by the global target
    count, so only the order of floating-point sums differs (measured: about 1e-7)."""
    results = _two_agents(_config(tmp_path, digits_jsonl, "two", grad_accum=1), tmp_path)
    for code, out in results:
        assert code == 0, out[-4000:]
    log = "".join(out for _, out in results)
    # rank 0 (on whichever agent it landed) prints the world; the two workers formed one job of 2
    assert "(world 2)" in log and "data split into 2 shard(s)" in log
    assert _losses(tmp_path / "two") == pytest.approx(reference, rel=1e-5)


SRUN = """#!/bin/bash
# stand-in for Slurm's srun: run the command once per node of the job, all at once
while [[ "$1" == --* ]]; do shift; done
pids=()
for _ in $(seq "$SLURM_JOB_NUM_NODES"); do "$@" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""
SCONTROL = """#!/bin/bash
# stand-in for `scontrol show hostnames`: both "nodes" are this machine
[ "$1 $2" = "show hostnames" ] && printf 'localhost\\nlocalhost\\n'
"""


def test_slurm_script_launches_two_nodes(reference, digits_jsonl, tmp_path):
    """examples/slurm/train.sbatch, run with stand-ins for srun (one task per node, concurrently)
    and scontrol on a 2-node "allocation" of this machine, with 1 process per node and an override
    after the config: the run equals one process with grad_accum 2 (rel 1e-5)."""
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    port = _free_port()
    env = _env()
    env.update(
        PATH=f"{shims}:{Path(sys.executable).parent}:{env['PATH']}",
        SLURM_JOB_ID=str(port),
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_NODELIST="node[1-2]",
        GPUS_PER_NODE="1",
        RDZV_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    config = _config(tmp_path, digits_jsonl, "two", grad_accum=1)
    cmd = ["bash", str(ROOT / "examples" / "slurm" / "train.sbatch"), str(config), "--run.output_dir", str(tmp_path / "slurm")]
    log = tmp_path / "job.log"
    with open(log, "w") as f:
        job = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        code = job.wait(timeout=600)
    finally:
        _kill_tree(job)
    out = log.read_text()
    assert code == 0, out[-4000:]
    assert f"job {port}: 2 node(s) x 1 process(es), rendezvous at localhost:{port}" in out
    assert "(world 2)" in out and not (tmp_path / "two").exists()  # the override moved the output
    assert _losses(tmp_path / "slurm") == pytest.approx(reference, rel=1e-5)
