#!/usr/bin/env python3
"""How well the trained model draws digits, judged by a classifier trained apart from it.

Two steps, both on CPU:

``fit``
    Trains a small convolutional classifier (two 3x3 conv layers, max-pooling, two linear layers;
    the LeNet family, LeCun et al. 1998) on the training images the omni model may see (MNIST
    indices 0-8999 of the shipped file), reports its accuracy on the held-out images (9000-9999)
    and saves it as ``JUDGE/model.safetensors`` with ``JUDGE/judge.json``. It never sees anything
    the omni model generated.
``score``
    Runs ``omnicore generate`` with "Draw the digit D." for D = 0..9, ``--num-samples`` samples each
    (sampled, so the drawings differ), classifies every PNG, and writes ``RUN_DIR/drawn.json``
    (per digit: how many were recognised as that digit, and what they were taken for). Prints the
    overall and per-digit rate.

Usage (the example's ``run.sh`` does both)::

    python examples/digits/judge_drawn.py fit [--judge examples/digits/data/judge]
    python examples/digits/judge_drawn.py score --config examples/digits/config.yaml \\
        --export runs/digits/export [--num-samples 10 --temperature 1.0 --top-k 0 --seed 0]

Images are read as greyscale 28 x 28 (resized if the decoder draws another size), scaled to [0, 1].
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_data import DEFAULT_RAW, MNIST_EVAL, MNIST_TRAIN, load_mnist  # noqa: E402

DEFAULT_JUDGE = HERE / "data" / "judge"
PROMPT = "Draw the digit {d}."


def build_classifier():
    """The judge: ``[B, 1, 28, 28]`` pixels in [0, 1] -> ``[B, 10]`` logits."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def _batches(x, y, size: int, rng: np.random.Generator):
    order = rng.permutation(len(x))
    for b in range(0, len(x), size):
        idx = order[b : b + size]
        yield x[idx], y[idx]


def accuracy(model, x, y) -> float:
    """Share of ``x`` (``[N, 1, 28, 28]`` float tensor) classified as ``y`` (``[N]`` int64 tensor)."""
    import torch

    with torch.no_grad():
        pred = torch.cat([model(x[b : b + 500]).argmax(-1) for b in range(0, len(x), 500)])
    return float((pred == y).float().mean())


