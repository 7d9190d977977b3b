"""Start-up cost of ``omnicore plugins`` against a bare ``python -c pass`` (issue #23: within 3x).

Runs each command ``--runs`` times in fresh subprocesses, interleaved (so that load on a shared
machine hits both alike), after ``--warmup`` untimed runs that fill the OS and bytecode caches.
Checks that every first-party plugin is installed and listed as available, and that the listing
imports no torch (``python -X importtime``). Writes ``bench/results/plugins_startup.json`` and
prints a short table. The goal is checked on the ratio of medians (as ``bench/run.py``'s figure d);
the ratio of the best (minimum) times is reported alongside.

Bytecode: the commands run with ``PYTHONDONTWRITEBYTECODE`` removed and ``PYTHONPYCACHEPREFIX``
set to ``bench/results/pycache``, so that the warm-up leaves ``.pyc`` files, as an installed package
has them (pip compiles on install). An environment that sets ``PYTHONDONTWRITEBYTECODE=1`` would
otherwise make every timed run compile omnicore's and the plugins' sources again.
``--no-bytecode`` measures that case: ``PYTHONDONTWRITEBYTECODE=1`` for both commands.

Usage::

    .venv/bin/python bench/plugins_startup.py [--runs 20] [--warmup 3] [--no-bytecode]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

FIRST_PARTY = ("omnicore-audio-whisper", "omnicore-image-movqgan", "omnicore-image-siglip")
HEAVY = ("torch", "transformers", "diffusers")
ROOT = Path(__file__).resolve().parents[1]
GOAL = 3.0
"""``omnicore plugins`` within this many times ``python -c pass`` (ratio of medians; issue #23)."""


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def clean_env(bytecode: bool = True) -> dict[str, str]:
    """This process's environment without ``OMNICORE_*`` variables (no allow/disable lists).

    ``bytecode``: ``.pyc`` files are written and read (under ``bench/results/pycache``, so the
    checkout gets no ``__pycache__`` folders); False: none are (``PYTHONDONTWRITEBYTECODE=1``).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNICORE_")}
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(ROOT / "bench" / "results" / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def startup_commands() -> dict[str, list[str]]:
    """The timed commands by name: the baseline ``python -c pass`` first, then the listing."""
    script = Path(sys.executable).parent / "omnicore"
    script_cmd = [str(script)] if script.is_file() else [shutil.which("omnicore") or "omnicore"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "omnicore plugins": script_cmd + ["plugins"],
        "python -m omnicore plugins": [sys.executable, "-m", "omnicore", "plugins"],
    }


def interleaved(commands: dict[str, list[str]], env: dict[str, str], runs: int, warmup: int) -> dict[str, list[float]]:
    """Wall seconds of each command over ``runs`` interleaved rounds, after ``warmup`` untimed ones."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(warmup):
        for cmd in commands.values():
            timed(cmd, env)
    for _ in range(runs):
        for name, cmd in commands.items():
            times[name].append(timed(cmd, env))
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "plugins_startup.json"))
    ap.add_argument("--no-bytecode", action="store_true", help="PYTHONDONTWRITEBYTECODE=1: every run compiles the sources")
    args = ap.parse_args()

    env = clean_env(bytecode=not args.no_bytecode)
    commands = startup_commands()
    script_cmd = commands["omnicore plugins"][:-1]

    listing = json.loads(subprocess.run(script_cmd + ["plugins", "--json"], env=env, check=True, capture_output=True, text=True).stdout)
    available = sorted({r["provider"] for r in listing if r["status"] == "available"})
    missing = [d for d in FIRST_PARTY if d not in available]
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "omnicore", "plugins"], env=env, capture_output=True, text=True, check=True
    ).stderr
    imported = {ln.split("|")[-1].strip() for ln in trace.splitlines() if ln.startswith("import time:")}
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY)

    times = interleaved(commands, env, args.runs, args.warmup)

    base_best, base_med = min(times["python -c pass"]), statistics.median(times["python -c pass"])
    result = {
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "runs": args.runs,
        "first_party_installed_and_available": not missing,
        "missing_first_party": missing,
        "providers_available": available,
        "torch_imported": bool(heavy),
        "heavy_modules_imported": heavy,
        "bytecode": not args.no_bytecode,
        "goal_ratio": GOAL,
        "commands": {},
    }
    print(f"{'command':<28} {'best ms':>8} {'median ms':>10} {'ratio best':>11} {'ratio median':>13}")
    for name, ts in times.items():
        best, med = min(ts), statistics.median(ts)
        result["commands"][name] = {
            "argv": commands[name],
            "best_ms": round(best * 1e3, 1),
            "median_ms": round(med * 1e3, 1),
            "ratio_best": round(best / base_best, 2),
            "ratio_median": round(med / base_med, 2),
        }
        print(f"{name:<28} {best * 1e3:8.1f} {med * 1e3:10.1f} {best / base_best:11.2f} {med / base_med:13.2f}")
    ratio = result["commands"]["omnicore plugins"]["ratio_median"]
    result["within_goal"] = ratio <= GOAL and not heavy and not missing
    print(
        f"omnicore plugins: {ratio:.2f}x python -c pass, medians (goal <= {GOAL:g}x); torch imported: {bool(heavy)}; "
        f"first-party plugins listed: {not missing}; bytecode: {not args.no_bytecode}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if result["within_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
