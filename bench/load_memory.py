"""Loading a foundation checkpoint (issue #12): peak memory per rank, sharded against whole.

Usage::

    .venv/bin/python bench/load_memory.py [--quick] [--out bench/results/load_memory.json]
        [--sizes 125,250] [--nproc 2] [--family qwen2_audio]

For each size (millions of parameters, a Qwen2-shaped model: hidden 1024, vocab 32000, untied
embeddings, as many layers as the size needs), a random model is saved once with
``save_pretrained`` (fp32 safetensors) into a temporary folder. Then ``--nproc`` processes
(gloo, one per rank, spawned fresh for each measurement) each measure, from ``/proc/self/status``:

* **baseline**: VmRSS after joining the process group and building, sharding and dropping a
  tiny model of the same architecture through the same path (so the code, the tokenizer and the
  process group's buffers are in the baseline, not in the figure); the peak (VmHWM) is reset
  there (``/proc/self/clear_refs`` 5);
* **sharded** (omnicore's path): ``build_omni_model(defer_load=True)`` (the foundation on meta,
  keys checked against the safetensors headers), FSDP2 through ``parallelize``, then
  ``fill_pending`` (each rank allocates and reads only its shards);
* **whole** (the path before #12): ``from_pretrained`` of the whole model on every rank, then FSDP2.

Figures (none asserted): peak RSS above the baseline per rank, in MiB and as a fraction of the
model's fp32 size (goal of the sharded path: at most 0.6), the RSS after loading, and how much of
the peak was file-backed (memory-mapped checkpoint pages, ``RssFile``) against anonymous memory
(``RssAnon``, sampled after loading); and the ratio of the largest size's peak fraction to the
smallest's (the fraction should not grow with the model). ``--quick``: sizes 100 and 150.

``--family qwen2_audio`` measures a *composite* checkpoint instead (issue #24): a random
``Qwen2AudioForConditionalGeneration`` saved with ``save_pretrained`` (the family plugin's stand-in
writer at width 1024: about two thirds of the parameters in the Qwen2 LM, one third in the
Whisper-style audio tower and projector), built from the one foundation entry
``foundation/qwen2_audio``, which brings the tower as an encoder. Towers included: FSDP2 shards the
encoder as one unit and ``fill_pending`` reads each rank's shards of it as it does the LM's. Only
the sharded path is measured (the baseline's tiny model is a stand-in of the same family); results
go to ``bench/results/load_memory_qwen2_audio.json`` by default.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _status() -> dict[str, int]:
    """KiB figures of /proc/self/status (VmRSS, VmHWM, RssAnon, RssFile)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


def _config(folder: str, family: str | None = None) -> dict:
    foundation = {"name": family, "options": {"checkpoint": folder}} if family else {
        "name": "hf_causal_lm", "options": {"checkpoint": folder, "tokenizer": "byte"}}  # fmt: skip
    return {
        "data": {"train": "unused.jsonl"},
        "model": {"foundation": foundation},
        "parallel": {"strategies": ["fsdp2"], "backend": "gloo"},
    }


def measure_rank(folder: str, mode: str, warm_folder: str | None = None, family: str | None = None) -> dict:
    """One rank's figures (run under ``run_distributed``): see the module docstring."""
    from unittest import mock

    import transformers  # noqa: F401  (part of the baseline)

    from omnicore.config import Config
    from omnicore.model import loading
    from omnicore.model.build import build_omni_model
    from omnicore.parallel.parallelize import build_strategies, parallelize
    from omnicore.parallel.state import init_parallel_state

    cfg = Config.model_validate(_config(folder, family))
    state = init_parallel_state("cpu", "gloo", cfg.parallel)
    from omnicore.registry import registry_for

    registry = registry_for(cfg)
    if family:
        warm = Config.model_validate(_config(str(warm_folder), family))
    else:
        warm = Config.model_validate(_config(folder))
        warm.model.foundation.options = {"config": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                                                    "num_attention_heads": 4, "num_key_value_heads": 4}, "tokenizer": "byte"}  # fmt: skip
    tiny, _ = build_omni_model(warm, registry)
    if family:
        tiny = parallelize(tiny, state, build_strategies(warm.parallel, registry, state.distributed))
        loading.fill_pending(tiny, state.device)
    del tiny  # code imported, allocator warmed; nothing of it stays
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: the peak from here on
    base = _status()
    t0 = time.perf_counter()
    patch = mock.patch.object(loading, "checkpoint_index", return_value=None) if mode == "whole" else mock.MagicMock()
    with patch:
        model, _ = build_omni_model(cfg, registry, defer_load=True)
    model = parallelize(model, state, build_strategies(cfg.parallel, registry, state.distributed))
    loading.fill_pending(model, state.device)
    seconds = time.perf_counter() - t0
    after = _status()
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    return {"base": base, "after": after, "seconds": seconds, "local_params": local}


