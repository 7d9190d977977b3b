"""GPU check (issue #5): MFU and tokens/s of a ~0.7B foundation at 8K tokens, and flash-attn == sdpa.

One command on a CUDA machine with ``flash-attn`` installed (``pip install -e plugins/omnicore-kernels-flash-attn[gpu]``)::

    .venv/bin/python bench/gpu_check.py      # writes bench/results/gpu_check.json, prints a table

1. **Equality on packed data.** One packed row of ``--tokens`` tokens (samples of log-normal length)
   through the same weights with ``model.kernels.attention: sdpa`` (block-diagonal mask) and ``flash_attn``
   (varlen, ``cu_seqlens``), bf16 autocast; the max abs and relative difference of the logits, and
   flash-attn packed vs each sample alone.
2. **Throughput.** ``omnicore.train.loop.train`` (the real loop) on synthetic text packed into rows
   of ``--tokens`` tokens, bf16 mixed precision, for each attention backend available: median
   tokens/s, achieved TFLOP/s and MFU (``omnicore.train.metrics``: PaLM's 6N + 12 L d s per sample,
   against the GPU's dense bf16 peak) over the steps after ``--warmup``.
3. **Omni MFU.** The same loop with a SigLIP image tower (ViT-B/16 sizes, 224 px) before the
   foundation, on rows of synthetic images and text: MFU of the whole model (every part counted,
   ``omnicore.model.flops``: the tower measured on its first micro-batch), each part's share of
   the FLOPs (``flops_share/<part>``) and the MFU the foundation alone would claim, the count
   before issue #26.

The foundation is a Qwen2 of hidden 1280, 24 layers, 10 heads (2 KV heads), MLP 6912: about 0.73B
weights in the blocks; the byte tokenizer keeps the vocabulary small (so the LM head is a small part
of the FLOPs). Without CUDA the script says so and exits 0; ``--cpu-smoke`` runs a tiny version on
CPU (sdpa and eager only) so the script is tested where CI runs.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FOUNDATION = {
    "model_type": "qwen2",
    "hidden_size": 1280,
    "intermediate_size": 6912,
    "num_hidden_layers": 24,
    "num_attention_heads": 10,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}
VISION = {
    "image_size": 224,
    "patch_size": 16,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
}
"""The image tower of the omni run: SigLIP at ViT-B/16 sizes (about 86M weights, 196 patches an image)."""
TINY_VISION = {
    "image_size": 28,
    "patch_size": 7,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
TINY = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}


def sample_lengths(total: int, rng: random.Random, median: int = 600, sigma: float = 1.0) -> list[int]:
    """Log-normal sample lengths (tokens) filling ``total`` exactly (the last one is cut)."""
    out: list[int] = []
    while sum(out) < total:
        out.append(max(8, int(rng.lognormvariate(math.log(median), sigma))))
    out[-1] -= sum(out) - total
    return [n for n in out if n > 0]


def write_text_jsonl(path: Path, n: int, rng: random.Random, median: int, longest: int) -> None:
    """``n`` chat samples of log-normal byte length up to ``longest`` (the byte tokenizer: one token
    per byte)."""
    words = "omni modal training packs samples into rows and keeps them apart with position ids".split()
    with path.open("w") as fh:
        for length in sample_lengths(n * median, rng, median):
            length = min(length, longest)
            text = " ".join(rng.choice(words) for _ in range(max(1, length // 7)))
            fh.write(json.dumps({"messages": [{"role": "user", "content": "Repeat."}, {"role": "assistant", "content": text}]}) + "\n")


def write_image_jsonl(folder: Path, n: int, size: int, rng: random.Random) -> Path:
    """``n`` chat samples of one synthetic image (noise, 16 distinct files) and a short answer."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(16):
        img = Image.frombytes("RGB", (size, size), bytes(rng.getrandbits(8) for _ in range(size * size * 3)))
        img.save(folder / f"{i}.png")
        files.append(f"{i}.png")
    path = folder / "images.jsonl"
    with path.open("w") as fh:
        for i in range(n):
            user = [{"type": "image", "path": files[i % 16]}, {"type": "text", "text": "Describe the picture."}]
            answer = " ".join(rng.choice(["noise", "grey", "pixels", "random", "dots"]) for _ in range(rng.randint(4, 40)))
            fh.write(json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}) + "\n")
    return path


