"""Longest sequence that trains within a fixed per-rank memory (peak RSS), SP=1 vs SP=2 (Ulysses), on
2 processes.

What one trial is: 2 fresh gloo processes (``omnicore.testing.distributed.run_distributed``), each
builds the real :class:`~omnicore.model.omni.OmniModel` through the registry (``hf_causal_lm``
foundation: Qwen2, hidden 256, 4 heads, 2 KV heads, 2 layers, intermediate 512, byte tokenizer,
attention kernel ``--attention``, default ``sdpa``), applies the configured parallel strategies with
``init_parallel_state`` + ``build_strategies`` + ``parallelize`` (as ``omnicore train`` does), and
runs one training step (forward, backward of ``loss_sum / targets``, AdamW step) on one text-only
packed row of ``T`` tokens (``--samples`` packed samples, position_ids restarting per sample).
Peak RSS per rank is ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` at the end of the step; the
"baseline" is the same counter just before the step (after imports, model build, strategies).

The two layouts, both on 2 processes so that gloo, imports and process overheads are equal:

* ``sp1``: ``parallel: {dp_shard: 2, strategies: [fsdp2]}``. Each rank holds the *full* row of
  length ``T`` (its own row, as in data parallel); FSDP2 only shards the (tiny) parameters, which
  changes a few MiB and nothing that grows with ``T``. This is what SP=1 means in a real 2-process
  run, rather than 1 process, whose baseline (no gloo group, no second process) would differ.
* ``sp2``: ``parallel: {sp: 2, dp_shard: 1, strategies: [ulysses]}``. Both ranks read the same row;
  each keeps ``T/2`` tokens outside attention.

Budget: the fixed per-rank budget is ``baseline + --budget-mib`` where ``baseline`` is the largest
pre-step RSS seen over both layouts and both ranks in the first trials (at ``--start-len``), or
``--budget-total-mib`` when given (to compare kernels at the same absolute budget); a trial "fits"
when the larger of the two ranks' peak RSS is within it. Search per layout: double from
``--start-len`` until a trial does not fit (or ``--max-len`` is passed), then ``--bisect`` bisection
steps on the length, rounded to ``--step`` tokens. Every trial runs in fresh processes, so each
peak is clean.

Usage::

    .venv/bin/python bench/sp_memory.py [--budget-mib 512] [--start-len 1024] [--max-len 65536]
                                        [--bisect 3] [--step 256] [--samples 4]
                                        [--attention sdpa|sdpa_varlen|eager] [--budget-total-mib M]

``--attention`` is the foundation's kernel (``model.kernels.attention``) in both layouts; under Ulysses a
varlen kernel (``sdpa_varlen``) stays the core on the full sequence (given the global position_ids,
no mask), while ``sdpa`` or ``eager`` make Ulysses use sdpa with a dense packed mask.

Writes ``bench/results/sp_memory.json`` (``sp_memory_<attention>.json`` for another kernel: every
trial: length, baseline and peak RSS per rank, step time, fits; the longest fitting length per
layout; the ratio sp2/sp1) and prints a table. Figures, not assertions.

Caveats:

* With ``sdpa`` (the default), attention memory is O(T^2), and on CPU that term is mostly the
  *mask*, not the scores. A packed row needs a dense boolean ``[T, T]`` mask (the Ulysses
  attention function builds one per layer from the global position_ids; transformers' sdpa mask
  does the same for a packed row with SP=1). Measured with torch 2.13 on CPU: sdpa forward+backward with a boolean mask at T=4096 adds
  ~120 MiB with 4 heads and ~112 MiB with 2 (vs ~42/32 MiB with ``is_causal`` and no mask, and
  256/128 MiB if fp32 scores were materialised): the CPU flash kernel keeps scores blocked, but the
  mask (as bool and as an fp32 additive copy, ~5 bytes per element) is per rank and per layer.
  Without a flash/varlen kernel that takes sample boundaries instead of a mask, the quadratic term
  dominates from a few thousand tokens on, so the SP=2/SP=1 ratio is well under 2 and shrinks as
  the budget grows. ``--attention sdpa_varlen`` is that kernel: per-sample SDPA, no mask, memory
  linear in ``T`` (see bench/README.md for the figures).
* Ulysses divides the activations by SP *outside* attention (embeddings, MLP, norms, logits and
  loss see ``T/SP`` tokens), but attention itself sees the *full* sequence with ``heads/SP`` heads
  per rank: anything per head is halved, while the ``[T, T]`` mask is not divided at all. So the
  gain is at most SP x, and much less where the mask dominates.
* Peak RSS counts everything the process touched (allocator caches, gloo buffers, the Python heap);
  glibc may keep freed memory, so a few MiB of noise between runs is normal. The machine is shared;
  RSS is not affected by load, but step times are.
* One step, fp32, batch of one row, no activation checkpointing; real runs with checkpointing or a
  flash kernel shift the numbers (not the direction).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LM = {
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1 << 20,
}
LAYOUTS = {
    "sp1": {"dp_shard": 2, "strategies": ["fsdp2"]},
    "sp2": {"sp": 2, "dp_shard": 1, "strategies": ["ulysses"]},
}


def _config(layout: str, attention: str):
    from omnicore.config import Config

    return Config.model_validate(
        {
            "run": {"seed": 0, "device": "cpu"},
            "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": dict(LM)}}, "kernels": {"attention": attention}},
            "data": {"train": "unused.jsonl"},
            "parallel": LAYOUTS[layout],
        }
    )


def _rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rank_trial(layout: str, length: int, samples: int, attention: str) -> dict:
    import gc

    import torch
    import torch.distributed as dist

    from omnicore.data.packing import MicroBatch
    from omnicore.model.build import build_omni_model
    from omnicore.parallel.parallelize import build_strategies, parallelize
    from omnicore.parallel.state import init_parallel_state
    from omnicore.registry import registry_for

    cfg = _config(layout, attention)
    state = init_parallel_state("cpu", "gloo", cfg.parallel)
    model, _ = build_omni_model(cfg)
    model = parallelize(model, state, build_strategies(cfg.parallel, registry_for(cfg), True))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # one text-only packed row: `samples` samples, labels shifted within each (as omnicore's data side does)
    seed = 1 if layout == "sp2" else 1 + dist.get_rank()  # SP ranks read the same row; DP ranks their own
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (length,), generator=g)
    labels = torch.full_like(ids, -100)
    pos = []
    bounds = [length * i // samples for i in range(samples + 1)]
    for a, b in zip(bounds, bounds[1:]):
        labels[a : b - 1] = ids[a + 1 : b]
        pos.append(torch.arange(b - a))
    batch = MicroBatch(ids[None], labels[None], torch.cat(pos)[None])
    n_targets = int((labels != -100).sum())
    gc.collect()
    dist.barrier()
    base = _rss_mib()
    t0 = time.perf_counter()
    out = model(batch)
    (out.loss_sum / n_targets).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    step_s = time.perf_counter() - t0
    peak = _rss_mib()
    return {
        "baseline_mib": round(base, 1),
        "peak_mib": round(peak, 1),
        "step_s": round(step_s, 3),
        "loss": float(out.loss_sum.detach()) / n_targets,
    }


class Search:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.trials: list[dict] = []

    def run(self, layout: str, length: int) -> dict:
        from omnicore.testing.distributed import DistributedTestError, run_distributed

        t0 = time.perf_counter()
        try:
            ranks = run_distributed(rank_trial, 2, args=(layout, length, self.a.samples, self.a.attention), timeout=self.a.trial_timeout)
            err = None
        except DistributedTestError as e:  # killed (out of memory) or timed out: does not fit
            ranks, err = None, str(e).splitlines()[0]
        row = {"layout": layout, "length": length, "wall_s": round(time.perf_counter() - t0, 1)}
        if ranks:
            row.update(
                baseline_mib=[r["baseline_mib"] for r in ranks],
                peak_mib=[r["peak_mib"] for r in ranks],
                step_s=max(r["step_s"] for r in ranks),
                loss=round(ranks[0]["loss"], 4),
            )
        else:
            row["error"] = err
        self.trials.append(row)
        return row

    def fits(self, row: dict, budget: float) -> bool:
        ok = "peak_mib" in row and max(row["peak_mib"]) <= budget
        row["fits"] = ok
        self._print(row, budget)
        return ok

    @staticmethod
    def _print(row: dict, budget: float) -> None:
        peak = "/".join(f"{p:.0f}" for p in row.get("peak_mib", [])) or row.get("error", "?")
        print(
            f"  {row['layout']} T={row['length']:>6}  peak RSS {peak} MiB (budget {budget:.0f})  {'fits' if row['fits'] else 'over'}  [{row['wall_s']} s]",
            flush=True,
        )

    def longest(self, layout: str, first: dict, budget: float) -> int:
        a = self.a
        if not self.fits(first, budget):
            return 0
        ok, bad = first["length"], None
        while ok * 2 <= a.max_len:
            n = ok * 2
            if self.fits(self.run(layout, n), budget):
                ok = n
            else:
                bad = n
                break
        for _ in range(a.bisect if bad else 0):
            mid = (ok + bad) // 2 // a.step * a.step
            if mid <= ok or mid >= bad:
                break
            if self.fits(self.run(layout, mid), budget):
                ok = mid
            else:
                bad = mid
        return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-mib", type=float, default=512, help="per-rank budget above the baseline RSS")
    p.add_argument("--start-len", type=int, default=1024)
    p.add_argument("--max-len", type=int, default=65536)
    p.add_argument("--bisect", type=int, default=3, help="bisection steps after the doubling")
    p.add_argument("--step", type=int, default=256, help="lengths tried in bisection are multiples of this")
    p.add_argument("--samples", type=int, default=4, help="packed samples in the row")
    p.add_argument(
        "--attention",
        default="sdpa",
        help="foundation attention kernel (model.kernels.attention); under Ulysses a varlen one (sdpa_varlen) stays the core, else sdpa with a dense mask",
    )
    p.add_argument("--budget-total-mib", type=float, default=None, help="absolute per-rank budget (overrides baseline + --budget-mib)")
    p.add_argument("--trial-timeout", type=float, default=120)
    p.add_argument("--out", default=None, help="default: bench/results/sp_memory.json (sdpa) or sp_memory_<attention>.json")
    a = p.parse_args()
    if a.out is None:
        a.out = str(ROOT / "bench" / "results" / ("sp_memory.json" if a.attention == "sdpa" else f"sp_memory_{a.attention}.json"))

    t0 = time.perf_counter()
    s = Search(a)
    print(
        f"SP memory: 2 processes, Qwen2 hidden {LM['hidden_size']}, {LM['num_attention_heads']} heads, {LM['num_hidden_layers']} layers, {a.samples} packed samples, {a.attention}",
        flush=True,
    )
    first = {lay: s.run(lay, a.start_len) for lay in LAYOUTS}
    bases = [b for r in first.values() for b in r.get("baseline_mib", [])]
    if not bases:
        raise SystemExit(f"the first trials failed: {[r.get('error') for r in first.values()]}")
    baseline = max(bases)
    budget = a.budget_total_mib if a.budget_total_mib is not None else baseline + a.budget_mib
    longest = {lay: s.longest(lay, first[lay], budget) for lay in LAYOUTS}
    ratio = round(longest["sp2"] / longest["sp1"], 3) if longest["sp1"] else None
    capped = {lay: longest[lay] * 2 > a.max_len for lay in LAYOUTS}
    result = {
        "what": "longest packed text row that completes one training step (fwd+bwd+AdamW) within a per-rank peak-RSS budget, 2 gloo processes",
        "layouts": LAYOUTS,
        "foundation": LM,
        "attention": a.attention,
        "samples": a.samples,
        "baseline_mib": baseline,
        "budget_mib": round(budget, 1),
        "budget_above_baseline_mib": round(budget - baseline, 1),
        "search": {"start_len": a.start_len, "max_len": a.max_len, "bisect": a.bisect, "step": a.step},
        "trials": s.trials,
        "longest": longest,
        "capped_by_max_len": capped,
        "ratio_sp2_over_sp1": ratio,
        "wall_s": round(time.perf_counter() - t0, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nbudget {budget:.0f} MiB per rank (baseline {baseline:.0f} + {budget - baseline:.0f})")
    print(f"{'layout':<6} {'T':>7} {'peak r0':>8} {'peak r1':>8} {'step s':>7} {'fits':>5}")
    for r in s.trials:
        pk = r.get("peak_mib", ["-", "-"])
        print(
            f"{r['layout']:<6} {r['length']:>7} {pk[0]!s:>8} {pk[1]!s:>8} {r.get('step_s', '-')!s:>7} {('yes' if r.get('fits') else 'no'):>5}"
        )
    for lay in LAYOUTS:
        print(f"longest {lay}: {longest[lay]}{' (capped by --max-len)' if capped[lay] else ''}")
    print(f"ratio sp2/sp1: {ratio}   ({result['wall_s']} s)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
