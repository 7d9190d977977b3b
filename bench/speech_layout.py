#!/usr/bin/env python3
"""Speech codes flattened against a depth decoder: LM positions per second of speech, step time and
generation time, at two clip lengths (issue #25, item 2).

Method. The five-task digits model's foundation (``examples/digits/five.yaml``: a Qwen3-VL text
model, hidden 128, 3 layers) with one audio decoder, the shipped EnCodec of the example
(``examples/digits/codec``: 8 kHz, 2 codebooks of 256, 50 frames/s), in each layout:

* ``flat``: every code its own LM position, frame by frame (``codebooks: flat``);
* ``depth``: one LM position per frame, codebook 1 from a depth decoder (``codebooks: depth``,
  ``omnicore.api.DepthOptions`` defaults: 2 layers, width 128).

Each sample is "Say the digit D." answered by an FSDD recording padded to the clip length
(``max_seconds``). A training step is forward, backward and AdamW over one packed micro-batch of
``--batch`` samples (codes from the code cache after the first step, as in training); the figure
is the median of ``--steps`` steps after one warm-up. Generation is one greedy clip at batch 1
(the audio-start token forced), KV cache on, timed whole. One process, ``torch.set_num_threads(2)``.

Writes ``bench/results/speech_layout.json`` and prints a table. Caveat: a CPU figure on a tiny
model; the foundation's share of the step grows with its size, so the depth decoder's relative cost
shrinks on a real foundation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
FSDD = DIGITS / "raw" / "fsdd" / "recordings"


def _config(layout: str, seconds: float, max_tokens: int) -> dict:
    import yaml

    five = yaml.safe_load((DIGITS / "five.yaml").read_text())
    lm = dict(five["model"]["foundation"]["options"]["config"])
    options = {"checkpoint": str(DIGITS / "codec"), "max_seconds": seconds, "long_audio": "crop", "codebooks": layout}
    return {
        "run": {"output_dir": "bench-speech", "seed": 0},
        "model": {
            "foundation": {"name": "hf_causal_lm", "options": {"config": lm}},
            "decoders": {"audio": {"name": "encodec", "options": options}},
        },
        "data": {"train": "unused.jsonl", "max_tokens": max_tokens},
        "train": {"max_steps": 1, "progress": False, "export": False},
    }


def _sample(digit: int, take: int) -> str:
    wav = FSDD / f"{digit}_jackson_{take}.wav"
    content = [{"type": "audio", "path": str(wav)}]
    return json.dumps({"messages": [{"role": "user", "content": f"Say the digit {digit}."}, {"role": "assistant", "content": content}]})


def measure(layout: str, seconds: float, batch: int, steps: int) -> dict:
    import torch

    from omnicore.config import Config
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.jsonl import parse_line
    from omnicore.data.packing import collate
    from omnicore.model.build import build_omni_model
    from omnicore.model.code_cache import CodeCache
    from omnicore.model.generation import generate_batch

    torch.manual_seed(0)
    cfg = Config.model_validate(_config(layout, seconds, 100_000))
    model, tok = build_omni_model(cfg)
    proc = ChatProcessor.for_model(tok, model, cfg.data)
    samples = [proc.encode(parse_line(_sample(i % 10, 10 + i // 10), "bench.jsonl", i + 1)) for i in range(batch)]
    dec = model.decoders["audio"]
    per_clip = int(proc.decoders["audio"].num_tokens(next(f for s, m, f in samples[0].media if s == "decoder")))
    mb = collate(samples, proc.encoders, proc.decoders, decoder_keys=True)
    model.code_cache = CodeCache(64 << 20)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        out = model(mb)
        (out.loss_sum / max(out.n_targets, 1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t0)
    model.eval()
    model.code_cache = None
    prompt = proc.encode(parse_line(_sample(3, 3), "bench.jsonl", 1), prompt_only=True)
    start = model.token_ids["decoder_start"]["audio"]
    force = model.lm.get_output_embeddings().register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([start]), 1e4))
    try:
        t0 = time.perf_counter()
        generate_batch(model, tok, [prompt], max_new_tokens=1)
        gen = time.perf_counter() - t0
    finally:
        force.remove()
    return {
        "layout": layout,
        "seconds": seconds,
        "positions_per_clip": per_clip,
        "positions_per_second": per_clip / seconds,
        "codes_per_position": int(getattr(dec, "num_codebooks", 1)),
        "row_tokens": int(mb.input_ids.shape[1]),
        "step_s": statistics.median(times),
        "generate_clip_s": gen,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", default="1,2", help="clip lengths to measure (comma-separated seconds)")
    p.add_argument("--batch", type=int, default=8, help="samples per micro-batch")
    p.add_argument("--steps", type=int, default=10, help="timed training steps per case (after one warm-up)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    rows = [measure(layout, float(s), args.batch, args.steps) for s in args.seconds.split(",") for layout in ("flat", "depth")]
    by = {(r["layout"], r["seconds"]): r for r in rows}
    for s in sorted({r["seconds"] for r in rows}):
        f, d = by[("flat", s)], by[("depth", s)]
        d["step_speedup_vs_flat"] = f["step_s"] / d["step_s"]
        d["generate_speedup_vs_flat"] = f["generate_clip_s"] / d["generate_clip_s"]
    out = ROOT / "bench" / "results" / "speech_layout.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"batch": args.batch, "steps": args.steps, "rows": rows}, indent=1) + "\n")
    print("| layout | clip s | LM positions / s of speech | row tokens | step ms | generate s / clip | step vs flat | generate vs flat |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        sp = f"{r['step_speedup_vs_flat']:.2f}x" if "step_speedup_vs_flat" in r else "1x"
        gp = f"{r['generate_speedup_vs_flat']:.2f}x" if "generate_speedup_vs_flat" in r else "1x"
        print(
            f"| {r['layout']} | {r['seconds']:g} | {r['positions_per_second']:.0f} | {r['row_tokens']} | {1000 * r['step_s']:.0f} | "
            f"{r['generate_clip_s']:.2f} | {sp} | {gp} |"
        )
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
