"""Batched eval against one prompt at a time on the digits held-out set: seconds per sample of each.

    .venv/bin/python bench/eval_speed.py [--config examples/digits/config.yaml] [--export runs/digits/export]
                                         [--limit 160] [--batch-size 16]

Loads the trained export once (``bash examples/digits/run.sh`` makes it), takes the first
``--limit`` held-out samples with a text answer (0: all 800), and scores them twice with
:func:`omnicore.eval.scoring.score_samples`: ``generate.batch_size: 1`` (one prompt per forward, as
``omnicore eval`` ran before batching) and ``--batch-size`` (left-padded, KV-cached batches in order
of prompt length). Both on ``run.device`` (CPU here). Reports seconds per sample, the speed-up, each
accuracy, and how many answers the two runs share (greedy answers should all agree). Model loading
and the held-out loss are not timed. Writes ``bench/results/eval_speed.json``. Timings count only on
a quiet machine (see ``../shared/CPU-NOTES.md``: one heavy job at a time).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    import torch

    from omnicore.config import load_config
    from omnicore.data.jsonl import read_jsonl
    from omnicore.eval.loading import eval_device, load_trained
    from omnicore.eval.scoring import _answer, score_samples

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "digits" / "config.yaml"))
    ap.add_argument("--export", default=str(ROOT / "runs" / "digits" / "export"))
    ap.add_argument("--limit", type=int, default=160, help="first N held-out samples (0: all)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "eval_speed.json"))
    a = ap.parse_args(argv)
    cfg = load_config(a.config, [])
    model, tokenizer, processor = load_trained(cfg, export=a.export)
    model.to(eval_device(cfg))
    samples = [s for s in read_jsonl(cfg.resolve_path(cfg.data.eval or "")) if _answer(s) is not None]
    samples = samples[: a.limit] if a.limit else samples
    runs = {}
    for size in (1, a.batch_size):
        c = cfg.model_copy(update={"generate": cfg.generate.model_copy(update={"batch_size": size})})
        summary, rows = score_samples(c, model, tokenizer, processor, samples, progress=False)
        runs[size] = (summary, [r["answer"] for r in rows])
        print(f"batch {size:3d}: {summary['seconds_per_sample']:.4f} s/sample, accuracy {summary['accuracy']:.3f}", flush=True)
    (one, one_ans), (many, many_ans) = runs[1], runs[a.batch_size]
    result = {
        "samples": len(samples),
        "device": one["device"],
        "threads": torch.get_num_threads(),
        "batch_size": a.batch_size,
        "one_at_a_time_s_per_sample": one["seconds_per_sample"],
        "batched_s_per_sample": many["seconds_per_sample"],
        "speedup": one["seconds_per_sample"] / many["seconds_per_sample"],
        "accuracy_one_at_a_time": one["accuracy"],
        "accuracy_batched": many["accuracy"],
        "same_answers": sum(x == y for x, y in zip(one_ans, many_ans)),
        "export": a.export,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
