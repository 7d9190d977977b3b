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

    python examples/digits/judge_drawn.py fit [--judge examples/digits/judges/drawn]
    python examples/digits/judge_drawn.py score --config examples/digits/config.yaml \\
        --export runs/digits/export [--num-samples 10 --temperature 1.0 --top-k 0 --seed 0]

Images are read as greyscale 28 x 28 (resized if the decoder draws another size), scaled to [0, 1].
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_data import DEFAULT_RAW, MNIST_EVAL, MNIST_TRAIN, load_mnist  # noqa: E402
from judging import (  # noqa: E402
    add_generate_args,
    generate_per_digit,
    load_judge,
    per_digit_line,
    run_dir_of,
    sampling_of,
    save_judge,
    tally,
    wrong_kind_line,
)

DEFAULT_JUDGE = HERE / "judges" / "drawn"  # shipped fitted (a fresh clone need not fit it); `fit` writes it again
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
    save_judge(judge, model, info)
    return info


def read_png(path: Path) -> np.ndarray:
    """A generated PNG as ``[28, 28]`` float32 greyscale in [0, 1]."""
    img = Image.open(path).convert("L")
    if img.size != (28, 28):
        img = img.resize((28, 28), Image.BILINEAR)
    return np.asarray(img, dtype=np.float32) / 255.0


def score(args: argparse.Namespace) -> dict:
    """Generate, classify and write ``drawn.json``; returns its content."""
    import torch

    model = load_judge(Path(args.judge), build_classifier, Path(__file__).name)
    run_dir = run_dir_of(args)
    out = run_dir / "drawn"
    shutil.rmtree(out, ignore_errors=True)  # our own folder: no drawing of an earlier score is counted
    taken: dict[int, list[int]] = {}
    files, wrong = generate_per_digit(args, out, PROMPT, "image-0.png")
    for d, paths in files.items():
        taken[d] = []
        if paths:
            x = torch.from_numpy(np.stack([read_png(p) for p in paths])).unsqueeze(1)
            with torch.no_grad():
                taken[d] = model(x).argmax(-1).tolist()
    result = tally(taken, args.num_samples, "drawn", wrong)
    result.update(sampling=sampling_of(args), judge=json.loads((Path(args.judge) / "judge.json").read_text()))
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
    add_generate_args(s, "drawn")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    if args.cmd == "fit":
        info = fit(Path(args.judge), Path(args.raw), args.epochs, args.seed)
        print(f"judge: held-out accuracy {info['heldout_accuracy']:.4f} on {info['heldout']} ({info['fit_seconds']} s)")
        return 0
    r = score(args)
    print(f"drawn digits recognised by the judge: {r['recognised']:.3f} of {r['samples']} ({per_digit_line(r['per_digit'], 'drawn')})")
    if line := wrong_kind_line(r, "image"):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