def attention_backends(device: str) -> list[str]:
    """Attention kernels available here, flash_attn first when it is."""
    from omnicore.registry import Registry

    reg = Registry.discover()
    names = ["flash_attn", "sdpa_varlen", "sdpa"] if device == "cuda" else ["sdpa_varlen", "sdpa", "eager"]
    out = []
    for name in names:
        try:
            ok, _ = reg.build("kernel", name).available()
        except Exception:
            ok = False
        if ok:
            out.append(name)
    return out


def equality(foundation: dict, tokens: int, device: str, backends: list[str]) -> dict:
    """Logits of one packed row under each backend vs the first; and packed vs per sample."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from omnicore.registry import Registry

    reg = Registry.discover()
    kw = dict(foundation)
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(AutoConfig.for_model(kw.pop("model_type"), vocab_size=512, **kw)).to(device).eval()
    rng = random.Random(0)
    lengths = sample_lengths(tokens, rng)
    ids = torch.randint(0, 512, (1, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0).to(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    logits = {}
    for name in backends:
        reg.build("kernel", name).activate(lm)
        with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=device == "cuda"):
            logits[name] = lm(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    ref = backends[-1]  # sdpa: the reference
    out: dict = {"tokens": tokens, "samples": len(lengths), "reference": ref, "dtype": str(dtype), "vs_reference": {}}
    for name, lg in logits.items():
        d = (lg - logits[ref]).abs()
        out["vs_reference"][name] = {"max_abs": float(d.max()), "max_rel": float(d.max() / logits[ref].abs().max())}
    # packed vs per-sample for the first backend
    first = backends[0]
    reg.build("kernel", first).activate(lm)
    worst, start = 0.0, 0
    for n in lengths[:8]:
        with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=device == "cuda"):
            alone = lm(input_ids=ids[:, start : start + n], position_ids=pos[:, start : start + n], use_cache=False).logits.float()
        worst = max(worst, float((alone - logits[first][:, start : start + n]).abs().max()))
        start += n
    out["packed_vs_alone"] = {"backend": first, "samples_checked": min(8, len(lengths)), "max_abs": worst}
    return out


def throughput(
    foundation: dict,
    tokens: int,
    steps: int,
    warmup: int,
    device: str,
    attention: str,
    data: Path,
    out_dir: Path,
    vision: dict | None = None,
) -> dict:
    """Median throughput of the real training loop (``train()``) with one attention backend; with
    ``vision``, a SigLIP image tower of that config before the foundation (the omni run)."""
    from omnicore.config import Config
    from omnicore.train.loop import train

    encoders = {"image": {"name": "siglip", "options": {"config": vision}}} if vision else {}
    cfg = Config.model_validate(
        {
            "run": {"output_dir": str(out_dir / (attention + ("-omni" if vision else ""))), "seed": 0, "device": device},
            "model": {
                "foundation": {"name": "hf_causal_lm", "options": {"config": foundation}},
                "encoders": encoders,
                "kernels": {"attention": attention},
            },
            "data": {"train": str(data), "max_tokens": tokens},
            "train": {
                "max_steps": steps,
                "warmup_steps": 2,
                "lr": 1e-4,
                "progress": False,
                "export": False,
                "mixed_precision": "bf16" if device == "cuda" else "none",
            },
        }
    )
    t = time.perf_counter()
    hist = train(cfg)
    rows = hist[warmup:] or hist
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    mfu = [r["mfu"] for r in rows if r["mfu"] is not None]
    shares = {k.split("/", 1)[1]: med(k) for k in rows[-1] if k.startswith("flops_share/")}
    return {
        "attention": attention,
        "vision": vision,
        "median_flops_share": shares,
        # what the count before issue #26 claimed: the foundation alone (dense here: no experts)
        "median_mfu_foundation_only": statistics.median(m * shares["foundation"] for m in mfu) if mfu else None,
        "median_flops_spread": med("flops_spread"),
        "steps": len(hist),
        "median_tokens_per_s": med("tokens_per_s"),
        "median_step_s": med("step_time_s"),
        "median_tflops": med("tflops"),
        "median_mfu": statistics.median(mfu) if mfu else None,
        "peak_mem_mib": max(r["peak_mem_mib"] for r in hist),
        "padding_waste": statistics.mean(r["padding_waste"] for r in rows),
        "final_loss": hist[-1]["loss"],
        "wall_s": time.perf_counter() - t,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per packed row")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    ap.add_argument("--cpu-smoke", action="store_true", help="a tiny model on CPU (tests the script; no GPU figures)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_check.json"))
    args = ap.parse_args(argv)
    import torch

    if args.cpu_smoke:
        device, foundation = "cpu", TINY
        args.tokens, args.steps, args.warmup = min(args.tokens, 512), min(args.steps, 3), min(args.warmup, 1)
    elif not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing measured. Run it on a GPU machine, or --cpu-smoke."
        )
        return 0
    else:
        device, foundation = "cuda", FOUNDATION
    backends = attention_backends(device)
    result: dict = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "foundation": foundation,
        "tokens_per_row": args.tokens,
        "backends": backends,
    }
    result["equality"] = equality(foundation, args.tokens, device, backends)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "text.jsonl"
        median = min(600, args.tokens // 8)
        write_text_jsonl(
            data, n=max(64, args.steps * args.tokens // median + 16), rng=random.Random(1), median=median, longest=args.tokens // 2
        )
        result["throughput"] = [
            throughput(foundation, args.tokens, args.steps, args.warmup, device, a, data, Path(tmp)) for a in backends if a != "eager"
        ]
        vision = VISION if device == "cuda" else TINY_VISION
        images = write_image_jsonl(Path(tmp) / "images", n=max(64, args.steps * 64), size=vision["image_size"], rng=random.Random(2))
        result["omni"] = throughput(foundation, args.tokens, args.steps, args.warmup, device, backends[0], images, Path(tmp), vision)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"device: {result['device']}; row: {args.tokens} tokens; equality vs {result['equality']['reference']}:")
    for name, d in result["equality"]["vs_reference"].items():
        print(f"  {name:12s} max abs {d['max_abs']:.3g}  max rel {d['max_rel']:.3g}")
    p = result["equality"]["packed_vs_alone"]
    print(f"  packed vs alone ({p['backend']}, {p['samples_checked']} samples): max abs {p['max_abs']:.3g}")
    print("| attention | tokens/s | TFLOP/s | MFU | peak MiB |\n|---|---|---|---|---|")
    for t in result["throughput"]:
        mfu = f"{100 * t['median_mfu']:.1f}%" if t["median_mfu"] is not None else "n/a"
        print(f"| {t['attention']} | {t['median_tokens_per_s']:.0f} | {t['median_tflops']:.3g} | {mfu} | {t['peak_mem_mib']:.0f} |")
    o = result["omni"]
    mfu = (
        f"{100 * o['median_mfu']:.1f}% (the foundation alone: {100 * o['median_mfu_foundation_only']:.1f}%)"
        if o["median_mfu"] is not None
        else "n/a"
    )
    shares = ", ".join(f"{k} {100 * v:.1f}%" for k, v in o["median_flops_share"].items())
    print(f"omni (SigLIP image tower, {o['attention']}): {o['median_tflops']:.3g} TFLOP/s, MFU {mfu}; FLOPs: {shares}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
