"""Step time and per-rank encoder cost with and without ``encoder_balance``, on 2 gloo processes
whose data is skewed: rank 0's micro-batches carry most of the images.

The model is a small Qwen2 foundation with a SigLIP image encoder large enough that encoding costs
time on a CPU (``--image-size`` pixels, 8-pixel patches, 2 x 2 of them merged into one token: 256
patches and 64 tokens an image at the default 128 px), under FSDP2.
Each rank trains ``--accum`` micro-batches per step, every row ``--row`` tokens long (packed to one
budget, as the data pipeline packs): rank 0's rows hold ``load`` images each and text for the rest,
rank 1's rows ``--light`` images and more text, so the foundation's work is the same on both ranks
and only the encoder's differs. Run at each image load of ``--loads``.

Reported per load and strategy (``fsdp2`` alone, then ``encoder_balance`` + ``fsdp2``): the step
time (forward, backward and AdamW over the micro-batches; median over ``--steps`` after 2 warm-up
steps, the slower rank's) and the spread of the ranks' encoder cost per step (max over mean of the
images' input elements each rank encodes: as the data put them without balancing, as assigned
with it), and the ratio of the two step times.

Usage::

    .venv/bin/python bench/encoder_balance.py [--loads 15,31] [--light 1] [--accum 2] [--steps 8]
                                              [--image-size 128] [--row 2304] [--threads 1] [--quick]

Writes ``bench/results/encoder_balance.json`` and prints a table. ``--quick`` (2 steps, loads 2
and 4, 32-pixel images, 256-token rows) only checks that the script runs. Timings count only on a
quiet machine (CPU-NOTES: jobs sharing the cores slow each other unevenly).
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

TINY_LM = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}


def build(args: dict):
    from omnicore.testing import Config, build_omni_model

    siglip = {
        "image_size": args["image_size"],
        "patch_size": 8,
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 256,
    }
    model = {
        "foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM)}},
        # 2 x 2 patches merged into one token (as Qwen2-VL does): the tower's work per placeholder token is 4 patches
        "encoders": {"image": {"name": "siglip", "options": {"config": siglip, "merge": 2}}},
    }
    cfg = Config.model_validate({"run": {"seed": 0, "device": "cpu"}, "model": model, "data": {"train": "unused.jsonl"}})
    return build_omni_model(cfg)[0]


def row(model, images: int, length: int, seed: int):
    """One packed row of ``length`` tokens: ``images`` images, each after 4 text tokens, then text."""
    import numpy as np
    import torch
    from PIL import Image

    from omnicore.testing import MicroBatch

    proc = model.encoder_processors()["image"]
    g = np.random.default_rng(seed)
    size = proc.num_tokens(proc.preprocess(Image.new("RGB", (8, 8))))
    feats = [proc.preprocess(Image.fromarray(g.integers(0, 256, (32, 32, 3), dtype=np.uint8))) for _ in range(images)]
    ids: list[int] = []
    for _ in feats:
        ids += g.integers(3, 250, 4).tolist() + [model.token_ids["encoder"]["image"]] * size
    if len(ids) >= length:
        raise SystemExit(f"--row {length} is too short for {images} images of {size} tokens")
    ids += g.integers(3, 250, length - len(ids)).tolist()
    t = torch.tensor([ids])
    placeholder = t == model.token_ids["encoder"]["image"]
    labels = torch.where(placeholder.roll(-1, 1) | placeholder, -100, t.roll(-1, 1))
    labels[0, -1] = -100
    inputs = {"image": proc.collate(feats)} if feats else {}
    return MicroBatch(t, labels, torch.arange(length)[None], encoder_inputs=inputs), int((labels != -100).sum())


def rank_run(args: dict, load: int, balance: bool) -> dict:
    import torch
    import torch.distributed as dist

    from omnicore.api import FSDP2
    from omnicore.testing import init_parallel_state, parallelize
    from omnicore_parallel_encoder_balance.strategy import EncoderBalance

    torch.set_num_threads(args["threads"])
    state = init_parallel_state("cpu", "gloo", {"dp_shard": -1})
    torch.manual_seed(0)
    model = build(args)
    strategies = [("fsdp2", FSDP2())]
    balancer = EncoderBalance({"min_spread": 1.0}) if balance else None
    if balancer is not None:
        strategies.append(("encoder_balance", balancer))
    model = parallelize(model, state, strategies)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = load if state.rank == 0 else args["light"]
    micro = [row(model, images, args["row"], 1000 * state.rank + k) for k in range(args["accum"])]
    n = torch.tensor([float(sum(c for _, c in micro))])
    dist.all_reduce(n)
    times = []
    for _ in range(args["steps"] + 2):
        dist.barrier()
        t0 = time.perf_counter()
        for mb, _ in micro:
            out = model(mb)
            (out.loss_sum * state.world_size / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    med = torch.tensor([statistics.median(times[2:])], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    # the ranks' encoder cost per step: their own images (each costs the same input elements), or as assigned
    own = [float(load * args["accum"]), float(args["light"] * args["accum"])]
    if balancer is not None:
        st = balancer.hook.stats["image"]  # summed over every micro-step run (warm-up included)
        unit = sum(st.before) / ((load + args["light"]) * st.calls)  # input elements of one image
        cost = [a / unit / (st.calls / args["accum"]) for a in st.after]
    else:
        cost = own
    mean = sum(cost) / len(cost)
    return {"step_s": float(med.item()), "cost_images": cost, "spread": max(cost) / mean if mean else 1.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loads", default="15,31", help="images per micro-batch on rank 0 (comma-separated: one run each)")
    p.add_argument("--light", type=int, default=1, help="images per micro-batch on rank 1")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per rank per step")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--image-size", type=int, default=128, help="SigLIP image size in pixels (8-pixel patches)")
    p.add_argument("--row", type=int, default=2304, help="tokens per packed row (every row has this length)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 steps, loads 2,4, 32-pixel images, 256-token rows")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "encoder_balance.json"))
    a = p.parse_args()
    if a.quick:
        a.steps, a.loads, a.image_size, a.row = 2, "2,4", 32, 256
    from omnicore.testing.distributed import run_distributed

    args = {"light": a.light, "accum": a.accum, "steps": a.steps, "image_size": a.image_size, "row": a.row, "threads": a.threads}
    rows = []
    for load in (int(x) for x in a.loads.split(",")):
        plain = run_distributed(rank_run, 2, args=(args, load, False), timeout=1800)[0]
        balanced = run_distributed(rank_run, 2, args=(args, load, True), timeout=1800)[0]
        rows.append(
            {
                "images_rank0": load,
                "images_rank1": a.light,
                "load_ratio": round(load / max(a.light, 1e-9), 2) if a.light else None,
                "step_ms_fsdp2": round(plain["step_s"] * 1e3, 1),
                "step_ms_balanced": round(balanced["step_s"] * 1e3, 1),
                "speedup": round(plain["step_s"] / balanced["step_s"], 3),
                "spread_fsdp2": round(plain["spread"], 3),
                "spread_balanced": round(balanced["spread"], 3),
                "images_per_rank_balanced": [round(c, 2) for c in balanced["cost_images"]],
            }
        )
    result = {
        "what": "step time (median, slower rank) and per-rank encoder-cost spread (max/mean) on skewed images, fsdp2 vs "
        "encoder_balance + fsdp2, 2 gloo processes",
        "quick": a.quick,
        "config": {**args, "loads": a.loads, "tokens_per_image": (a.image_size // 16) ** 2},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "rows": rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"2 processes, {a.accum} micro-batches of {a.row} tokens per rank, {a.image_size}-px images, rank 1: {a.light} a micro-batch")
    print(f"{'rank 0 images':>13} {'fsdp2 ms':>9} {'balanced ms':>12} {'speed-up':>9} {'spread':>7} {'balanced':>9}")
    for r in rows:
        print(
            f"{r['images_rank0']:>13} {r['step_ms_fsdp2']:>9.1f} {r['step_ms_balanced']:>12.1f} {r['speedup']:>9.3f} "
            f"{r['spread_fsdp2']:>7.3f} {r['spread_balanced']:>9.3f}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
