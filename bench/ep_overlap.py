"""Step time of one expert-parallel MoE layer with and without COMET-style overlap, on 2 processes.

The layer is an unmodified transformers ``Qwen3MoeSparseMoeBlock`` (router + experts); EP 2 splits
its experts over the two ranks. Each rank runs forward + backward on its own tokens. Compared:

* ``ep``: plain EP (dispatch all-to-all, experts, combine all-to-all, one after another);
* ``comet_ep`` with 2 and 4 chunks: the all-to-alls of one chunk overlap the experts of another
  (forward and backward).

Usage::

    .venv/bin/python bench/ep_overlap.py [--tokens 4096] [--hidden 256] [--inter 512] [--experts 8]
                                         [--steps 8] [--threads 1]

Writes ``bench/results/ep_overlap.json`` and prints a table (median step time over ``--steps``
after 2 warm-up steps, the slower rank's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rank_run(args: dict, mode: str, chunks: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.set_num_threads(args["threads"])
    cfg = Qwen3MoeConfig(
        hidden_size=args["hidden"],
        moe_intermediate_size=args["inter"],
        num_experts=args["experts"],
        num_experts_per_tok=2,
        norm_topk_prob=True,
    )
    cfg._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    block = torch.nn.Module()
    block.mlp = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        block.mlp.gate.weight.normal_(0, 0.5)
        block.mlp.experts.gate_up_proj.normal_(0, 0.05)
        block.mlp.experts.down_proj.normal_(0, 0.05)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("ep",))
    if mode == "comet_ep":
        from omnicore_parallel_comet.strategy import CometExpertParallel

        CometExpertParallel({"chunks": chunks, "plan": {"mlp.experts.*_proj": "Shard(0)"}}).apply(block, mesh)
    else:
        from omnicore.parallel.expert import ExpertParallel

        ExpertParallel({"plan": {"mlp.experts.*_proj": "Shard(0)"}}).apply(block, mesh)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    x = torch.randn(1, args["tokens"], args["hidden"], generator=g).requires_grad_(True)
    times = []
    for _ in range(args["steps"] + 2):
        dist.barrier()
        t0 = time.perf_counter()
        y = block.mlp(x)
        y.square().mean().backward()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times[2:])
    t = torch.tensor([med], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"median_s": float(t.item()), "steps_s": times[2:]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--inter", type=int, default=512, help="moe_intermediate_size")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "ep_overlap.json"))
    a = p.parse_args()
    from omnicore.testing.distributed import run_distributed

    args = {"tokens": a.tokens, "hidden": a.hidden, "inter": a.inter, "experts": a.experts, "steps": a.steps, "threads": a.threads}
    rows = []
    for mode, chunks in (("ep", 1), ("comet_ep", 2), ("comet_ep", 4)):
        r = run_distributed(rank_run, 2, args=(args, mode, chunks))[0]
        rows.append({"strategy": mode, "chunks": chunks, "step_ms": round(r["median_s"] * 1e3, 2)})
    base = rows[0]["step_ms"]
    for r in rows:
        r["speedup_vs_ep"] = round(base / r["step_ms"], 3)
    result = {
        "what": "forward+backward step of one EP-2 Qwen3MoeSparseMoeBlock (top-2), median over steps, slower rank",
        "processes": 2,
        "backend": "gloo",
        "config": args,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "rows": rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"EP layer, 2 processes, {a.tokens} tokens/rank, hidden {a.hidden}, inter {a.inter}, {a.experts} experts, top-2")
    print(f"{'strategy':<10} {'chunks':>6} {'step ms':>9} {'vs ep':>7}")
    for r in rows:
        print(f"{r['strategy']:<10} {r['chunks']:>6} {r['step_ms']:>9.2f} {r['speedup_vs_ep']:>7.3f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
