"""What the code cache saves: a frozen decoder tokenizer's encode against a cache lookup, per target.

Method. The digits example's two decoders, built from their shipped fitted folders
(``examples/digits/movq``: MoVQGAN, ``examples/digits/codec``: an 8 kHz EnCodec), each at two target
sizes (images of 32 and 64 pixels; speech of 1 and 2 seconds). For each, ``--batches`` micro-batches of
``--batch`` targets (real MNIST images from ``examples/digits/raw``, real FSDD recordings, tiled to
the length) go through :meth:`omnicore.model.omni.OmniModel.target_codes` twice: first with an
empty :class:`~omnicore.model.code_cache.CodeCache` (every target is encoded and stored: the first
epoch), then again (every target is found: later epochs), and once more without a cache. Each
figure is the median over batches of the wall time per target, in ms, with torch's threads as set
(``OMP_NUM_THREADS``, default 2). Also: the bytes the cache holds per target, and the digest's time
per target (:func:`omnicore.data.packing.features_digest`, paid in ``collate`` whether or not a
decoder uses the cache).

Writes ``bench/results/code_cache.json`` and prints a table. Caveat: only the target path is timed,
not a whole training step; in the five-task digits run (3,500 steps, about 3.4 epochs) 73.8% of
lookups hit and the median step fell from 180 to 141-145 ms, together with the fused AdamW.

Usage::

    .venv/bin/python bench/code_cache.py [--batch 8] [--batches 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"


def _targets(kind: str, size: float, n: int) -> list:
    """``n`` real targets: MNIST digits as RGB images of ``size`` pixels, or FSDD clips tiled to ``size`` s."""
    import numpy as np
    from PIL import Image

    sys.path.insert(0, str(DIGITS))
    from build_data import DEFAULT_RAW, load_mnist

    from omnicore.api import Audio, load_audio

    if kind == "image":
        images, _ = load_mnist(Path(DEFAULT_RAW))
        return [Image.fromarray(images[i]).convert("RGB").resize((int(size), int(size)), Image.BICUBIC) for i in range(n)]
    wavs = sorted((DIGITS / "raw" / "fsdd" / "recordings").glob("*_[5-9].wav"))[:n]
    out = []
    for w in wavs:
        a = load_audio(w)
        reps = int(np.ceil(size * a.sample_rate / len(a.samples)))
        out.append(Audio(samples=np.tile(a.samples, reps)[: int(size * a.sample_rate)], sample_rate=a.sample_rate))
    return out


def _decoder(kind: str, size: float):
    from omnicore_audio_codec.decoder import build as build_codec
    from omnicore_image_movqgan.decoder import build as build_movq

    if kind == "image":
        return build_movq({"checkpoint": str(DIGITS / "movq"), "image_size": int(size)}, hidden_size=64)
    return build_codec({"checkpoint": str(DIGITS / "codec"), "max_seconds": size, "long_audio": "crop"}, hidden_size=64)


def measure(kind: str, size: float, batch: int, batches: int) -> dict:
    import torch

    from omnicore.data.packing import features_digest
    from omnicore.model.code_cache import CodeCache
    from omnicore.model.omni import OmniModel

    dec = _decoder(kind, size).eval()
    assert dec.fixed_codes, f"{kind}: the shipped tokenizer should be frozen"
    model = OmniModel(torch.nn.Linear(1, 1), {}, {kind: dec}, {"encoder": {}, "decoder": {}, "decoder_start": {}})
    targets = _targets(kind, size, batch * batches)
    feats = [dec.processor.preprocess(t) for t in targets]
    t0 = time.perf_counter()
    digests = [features_digest(f) for f in feats]
    digest_ms = (time.perf_counter() - t0) / len(feats) * 1e3
    groups = []
    for b in range(batches):
        items = feats[b * batch : (b + 1) * batch]
        keys = [(d, int(dec.processor.num_tokens(f))) for d, f in zip(digests[b * batch : (b + 1) * batch], items)]
        groups.append((dec.processor.collate(items), keys))

    def per_target(cache):
        model.code_cache = cache
        times = []
        with torch.no_grad():
            for inputs, keys in groups:
                t = time.perf_counter()
                model.target_codes(kind, inputs, keys, "cpu")
                times.append((time.perf_counter() - t) / len(keys) * 1e3)
        return statistics.median(times)

    per_target(None)  # warm-up: first calls pay for allocations and oneDNN kernel choice
    plain = per_target(None)
    cache = CodeCache(1 << 30)
    first = per_target(cache)
    again = per_target(cache)
    codes = sum(n for _, keys in groups for _, n in keys) / (batch * batches)
    return {
        "decoder": type(dec).__name__,
        "target": f"{int(size)} px" if kind == "image" else f"{size:g} s",
        "codes_per_target": codes,
        "encode_ms": round(plain, 3),
        "first_epoch_ms": round(first, 3),
        "cached_ms": round(again, 4),
        "speedup": round(plain / again, 1),
        "bytes_per_target": cache.bytes / len(cache),
        "digest_ms": round(digest_ms, 4),
        "hit_rate": round(cache.hits / (cache.hits + cache.misses), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8, help="targets per micro-batch")
    p.add_argument("--batches", type=int, default=12, help="micro-batches per measurement")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    rows = [measure(k, s, args.batch, args.batches) for k, s in (("image", 32), ("image", 64), ("audio", 1.0), ("audio", 2.0))]
    out = ROOT / "bench" / "results" / "code_cache.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"args": vars(args), "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("| decoder | target | codes | encode ms | first epoch ms | cached ms | speed-up | bytes kept | digest ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['decoder']} | {r['target']} | {r['codes_per_target']:.0f} | {r['encode_ms']:.2f} | {r['first_epoch_ms']:.2f} | "
            f"{r['cached_ms']:.3f} | {r['speedup']:.0f}x | {r['bytes_per_target']:.0f} | {r['digest_ms']:.3f} |"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
