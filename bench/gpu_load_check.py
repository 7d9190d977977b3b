"""Sharded foundation loading on a CUDA device (issue #12): the same logits as ``from_pretrained``, and what it costs.

Usage (on a machine with a GPU; ``--cpu-smoke`` runs the same steps on CPU with a tiny model)::

    python bench/gpu_load_check.py [--size-m 1000] [--out bench/results/gpu_load_check.json]

A random Qwen2-shaped model of about ``--size-m`` million parameters (hidden 2048, vocab 32000)
is saved in bf16 safetensors, then loaded three ways, each in bf16 on the device:

* ``from_pretrained``: ``AutoModelForCausalLM.from_pretrained(folder, dtype=bf16).to(device)``, the reference;
* ``omnicore``: ``build_omni_model(defer_load=True)`` (the foundation on meta), the model moved
  with ``to_device_keeping_meta`` and filled on the device by ``fill_pending``;
* ``omnicore_fsdp2``: the same with FSDP2 (``fully_shard`` per block, then the foundation) on a 1-rank
  NCCL mesh before the fill, so every parameter is a DTensor filled through its local shard.

Figures: logits max |difference| from the reference on one fixed batch (expected 0: the same
bf16 values and kernels), seconds to load, peak device memory (``max_memory_allocated``) and peak
host RSS growth (VmHWM, reset per phase) per way. Exit status 0 unless logits differ.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_mib() -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    got = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            got[key] = int(value.split()[0]) / 1024
    return got["VmRSS"], got["VmHWM"]


class Phase:
    """Times one way of loading and records its peak device memory and host RSS growth."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        import torch

        Path("/proc/self/clear_refs").write_text("5")
        self.rss0 = _rss_mib()[0]
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.t0
        self.host_peak_mib = _rss_mib()[1] - self.rss0
        self.device_peak_mib = torch.cuda.max_memory_allocated() / 2**20 if self.device.type == "cuda" else None


def _save(folder: Path, millions: int, smoke: bool) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hidden, inter, vocab, heads = (64, 128, 512, 4) if smoke else (2048, 5632, 32000, 16)
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    layers = 2 if smoke else max(1, round((millions * 1e6 - 2 * vocab * hidden) / per_layer))
    config = AutoConfig.for_model(
        "qwen2", hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads // 4, vocab_size=vocab, tie_word_embeddings=False, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    return n


def _omnicore(folder: Path, device, fsdp: bool):
    from omnicore.config import Config
    from omnicore.model.build import build_omni_model
    from omnicore.model.loading import fill_pending, to_device_keeping_meta

    raw = {"data": {"train": "unused.jsonl"}, "model": {"foundation": {"name": "hf_causal_lm", "dtype": "bfloat16",
           "options": {"checkpoint": str(folder), "tokenizer": "byte"}}}}  # fmt: skip
    model, _ = build_omni_model(Config.model_validate(raw), defer_load=True)
    to_device_keeping_meta(model, device)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (1,))
        for block in model.blocks():
            fully_shard(block, mesh=mesh)
        fully_shard(model.lm, mesh=mesh)  # the foundation as the root: it is what runs below
    fill_pending(model, device)
    kinds = {type(p).__name__ for p in model.parameters()}
    return model.lm, kinds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-m", type=int, default=1000)
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_load_check.json"))
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("no CUDA device here; nothing measured (use --cpu-smoke for a CPU run of the same steps)")
        return 0
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29561"), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo" if args.cpu_smoke else "nccl")
    out: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="gpu-load-") as tmp:
        folder = Path(tmp) / "lm"
        out["params_m"] = round(_save(folder, args.size_m, args.cpu_smoke) / 1e6, 1)
        ids = torch.randint(0, 256, (2, 256), generator=torch.Generator().manual_seed(0)).to(device)
        rows, ref_logits = {}, None
        for way in ("from_pretrained", "omnicore", "omnicore_fsdp2"):
            with Phase(device) as ph:
                if way == "from_pretrained":
                    lm, kinds = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(device), {"Parameter"}
                else:
                    lm, kinds = _omnicore(folder, device, fsdp=way.endswith("fsdp2"))
            with torch.no_grad():
                logits = lm.eval()(ids).logits.float()
            ref_logits = logits if ref_logits is None else ref_logits
            rows[way] = {
                "seconds": round(ph.seconds, 2), "device_peak_mib": ph.device_peak_mib and round(ph.device_peak_mib),
                "host_peak_growth_mib": round(ph.host_peak_mib), "parameter_types": sorted(kinds),
                "logits_max_abs_diff": float((logits - ref_logits).abs().max()),
            }  # fmt: skip
            print(way, json.dumps(rows[way]), flush=True)
            del lm, logits
            if device.type == "cuda":
                torch.cuda.empty_cache()
    out["ways"] = rows
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    dist.destroy_process_group()
    ok = all(r["logits_max_abs_diff"] == 0.0 for r in rows.values())
    print(("equal logits" if ok else "LOGITS DIFFER") + f"; written {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
