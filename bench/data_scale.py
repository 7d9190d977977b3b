"""Data at scale (issue #11): does ``omnicore train`` start and run in the same memory and time
whatever the size of the data set, and do its DataLoader workers keep the step fed?

Usage::

    .venv/bin/python bench/data_scale.py [--quick] [--out bench/results/data_scale.json]
        [--sizes 20000,400000] [--steps 30] [--wait-steps 40] [--workers 2]

Figures (none asserted; the issue's goals are printed beside them):

a. **Peak RSS** of one ``omnicore train`` process over its first ``--steps`` steps (then its end
   checkpoint), on a synthetic chat data set of N samples, at each N in ``--sizes`` (20k and 400k;
   ``--quick``: 2k and 40k), and the ratio largest N / smallest N (goal <= 1.1). Memory is polled
   every 0.1 s from ``/proc``: the training process alone (VmRSS), the whole process tree (the
   training process and its DataLoader workers: the sum of VmRSS, which counts pages the forked
   workers share with their parent once per process, and the sum of PSS from ``smaps_rollup``,
   which splits shared pages between them).
b. **Time to the first step**: seconds from launching the process to the first line of its
   ``metrics.jsonl`` (polled every 0.1 s; ``train.log_every 1``), the same ratio (goal <= 1.2).
   It includes Python, torch and plugin start-up (about 3 s here), the same at every N.
c. **Data-wait share** on the digits data: sum of ``data_wait_s`` / sum of ``step_time_s`` over
   steps 2..``--wait-steps`` (the first step includes the workers' start), with ``--workers``
   DataLoader workers (goal <= 5%) and with 0 (the training process reads itself), side by side.
   Samples are packed per window of ``data.packing_window`` (1024) samples, about 78 steps of the
   digits data, and a window is decoded when the previous one is used up, so the waits come in
   bursts: ``--wait-steps`` (240; ``--quick`` 100) spans more than one window, or the share would
   miss them (over steps 2..40 it is under 1% even without workers).

Data. The synthetic set is built from real media: a small digits set is built from
``examples/digits/raw`` (``build_data.py``: MNIST PNGs, FSDD WAVs) into a temporary folder, its
images and recordings are copied into the data set's ``media/`` folder, and its samples (the three
digits tasks: image -> digit, spoken digit -> digit, "Draw the digit d." -> image) are repeated
round-robin until N lines are written (one buffered write; about 100 bytes per sample). Figure c
reads ``examples/digits/data/train.jsonl`` when ``examples/digits/run.sh`` has built it, else a
digits set built by ``build_data.py`` with its default sizes in a temporary folder.

Model. The tiny omni-modal model of ``tests/conftest.py`` (``tiny_config_dict``: Qwen2 hidden 32,
2 layers; SigLIP, Whisper and MoVQ components of the same scale), fp32, one process,
``OMP_NUM_THREADS`` 2 (1 per DataLoader worker through torch's default), token budget 512
(figures a, b) and 1024 (figure c, the digits config's budget). A small model makes steps short,
so the data-wait share is an upper bound of the digits model's.

Caveats: timings need a quiet machine (2 shared cores here); the RSS sum over the tree counts
shared pages several times, PSS does not; the first step's time also holds the workers' first
chunk of decoded samples.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DIGITS = ROOT / "examples" / "digits"
sys.path.insert(0, str(ROOT / "tests"))

from conftest import tiny_config_dict  # noqa: E402  (the tests' tiny model, one definition)

FULL = {"sizes": [20_000, 400_000], "steps": 30, "wait_steps": 240, "workers": 2}
QUICK = {"sizes": [2_000, 40_000], "steps": 30, "wait_steps": 100, "workers": 2}
GOALS = {"peak_rss_ratio_max": 1.1, "first_step_ratio_max": 1.2, "data_wait_share_max": 0.05}
POLL_S = 0.1
POOL = (
    "--train-images",
    "24",
    "--train-audio",
    "16",
    "--gen",
    "8",
    "--eval-images",
    "6",
    "--eval-audio",
    "6",
)  # 48 samples, one media file each


# ---- synthetic data ---------------------------------------------------------------------------


def build_digits(out: Path, *sizes: str) -> Path:
    """Run ``examples/digits/build_data.py --out OUT [sizes...]``; return ``OUT/train.jsonl``.

    Raises ``subprocess.CalledProcessError`` (with its output) when the build fails."""
    cmd = [sys.executable, str(DIGITS / "build_data.py"), "--out", str(out), "--seed", "0", *sizes]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out / "train.jsonl"


def media_samples(train_jsonl: Path, dest: Path) -> list[str]:
    """Copy every media file the samples of ``train_jsonl`` reference into ``dest/media/`` and return
    the samples as JSON lines whose paths point at the copies (``media/NAME``, relative to ``dest``)."""
    (dest / "media").mkdir(parents=True, exist_ok=True)
    lines = []
    for line in train_jsonl.read_text().splitlines():
        sample = json.loads(line)
        for msg in sample["messages"]:
            for part in msg["content"]:
                if "path" in part:
                    src = (train_jsonl.parent / part["path"]).resolve()
                    shutil.copyfile(src, dest / "media" / src.name)
                    part["path"] = f"media/{src.name}"
        lines.append(json.dumps(sample))
    return lines


def write_dataset(path: Path, n: int, lines: list[str]) -> Path:
    """Write ``n`` samples to ``path``: ``lines`` repeated round-robin (line i is ``lines[i % len]``).

    Raises ``ValueError`` when ``lines`` is empty."""
    if not lines:
        raise ValueError("write_dataset: no sample lines to repeat")
    block = "\n".join(lines) + "\n"
    whole, rest = divmod(n, len(lines))
    with open(path, "w") as f:
        f.write(block * whole)
        f.write("".join(line + "\n" for line in lines[:rest]))
    return path


# ---- one measured run -------------------------------------------------------------------------


def _proc_field(pid: int, name: str, key: str) -> int:
    """``key`` (in kB) of ``/proc/PID/NAME`` as bytes; 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (from the parent ids in ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def memory(pid: int) -> dict[str, int]:
    """Bytes now: ``rss_main`` (VmRSS of ``pid``), ``rss_tree`` (sum of VmRSS over its tree),
    ``pss_tree`` (sum of PSS over its tree), ``processes`` (the tree's size)."""
    tree = process_tree(pid)
    return {
        "rss_main": _proc_field(pid, "status", "VmRSS"),
        "rss_tree": sum(_proc_field(p, "status", "VmRSS") for p in tree),
        "pss_tree": sum(_proc_field(p, "smaps_rollup", "Pss") for p in tree),
        "processes": len(tree),
    }


def run_train(config: Path, cwd: Path, metrics: Path, timeout: float = 1800) -> dict[str, Any]:
    """Run ``omnicore train CONFIG`` to its end, polling its memory every 0.1 s; return the peaks
    (bytes), ``first_step_s`` (launch to the first line of ``metrics``), ``wall_s`` and the rows.

    Raises ``RuntimeError`` with the output's tail when the run fails or passes ``timeout`` s."""
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONWARNINGS="ignore")
    log = cwd / f"{config.stem}.log"
    with open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "omnicore", "train", str(config)], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    peak: dict[str, int] = {"rss_main": 0, "rss_tree": 0, "pss_tree": 0, "processes": 0}
    first = None
    while proc.poll() is None:
        now = memory(proc.pid)
        peak = {k: max(peak[k], now[k]) for k in peak}
        if first is None and metrics.exists() and metrics.stat().st_size > 0:
            first = time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            proc.kill()
        time.sleep(POLL_S)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or first is None:
        raise RuntimeError(f"omnicore train {config} failed (exit {proc.returncode}):\n{log.read_text()[-3000:]}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {"peak_bytes": peak, "first_step_s": first, "wall_s": wall, "rows": rows}


def write_config(path: Path, train: str, out_dir: Path, *, steps: int, workers: int, max_tokens: int) -> Path:
    """A tiny-model run config on ``train`` (see the module docstring) written to ``path``."""
    cfg = tiny_config_dict(train, output_dir=str(out_dir), max_steps=steps, log_every=1, save_every=0)
    cfg["data"].update(num_workers=workers, max_tokens=max_tokens)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# ---- the figures ------------------------------------------------------------------------------


def wait_share(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Sum of ``data_wait_s`` / sum of ``step_time_s`` over the rows of steps 2.. (step 1 holds the
    workers' start-up). Raises ``ValueError`` when there is no such row."""
    later = [r for r in rows if r["step"] >= 2]
    if not later:
        raise ValueError("wait_share: no metrics row after step 1")
    wait, step = sum(r["data_wait_s"] for r in later), sum(r["step_time_s"] for r in later)
    return {
        "share": wait / step,
        "wait_s": wait,
        "step_s": step,
        "steps": len(later),
        "max_wait_s": max(r["data_wait_s"] for r in later),
        "first_step_wait_s": rows[0]["data_wait_s"] if rows[0]["step"] == 1 else None,
    }


def scale_runs(sizes: list[int], steps: int, workers: int, tmp: Path) -> dict[str, Any]:
    """Figures a and b: one run per data-set size, and the ratios of the largest to the smallest."""
    dest = tmp / "synthetic"
    lines = media_samples(build_digits(tmp / "pool", *POOL), dest)
    runs = {}
    for n in sizes:
        t = time.perf_counter()
        data = write_dataset(dest / f"train_{n}.jsonl", n, lines)
        written = time.perf_counter() - t
        out = tmp / f"run_{n}"
        cfg = write_config(tmp / f"scale_{n}.yaml", str(data), out, steps=steps, workers=workers, max_tokens=512)
        r = run_train(cfg, tmp, out / "metrics.jsonl")
        r.pop("rows")
        runs[str(n)] = {**r, "samples": n, "file_mib": data.stat().st_size / 2**20, "write_s": written}
    lo, hi = runs[str(min(sizes))], runs[str(max(sizes))]
    ratios = {
        "peak_rss_main": hi["peak_bytes"]["rss_main"] / lo["peak_bytes"]["rss_main"],
        "peak_rss_tree": hi["peak_bytes"]["rss_tree"] / lo["peak_bytes"]["rss_tree"],
        "peak_pss_tree": hi["peak_bytes"]["pss_tree"] / lo["peak_bytes"]["pss_tree"],
        "first_step": hi["first_step_s"] / lo["first_step_s"],
    }
    return {"media_files": len(list((dest / "media").iterdir())), "pool_samples": len(lines), "runs": runs, "ratios": ratios}


def wait_runs(steps: int, workers: int, tmp: Path) -> dict[str, Any]:
    """Figure c: the data-wait share on the digits data with ``workers`` workers and with none."""
    built = DIGITS / "data" / "train.jsonl"
    train = built if built.exists() else build_digits(tmp / "digits")
    out: dict[str, Any] = {"data": str(train), "samples": sum(1 for _ in open(train))}
    for w in (workers, 0):
        run = tmp / f"wait_{w}"
        r = run_train(
            write_config(tmp / f"wait_{w}.yaml", str(train), run, steps=steps, workers=w, max_tokens=1024), tmp, run / "metrics.jsonl"
        )
        out[f"workers_{w}"] = {**wait_share(r["rows"]), "median_step_s": sorted(x["step_time_s"] for x in r["rows"])[len(r["rows"]) // 2]}
    return out


def table(res: dict[str, Any]) -> str:
    """The markdown table of the figures."""
    rows = ["| figure | measured | goal |", "|---|---|---|"]
    sc = res["scale"]
    sizes = sorted(sc["runs"], key=int)
    for n in sizes:
        r = sc["runs"][n]
        p = r["peak_bytes"]
        rows.append(
            f"| N={int(n):,}: peak RSS main / tree (PSS tree), first step | {p['rss_main'] / 2**20:.0f} / {p['rss_tree'] / 2**20:.0f} "
            f"({p['pss_tree'] / 2**20:.0f}) MiB, {r['first_step_s']:.2f} s | |"
        )
    ra, g = sc["ratios"], GOALS
    hi, lo = sizes[-1], sizes[0]
    rows.append(
        f"| peak RSS ratio {hi}/{lo}: main, tree (PSS tree) | {ra['peak_rss_main']:.3f}, {ra['peak_rss_tree']:.3f} ({ra['peak_pss_tree']:.3f}) | <= {g['peak_rss_ratio_max']} |"
    )
    rows.append(f"| first-step time ratio {hi}/{lo} | {ra['first_step']:.3f} | <= {g['first_step_ratio_max']} |")
    w = res["wait"]
    for k in sorted(k for k in w if k.startswith("workers_")):
        x = w[k]
        rows.append(
            f"| data-wait share, {k.split('_')[1]} worker(s), steps 2..{x['steps'] + 1} | {x['share']:.1%} "
            f"({x['wait_s']:.2f} of {x['step_s']:.2f} s; longest {x['max_wait_s']:.2f} s; step 1 {x['first_step_wait_s']:.2f} s) "
            f"| {'<= 5%' if k != 'workers_0' else '(reference)'} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the arguments, measure, write the JSON and print the table; returns the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller data sets (2k and 40k samples)")
    p.add_argument("--sizes", help="comma-separated sample counts (default 20000,400000; --quick 2000,40000)")
    p.add_argument("--steps", type=int, help="steps of each size run (default 30)")
    p.add_argument("--wait-steps", type=int, help="steps of each data-wait run (default 240; --quick 100)")
    p.add_argument("--workers", type=int, help="DataLoader workers with workers on (default 2)")
    p.add_argument("--out", type=Path, default=BENCH / "results" / "data_scale.json")
    a = p.parse_args(argv)
    cfg = dict(QUICK if a.quick else FULL)
    if a.sizes:
        cfg["sizes"] = [int(x) for x in a.sizes.split(",")]
    cfg.update({k: v for k, v in (("steps", a.steps), ("wait_steps", a.wait_steps), ("workers", a.workers)) if v is not None})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="data_scale_") as tmp:
        res: dict[str, Any] = {"config": cfg, "goals": GOALS, "cores": len(os.sched_getaffinity(0))}
        res["scale"] = scale_runs(cfg["sizes"], cfg["steps"], cfg["workers"], Path(tmp))
        res["wait"] = wait_runs(cfg["wait_steps"], cfg["workers"], Path(tmp))
    res["wall_s"] = time.perf_counter() - t0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2))
    print(table(res))
    print(f"wrote {a.out} ({res['wall_s']:.0f} s)")
    return res


if __name__ == "__main__":
    main()
