"""The CPU benchmark suite (issue #5): one command, each figure a ratio measured in the same run.

Usage::

    .venv/bin/python bench/run.py [--quick] [--out-dir bench/results] [--only overhead,trainer,waste,startup]

Figures (methods in ``bench/README.md`` and the docstrings of ``bench/suite/*.py``):

a. ``overhead``: omnicore's training step time / a hand-written PyTorch + transformers loop's, same
   model, weights, packed rows, optimizer, schedule and loss (goal <= 1.03).
b. ``trainer``: real (non-pad) tokens/s of omnicore's packed training / the Hugging Face Trainer's
   with a pad-to-longest collator (goal >= 1.5), and / the Trainer's with
   ``DataCollatorWithFlattening`` (padding-free).
c. ``waste``: the fraction of computed positions that are padding, pad-to-longest vs omnicore's
   packing, and packing's budget fill waste (goal <= 2%), on text samples with documented lengths
   and on the digits samples when their data is built.
d. ``startup``: ``omnicore plugins`` start-up / ``python -c pass`` (goal <= 3, issue #23).

Writes ``bench/results/suite.json`` (every figure with its raw measurements, the config, the
machine and the suite's wall time) and ``bench/results/suite.md`` (the table, also printed).
About 5-10 minutes on 2 cores; ``--quick`` is a ~1-minute smoke with small sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

FULL = {
    "seed": 0,
    "max_tokens": 2048,
    "overhead": {"samples": 240, "steps": 10, "warmup": 2, "repeats": 6},
    "trainer": {"samples": 160, "warmup": 2, "repeats": 5},
    "waste": {"text_samples": 2000, "digits_samples": None},
    "startup": {"runs": 10, "warmup": 2},
}
QUICK = {
    "seed": 0,
    "max_tokens": 2048,
    "overhead": {"samples": 40, "steps": 4, "warmup": 1, "repeats": 1},
    "trainer": {"samples": 40, "warmup": 1, "repeats": 1},
    "waste": {"text_samples": 400, "digits_samples": 300},
    "startup": {"runs": 3, "warmup": 1},
}
FIGURES = ("overhead", "trainer", "waste", "startup")


def machine() -> dict[str, Any]:
    """Cores, CPU model, Python and library versions, torch's intra-op threads."""
    import torch
    import transformers

    cpu = ""
    try:
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")), ""
        )
    except OSError:
        pass
    try:
        import accelerate

        acc = accelerate.__version__
    except ImportError:
        acc = None
    return {
        "cpu_count": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": cpu or platform.processor(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": acc,
    }


def text_lengths(path: Path, cfg: dict[str, Any]) -> list[int]:
    from suite import overhead

    samples, _ = overhead.encode(overhead.config_dict(str(path), "unused", max_tokens=cfg["max_tokens"], max_steps=1, seed=cfg["seed"]))
    return [len(s) for s in samples]


