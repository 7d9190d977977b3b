"""``omnicore plugins`` start-up vs ``python -c pass``: the functions of ``bench/plugins_startup.py``
(fresh subprocesses, interleaved, after untimed warm-up runs), summarised for the suite. The ratio
is of medians (the standalone script also reports the ratio of minima)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for plugins_startup

import plugins_startup  # noqa: E402


def measure(runs: int, warmup: int) -> dict[str, Any]:
    """Median and best wall times (milliseconds) of both commands and their ratios."""
    cmds = plugins_startup.startup_commands()
    cmds = {k: cmds[k] for k in ("python -c pass", "omnicore plugins")}
    times = plugins_startup.interleaved(cmds, plugins_startup.clean_env(), runs, warmup)
    base, plug = times["python -c pass"], times["omnicore plugins"]
    return {
        "python_c_pass_median_ms": statistics.median(base) * 1e3,
        "omnicore_plugins_median_ms": statistics.median(plug) * 1e3,
        "ratio": statistics.median(plug) / statistics.median(base),
        "ratio_best": min(plug) / min(base),
        "runs": runs,
        "warmup": warmup,
        "goal_ratio_max": plugins_startup.GOAL,
    }
