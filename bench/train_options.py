"""Step time and peak memory of the training options and CPU kernels, each against the plain run.

Usage::

    .venv/bin/python bench/train_options.py [--steps 12] [--warmup 4] [--max-tokens 4096] [--only a,b]

Every variant is one fresh ``omnicore train`` process (so peak RSS is its own) on the same text
samples (``bench/suite/data.py``: repo text cut to log-normal lengths), the same Qwen2 foundation
(hidden 256, 4 layers, 8 heads, MLP 768, byte tokenizer) and the same packed rows of
``--max-tokens`` tokens. Read from its ``metrics.jsonl``: the median ``step_time_s`` over the steps
after ``--warmup`` (compilation happens in those), the peak RSS (``peak_mem_mib``) and the loss of
the last step, whose relative difference from the plain run shows the option changed no numbers
(checkpointing, kernels) or few (bf16). Writes ``bench/results/train_options.json`` and prints a
table. About 6 minutes on 2 cores with the defaults.

CPU caveats: bf16 matmuls are slower than fp32 on CPUs without AMX/AVX512-BF16, and inductor's gain
on tiny blocks is small; the memory columns carry over to GPUs, the time columns less so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

LM = {
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 16384,
    "tie_word_embeddings": True,
}

VARIANTS: dict[str, list[str]] = {
    "plain": [],
    "ac_full": ["--parallel.strategies", "[{name: activation_checkpointing, options: {mode: full}}]"],
    "ac_op": ["--parallel.strategies", "[{name: activation_checkpointing, options: {mode: op}}]"],
    "ac_selective": ["--parallel.strategies", "[{name: activation_checkpointing, options: {mode: selective, every: 2}}]"],
    "compile": ["--parallel.strategies", "[compile]"],
    "bf16": ["--train.mixed_precision", "bf16"],
    "sdpa_varlen": ["--model.kernels", "{attention: sdpa_varlen}"],
    "chunked_ce": ["--model.kernels", "{cross_entropy: chunked_cross_entropy}"],
    "torch_rms_norm": ["--model.kernels", "{rmsnorm: torch_rms_norm}"],
}


def run_variant(config: Path, out: Path, extra: list[str], env: dict[str, str]) -> dict:
    """One ``omnicore train`` process; the figures from its metrics.jsonl."""
    cmd = [sys.executable, "-m", "omnicore", "train", str(config), "--run.output_dir", str(out), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(extra) or 'plain'} failed:\n{r.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4, help="steps left out of the median (compilation happens here)")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants (plain always runs)")
    ap.add_argument("--out", default=str(BENCH / "results" / "train_options.json"))
    args = ap.parse_args(argv)
    from suite.data import text_samples, write_jsonl

    names = ["plain"] + [n for n in args.only.split(",") if n and n != "plain"]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)))
    results: dict = {"lm": LM, "max_tokens": args.max_tokens, "steps": args.steps, "warmup": args.warmup, "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        n = args.steps * args.max_tokens // 150 + 64
        data = write_jsonl(text_samples(n, 0, args.max_tokens), tmp / "text.jsonl")
        config = tmp / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "run": {"seed": 0},
                    "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": LM}}},
                    "data": {"train": str(data), "max_tokens": args.max_tokens},
                    "train": {"max_steps": args.steps, "warmup_steps": 2, "lr": 1e-3, "progress": False, "export": False},
                }
            )
        )
        for name in names:
            rows = run_variant(config, tmp / name, VARIANTS[name], env)
            timed = rows[args.warmup :] or rows
            results["variants"][name] = {
                "args": VARIANTS[name],
                "median_step_s": statistics.median(r["step_time_s"] for r in timed),
                "peak_mem_mib": max(r["peak_mem_mib"] for r in rows),
                "final_loss": rows[-1]["loss"],
                "tokens_per_step": statistics.mean(r["tokens"] for r in rows),
            }
            print(
                f"{name}: {results['variants'][name]['median_step_s'] * 1e3:.0f} ms/step, {results['variants'][name]['peak_mem_mib']:.0f} MiB",
                flush=True,
            )
    base = results["variants"]["plain"]
    lines = ["| variant | ms/step | x plain | peak RSS MiB | x plain | final loss rel diff |", "|---|---|---|---|---|---|"]
    for name, v in results["variants"].items():
        v["time_ratio"] = v["median_step_s"] / base["median_step_s"]
        v["mem_ratio"] = v["peak_mem_mib"] / base["peak_mem_mib"]
        v["loss_rel_diff"] = abs(v["final_loss"] - base["final_loss"]) / base["final_loss"]
        lines.append(
            f"| {name} | {v['median_step_s'] * 1e3:.0f} | {v['time_ratio']:.2f} | {v['peak_mem_mib']:.0f} | {v['mem_ratio']:.2f} | {v['loss_rel_diff']:.1e} |"
        )
    table = "\n".join(lines)
    results["table"] = table
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(table)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