def fig_waste(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    from suite import data, waste

    c = cfg["waste"]
    path = data.write_jsonl(data.text_samples(c["text_samples"], cfg["seed"], cfg["max_tokens"]), tmp / "waste_text.jsonl")
    lengths = text_lengths(path, cfg)
    out: dict[str, Any] = {
        "text": {
            "lengths": data.length_stats(lengths),
            "corpus": data.corpus_info(),
            **waste.compare(lengths, cfg["max_tokens"], cfg["seed"]),
        }
    }
    dig = data.digits_lengths(c["digits_samples"])
    if dig is None:
        out["digits"] = {"skipped": f"{data.DIGITS_TRAIN} not built (bash examples/digits/run.sh builds it)"}
    else:
        lens, budget = dig
        out["digits"] = {
            "lengths": data.length_stats(lens),
            "source": str(data.DIGITS_TRAIN.relative_to(ROOT)),
            **waste.compare(lens, budget, cfg["seed"]),
        }
    out["goal_budget_fill_waste_max"] = 0.02
    return out


def fig_overhead(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    from suite import data, overhead

    c = cfg["overhead"]
    path = data.write_jsonl(data.text_samples(c["samples"], cfg["seed"], cfg["max_tokens"]), tmp / "overhead.jsonl")
    r = overhead.measure(
        str(path), max_tokens=cfg["max_tokens"], steps=c["steps"], warmup=c["warmup"], repeats=c["repeats"], seed=cfg["seed"]
    )
    r["lm"] = overhead.LM
    return r


def fig_trainer(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    try:
        import accelerate  # noqa: F401
    except ImportError:
        return {"skipped": "needs accelerate (pip install -e '.[bench]'; scripts/setup.sh installs it)"}
    from suite import data, hf_trainer, overhead

    c = cfg["trainer"]
    path = data.write_jsonl(data.text_samples(c["samples"], cfg["seed"], cfg["max_tokens"]), tmp / "trainer.jsonl")
    r = hf_trainer.measure(str(path), max_tokens=cfg["max_tokens"], repeats=c["repeats"], warmup=c["warmup"], seed=cfg["seed"])
    r["lm"] = overhead.LM
    return r


def fig_startup(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    from suite import startup

    return startup.measure(cfg["startup"]["runs"], cfg["startup"]["warmup"])


def _ok(value: float, goal: float, at_most: bool) -> str:
    return "yes" if (value <= goal if at_most else value >= goal) else "no"


def table(res: dict[str, Any]) -> str:
    """The markdown table of the headline figures."""
    f = res["figures"]
    rows = [("figure", "measured", "goal", "met", "detail"), ("---",) * 5]
    o = f.get("overhead")
    if o and "ratio" in o:
        rows.append(
            (
                "a. step time, omnicore / hand-written loop",
                f"{o['ratio']:.3f}x",
                "<= 1.03x",
                _ok(o["ratio"], 1.03, True),
                f"median of {o['repeats']} pair ratios; step medians {o['omnicore_median_ms']:.0f} / {o['handwritten_median_ms']:.0f} ms, "
                f"{o['tokens_per_row_mean']:.0f} tokens per row, {len(o['omnicore_step_ms'])} steps each; max loss diff {o['max_loss_diff']:.1e}",
            )
        )
    t = f.get("trainer")
    if t and "ratio_vs_padded" in t:
        tp = t["tokens_per_s"]
        pad = t["runs"]["trainer_padded"][0]
        rows.append(
            (
                "b. real tokens/s, omnicore packed / Trainer pad-to-longest",
                f"{t['ratio_vs_padded']:.2f}x",
                ">= 1.5x",
                _ok(t["ratio_vs_padded"], 1.5, False),
                f"median of {t['repeats']} repeat ratios; {tp['omnicore']:.0f} vs {tp['trainer_padded']:.0f} tok/s (medians); Trainer batch {pad['batch_size']}, padding {pad['padding_waste']:.1%} of positions",
            )
        )
        flat = t["runs"]["trainer_flattening"][0]
        att = t["omnicore_attention"]
        rows[-1] = (rows[-1][0].replace("omnicore packed", f"omnicore packed ({att})"),) + rows[-1][1:]
        rows.append(
            (
                f"b. real tokens/s, omnicore packed ({att}) / Trainer + DataCollatorWithFlattening",
                f"{t['ratio_vs_flattening']:.2f}x",
                "(baseline)",
                "-",
                f"{tp['omnicore']:.0f} vs {tp['trainer_flattening']:.0f} tok/s; Trainer batch {flat['batch_size']}, no padding",
            )
        )
        if att != "sdpa":
            rows.append(
                (
                    "b. real tokens/s, omnicore packed (sdpa) / Trainer pad-to-longest",
                    f"{t['ratio_sdpa_vs_padded']:.2f}x",
                    "(same attention as Trainer)",
                    "-",
                    f"{tp['omnicore_sdpa']:.0f} tok/s; / Trainer + flattening {t['ratio_sdpa_vs_flattening']:.2f}x; sdpa_varlen / sdpa {t['ratio_varlen_vs_sdpa']:.2f}x",
                )
            )
    elif t:
        rows.append(("b. Trainer comparison", "skipped", ">= 1.5x", "-", t.get("skipped", "")))
    w = f.get("waste")
    if w:
        for name in ("text", "digits"):
            d = w.get(name, {})
            if "packed" not in d:
                if d:
                    rows.append((f"c. padding waste ({name})", "skipped", "", "-", d.get("skipped", "")))
                continue
            p, q = d["pad_to_longest"], d["packed"]
            rows.append(
                (
                    f"c. padding waste ({name}), pad-to-longest",
                    f"{p['waste']:.1%}",
                    "",
                    "-",
                    f"batch {p['batch_size']}, mean {p['mean_batch_tokens']:.0f} positions per batch; lengths median {d['lengths']['median']}, p90 {d['lengths']['p90']}, max {d['lengths']['max']}",
                )
            )
            rows.append(
                (
                    f"c. padding waste ({name}), omnicore packed",
                    f"{q['waste']:.1%}",
                    "",
                    "-",
                    f"{q['rows']} rows of <= {q['max_tokens']} tokens, not padded",
                )
            )
            rows.append(
                (
                    f"c. budget fill waste ({name}), omnicore packed (first_fit, the default)",
                    f"{q['budget_fill_waste']:.2%}",
                    "<= 2%",
                    _ok(q["budget_fill_waste"], 0.02, True),
                    f"1 - real / (rows x {q['max_tokens']})",
                )
            )
            if "packed_ffd" in d:
                r = d["packed_ffd"]
                rows.append(
                    (
                        f"c. budget fill waste ({name}), omnicore packed (data.packing: ffd)",
                        f"{r['budget_fill_waste']:.2%}",
                        "<= 2%",
                        _ok(r["budget_fill_waste"], 0.02, True),
                        f"{r['rows']} rows; first-fit decreasing per window of {r['window']} samples",
                    )
                )
    s = f.get("startup")
    if s:
        rows.append(
            (
                "d. start-up, omnicore plugins / python -c pass",
                f"{s['ratio']:.2f}x",
                f"<= {s['goal_ratio_max']:g}x",
                _ok(s["ratio"], s["goal_ratio_max"], True),
                f"medians {s['omnicore_plugins_median_ms']:.0f} / {s['python_c_pass_median_ms']:.0f} ms, {s['runs']} runs each",
            )
        )
    m = res["machine"]
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    foot = (
        f"\n{res['mode']} run, {res['wall_s']:.0f} s wall; {m['cores_usable']} cores ({m['cpu_model']}), torch {m['torch']} "
        f"({m['torch_threads']} threads), transformers {m['transformers']}, accelerate {m['accelerate']}.\n"
    )
    return "\n".join(lines) + "\n" + foot


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a ~1-minute smoke with small sizes")
    ap.add_argument("--out-dir", default=str(BENCH / "results"))
    ap.add_argument("--only", default=",".join(FIGURES), help=f"comma-separated subset of {','.join(FIGURES)}")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()

    cfg = QUICK if args.quick else FULL
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    bad = [x for x in only if x not in FIGURES]
    if bad:
        ap.error(f"--only: unknown figure(s) {bad}; choose from {FIGURES}")
    t0 = time.perf_counter()
    res: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "config": cfg,
        "machine": machine(),
        "figures": {},
        "figure_wall_s": {},
    }
    runners = {"waste": fig_waste, "overhead": fig_overhead, "trainer": fig_trainer, "startup": fig_startup}
    with tempfile.TemporaryDirectory(prefix="omnicore-suite-") as tmp:
        for name in FIGURES:
            if name not in only:
                continue
            t = time.perf_counter()
            print(f"[{name}] ...", flush=True)
            res["figures"][name] = runners[name](cfg, Path(tmp))
            res["figure_wall_s"][name] = round(time.perf_counter() - t, 1)
            print(f"[{name}] {res['figure_wall_s'][name]:.0f} s", flush=True)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = table(res)
    (out / "suite.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "suite.md").write_text("# omnicore CPU benchmark suite\n\n" + md)
    print(md)
    print(f"wrote {out / 'suite.json'} and {out / 'suite.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