def _save(folder: Path, millions: int) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hidden, inter, vocab = 1024, 2816, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    layers = max(1, round((millions * 1e6 - 2 * vocab * hidden) / per_layer))
    config = AutoConfig.for_model(
        "qwen2", hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=vocab, tie_word_embeddings=False, max_position_embeddings=2048,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    del model
    return n


def _save_family(folder: Path, millions: int) -> tuple[int, dict[str, int]]:
    """A random Qwen2-Audio checkpoint of about ``millions`` parameters (width 1024; LM layers and
    tower layers in a 2 : 1 ratio of parameters); returns the total and the count per part."""
    from safetensors import safe_open

    from omnicore_family_qwen2_audio.standin import save_standin

    width = 1024
    lm_layer, tower_layer = 10 * width * width, 8 * width * width  # MLP 2x wide in both
    tower_layers = max(1, round(millions * 1e6 / 3 / tower_layer))
    lm_layers = max(1, round(millions * 1e6 * 2 / 3 / lm_layer))
    save_standin(folder, d_model=width, encoder_layers=tower_layers, encoder_heads=16, hidden_size=width, num_layers=lm_layers,
                 num_heads=16, num_kv_heads=16, max_seconds=2)  # fmt: skip
    parts: dict[str, int] = {}
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for k in f.keys():
            part = "language_model" if "language_model" in k else "audio_tower" if "audio_tower" in k else "projector"
            shape = f.get_slice(k).get_shape()
            n = 1
            for d in shape:
                n *= d
            parts[part] = parts.get(part, 0) + n
    return sum(parts.values()), parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default=None, help="millions of parameters, comma-separated (default 125,250)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--family", default=None, choices=["qwen2_audio"], help="a composite checkpoint of this family (towers included)")
    ap.add_argument("--out", default=None, help="default bench/results/load_memory.json (load_memory_FAMILY.json with --family)")
    args = ap.parse_args()
    out = args.out or str(ROOT / "bench" / "results" / (f"load_memory_{args.family}.json" if args.family else "load_memory.json"))
    sizes = [int(s) for s in (args.sizes or ("100,150" if args.quick else "125,250")).split(",")]
    from omnicore.testing.distributed import run_distributed

    rows = []
    with tempfile.TemporaryDirectory(prefix="load-memory-") as tmp:
        for millions in sizes:
            folder = Path(tmp) / f"lm{millions}"
            warm = None
            if args.family:
                from omnicore_family_qwen2_audio.standin import save_standin

                warm = save_standin(Path(tmp) / "warm")
                n, parts = _save_family(folder, millions)
            else:
                n, parts = _save(folder, millions), {}
            fp32_mib = n * 4 / 2**20
            for mode in ("sharded",) if args.family else ("sharded", "whole"):
                ranks = run_distributed(
                    measure_rank, args.nproc, args=(str(folder), mode, str(warm) if warm else None, args.family), timeout=1800
                )
                peaks = [(r["after"]["VmHWM"] - r["base"]["VmRSS"]) / 1024 for r in ranks]
                row = {
                    "params_m": round(n / 1e6, 1), "parts_m": {k: round(v / 1e6, 1) for k, v in parts.items()}, "family": args.family, "mode": mode, "nproc": args.nproc, "fp32_mib": round(fp32_mib, 1),
                    "baseline_mib": [round(r["base"]["VmRSS"] / 1024, 1) for r in ranks],
                    "peak_above_baseline_mib": [round(p, 1) for p in peaks],
                    "peak_fraction_of_fp32": [round(p / fp32_mib, 3) for p in peaks],
                    "rss_after_above_baseline_mib": [round((r["after"]["VmRSS"] - r["base"]["VmRSS"]) / 1024, 1) for r in ranks],
                    "rss_file_after_mib": [round(r["after"]["RssFile"] / 1024, 1) for r in ranks],
                    "local_params_m": [round(r["local_params"] / 1e6, 1) for r in ranks],
                    "seconds": [round(r["seconds"], 2) for r in ranks],
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
            import shutil

            shutil.rmtree(folder)
    sharded = [r for r in rows if r["mode"] == "sharded"]
    ratio = max(sharded[-1]["peak_fraction_of_fp32"]) / max(sharded[0]["peak_fraction_of_fp32"])
    summary = {"rows": rows, "sharded_peak_fraction_ratio_largest_to_smallest": round(ratio, 3), "goal": "sharded peak <= 0.6 of fp32"}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"sharded peak fraction, largest / smallest size: {ratio:.3f}; written {out}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