def fit(judge: Path, raw: Path, epochs: int, seed: int) -> dict:
    """Train the judge on MNIST 0-8999 (random shifts of up to 2 pixels), test it on 9000-9999."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    images, labels = load_mnist(raw)
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    tr, ev = slice(MNIST_TRAIN.start, MNIST_TRAIN.stop), slice(MNIST_EVAL.start, MNIST_EVAL.stop)
    model = build_classifier()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    t0 = time.perf_counter()
    for _ in range(epochs):
        for xb, yb in _batches(x[tr], y[tr], 64, rng):
            dx, dy = (int(v) for v in rng.integers(-2, 3, size=2))
            xb = torch.roll(xb, shifts=(dy, dx), dims=(2, 3))
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    info = {
        "trained_on": f"MNIST {MNIST_TRAIN.start}-{MNIST_TRAIN.stop - 1}",
        "heldout": f"MNIST {MNIST_EVAL.start}-{MNIST_EVAL.stop - 1}",
        "heldout_accuracy": round(accuracy(model, x[ev], y[ev]), 4),
        "epochs": epochs,
        "seed": seed,
        "fit_seconds": round(time.perf_counter() - t0, 1),
    }
    judge.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(judge / "model.safetensors"))
    (judge / "judge.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def load_judge(judge: Path):
    """The fitted judge (eval mode); raises SystemExit naming the command when it is missing."""
    from safetensors.torch import load_file

    path = judge / "model.safetensors"
    if not path.is_file():
        raise SystemExit(f"error: {path}: no fitted judge; run: python {Path(__file__).name} fit --judge {judge}")
    model = build_classifier()
    model.load_state_dict(load_file(str(path)))
    return model.eval()


def read_png(path: Path) -> np.ndarray:
    """A generated PNG as ``[28, 28]`` float32 greyscale in [0, 1]."""
    img = Image.open(path).convert("L")
    if img.size != (28, 28):
        img = img.resize((28, 28), Image.BILINEAR)
    return np.asarray(img, dtype=np.float32) / 255.0


def generate(args: argparse.Namespace, out: Path) -> dict[int, list[Path]]:
    """Run ``omnicore generate`` for the ten prompts; the PNGs drawn for each digit."""
    cmd = [str(Path(sys.executable).with_name("omnicore")), "generate", args.config, "--out", str(out), "--force"]
    cmd += ["--export", args.export]
    for d in range(10):
        cmd += ["--prompt", PROMPT.format(d=d)]
    cmd += ["--num-samples", str(args.num_samples), "--temperature", str(args.temperature), "--top-k", str(args.top_k)]
    cmd += ["--seed", str(args.seed), *args.overrides]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: omnicore generate failed ({done.returncode}):\n{done.stderr[-2000:]}")
    drawn: dict[int, list[Path]] = {}
    for d in range(10):
        drawn[d] = sorted(out.glob(f"generated-p{d + 1}-s*-image-0.png"))
    return drawn


def score(args: argparse.Namespace) -> dict:
    """Generate, classify and write ``drawn.json``; returns its content."""
    import torch

    model = load_judge(Path(args.judge))
    run_dir = Path(args.out or Path(args.export).parent)
    out = run_dir / "drawn"
    shutil.rmtree(out, ignore_errors=True)  # our own folder: no drawing of an earlier score is counted
    drawn = generate(args, out)
    per_digit, right, total = {}, 0, 0
    for d, paths in drawn.items():
        if not paths:
            per_digit[str(d)] = {"drawn": 0, "recognised": 0, "taken_for": {}}
            total += args.num_samples  # an answer without an image counts as wrong
            continue
        x = torch.from_numpy(np.stack([read_png(p) for p in paths])).unsqueeze(1)
        with torch.no_grad():
            pred = model(x).argmax(-1).tolist()
        ok = sum(p == d for p in pred)
        taken = {str(k): pred.count(k) for k in sorted(set(pred))}
        per_digit[str(d)] = {"drawn": len(paths), "recognised": ok, "taken_for": taken}
        right += ok
        total += max(len(paths), args.num_samples)
    result = {
        "recognised": round(right / total, 4),
        "samples": total,
        "sampling": {"num_samples": args.num_samples, "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed},
        "judge": json.loads((Path(args.judge) / "judge.json").read_text()),
        "per_digit": per_digit,
    }
    (run_dir / "drawn.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="train the judge on MNIST 0-8999")
    f.add_argument("--judge", default=str(DEFAULT_JUDGE))
    f.add_argument("--raw", default=str(DEFAULT_RAW))
    f.add_argument("--epochs", type=int, default=6)
    f.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("score", help="generate 'Draw the digit D.' and classify the drawings")
    s.add_argument("--judge", default=str(DEFAULT_JUDGE))
    s.add_argument("--config", required=True)
    s.add_argument("--export", required=True, help="the trained model's export folder (RUN_DIR/export)")
    s.add_argument("--out", help="run folder for drawn/ and drawn.json (default: the export's parent, RUN_DIR)")
    s.add_argument("--num-samples", type=int, default=10)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("overrides", nargs="*", help="config overrides passed to omnicore generate (after --)")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    if args.cmd == "fit":
        info = fit(Path(args.judge), Path(args.raw), args.epochs, args.seed)
        print(f"judge: held-out accuracy {info['heldout_accuracy']:.4f} on {info['heldout']} ({info['fit_seconds']} s)")
        return 0
    r = score(args)
    per = "  ".join(f"{d}:{v['recognised']}/{v['drawn']}" for d, v in r["per_digit"].items())
    print(f"drawn digits recognised by the judge: {r['recognised']:.3f} of {r['samples']} ({per})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
