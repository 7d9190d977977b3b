"""Fault injection: kill a training run at random points, resume it, and compare with a straight run.

    .venv/bin/python bench/faults.py [--tries 20] [--nproc 1,2] [--steps 8] [--seed 0]

For each process count, one straight run gives the reference losses. Then, ``--tries`` times: a fresh
run into a new folder is killed with SIGKILL (torchrun and every worker at once, found through ``/proc``,
as a machine failure does without warning): on even tries after a random delay drawn uniformly
over the straight run's duration (start-up, steps, saves), on odd tries inside the checkpoint save
of a random step (0-30 ms after its temporary folder appears; ``train.save_every 1``). The run is then continued with ``--resume`` (or started afresh when no
checkpoint was written yet) until it finishes. A try *survives* when the continuation finishes
(exit 0) and the losses of every step, the last row written for each step, equal the straight
run's within ``--rtol``. Writes ``bench/results/faults.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

LM = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def write_data(folder: Path, n: int = 48) -> Path:
    """A small text-only chat JSONL (deterministic)."""
    rows = []
    for i in range(n):
        q = "Count " + " ".join(str((i * 7 + k) % 10) for k in range(2 + i % 9))
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 5)}]})
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_config(folder: Path, data: Path, steps: int) -> Path:
    """A tiny text-only run that saves every step (YAML is JSON)."""
    cfg = {
        "run": {"output_dir": "unused", "seed": 0},
        "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": LM, "tokenizer": "byte"}}},
        "data": {"train": str(data), "max_tokens": 256},
        "train": {
            "max_steps": steps,
            "lr": 3e-3,
            "warmup_steps": 1,
            "save_every": 1,
            "keep_checkpoints": 2,
            "progress": False,
            "export": False,
        },
    }
    path = folder / "config.yaml"
    path.write_text(json.dumps(cfg))
    return path


def command(cfg: Path, out: Path, nproc: int, resume: bool) -> list[str]:
    base = ["-m", "omnicore", "train", str(cfg), "--run.output_dir", str(out)] + (["--resume"] if resume else [])
    if nproc == 1:
        return [PY, *base]
    return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *base]


def run_to_end(cfg: Path, out: Path, nproc: int, resume: bool, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(command(cfg, out, nproc, resume), env=env, capture_output=True, text=True, timeout=timeout)


def losses(out: Path) -> dict[int, float]:
    """Step -> loss, the last row written for each step (a resumed run rewrites the steps it redoes)."""
    rows = (
        [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()] if (out / "metrics.jsonl").is_file() else []
    )
    return {r["step"]: r["loss"] for r in rows}


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, from ``/proc/*/stat`` (torchrun starts its workers in
    sessions of their own, so killing its process group would leave them running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo += children.get(q, [])
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant at once (a machine failure: nobody gets to clean up)."""
    for q in process_tree(pid):
        try:
            os.kill(q, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_after(cfg: Path, out: Path, nproc: int, delay: float, in_save: int | None = None, jitter: float = 0.0) -> dict:
    """Start a fresh run and SIGKILL it after ``delay`` seconds, or, with ``in_save = k``,
    ``jitter`` seconds after the save of step ``k`` has begun (its ``.tmp-step-k`` folder exists:
    the kill lands inside the save); what it left behind."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen(command(cfg, out, nproc, False), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, finished = time.perf_counter(), False
    target = out / "checkpoints" / f".tmp-step-{in_save:08d}" if in_save is not None else None
    while True:
        if p.poll() is not None:
            finished = True
            break
        if (target is not None and target.exists()) or (target is None and time.perf_counter() - t0 >= delay):
            time.sleep(jitter if target is not None else 0.0)
            kill_tree(p.pid)
            p.wait()
            break
        time.sleep(0.001 if target is not None else 0.01)
    ckpts = out / "checkpoints"
    return {
        "kill": f"in the save of step {in_save}" if in_save is not None else "at a random time",
        "delay_s": round(time.perf_counter() - t0, 2),
        "finished_before_kill": finished,
        "during_save": any(ckpts.glob(".tmp-step-*")) if ckpts.is_dir() else False,
        "steps_logged": len(losses(out)),
        "latest": (ckpts / "latest").read_text().strip() if (ckpts / "latest").is_file() else None,
    }


def one_try(cfg: Path, out: Path, nproc: int, kill: tuple[float, int | None, float], want: dict[int, float], rtol: float) -> dict:
    rec = kill_after(cfg, out, nproc, *kill)
    if not rec["finished_before_kill"]:
        r = run_to_end(cfg, out, nproc, resume=rec["latest"] is not None)
        rec["resume_rc"] = r.returncode
        if r.returncode != 0:
            rec["resume_error"] = (r.stderr.strip().splitlines() or [""])[-1][:300]
    got = losses(out)
    rec["equal"] = set(got) == set(want) and all(abs(got[s] - want[s]) <= rtol * abs(want[s]) for s in want)
    rec["survived"] = rec.get("resume_rc", 0) == 0 and rec["equal"]
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--nproc", default="1,2", help="comma-separated process counts")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rtol", type=float, default=1e-6)
    ap.add_argument("--work", default=None, help="working folder (default: a new one under /tmp)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "faults.json"))
    a = ap.parse_args(argv)
    import tempfile

    work = Path(a.work or tempfile.mkdtemp(prefix="omnicore-faults-"))
    cfg = write_config(work, write_data(work), a.steps)
    rng = random.Random(a.seed)
    result: dict = {"tries": a.tries, "steps": a.steps, "rtol": a.rtol, "modes": {}}
    for nproc in [int(x) for x in a.nproc.split(",")]:
        t0 = time.perf_counter()
        r = run_to_end(cfg, work / f"straight-{nproc}", nproc, resume=False)
        if r.returncode != 0:
            raise SystemExit(f"the straight run on {nproc} process(es) failed:\n{r.stderr[-2000:]}")
        duration = time.perf_counter() - t0
        want = losses(work / f"straight-{nproc}")
        records = []
        for i in range(a.tries):
            # even tries: a random time; odd tries: inside the save of a random step
            in_save = rng.randint(1, a.steps - 1) if i % 2 else None
            kill = (rng.uniform(0.05, 1.0) * duration, in_save, rng.uniform(0.0, 0.03))
            rec = one_try(cfg, work / f"try-{nproc}-{i:02d}", nproc, kill, want, a.rtol)
            records.append(rec)
            print(
                f"nproc {nproc} try {i:2d}: kill {rec['kill']} at {rec['delay_s']:5.1f} s, logged {rec['steps_logged']}, "
                f"during save {rec['during_save']}, survived {rec['survived']}",
                flush=True,
            )
        killed = [x for x in records if not x["finished_before_kill"]]
        result["modes"][str(nproc)] = {
            "straight_run_s": round(duration, 1),
            "straight_losses": [want[s] for s in sorted(want)],
            "tries": len(records),
            "killed": len(killed),
            "killed_during_save": sum(x["during_save"] for x in killed),
            "survived": sum(x["survived"] for x in records),
            "final_losses_equal": sum(x["equal"] for x in records),
            "records": records,
        }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("| processes | tries | killed | killed during a save | survived | final losses equal a straight run |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n, m in result["modes"].items():
        print(f"| {n} | {m['tries']} | {m['killed']} | {m['killed_during_save']} | {m['survived']} | {m['final_losses_equal']} |")
    print(f"wrote {out}")
    return 0 if all(m["survived"] == m["tries"] for m in result["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
