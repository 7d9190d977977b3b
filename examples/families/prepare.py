#!/usr/bin/env python3
"""Data and a stand-in checkpoint for the Qwen2-VL fine-tuning recipe (``run.sh`` next to this file).

Two things are written, both deterministic for given arguments:

* ``--checkpoint`` (default ``examples/qwen2_vl/standin``): a tiny random
  ``Qwen2VLForConditionalGeneration`` (``Qwen2_5_VLForConditionalGeneration`` with ``--family
  qwen2_5_vl``, ``Qwen3VLForConditionalGeneration`` with ``--family qwen3_vl``) with its tokenizer,
  chat template and processor, saved with ``save_pretrained`` by the family plugin's
  ``save_standin``. It has the layout of the published checkpoints (``Qwen/Qwen2-VL-2B-Instruct``),
  at toy size and with random weights; nothing is downloaded. Skipped when the folder already holds
  a ``config.json`` of the same model type (a real checkpoint put there is kept); refused when its
  model type is another one, so a switch of ``--family`` never trains the old model.
* ``--out`` (default ``examples/qwen2_vl/data``): ``train.jsonl`` and ``eval.jsonl`` in omnicore's
  chat format, and their PNG images. Each image is a filled square of one of :data:`COLOURS` at a
  random place and size on a grey background; the user asks "What colour is the square?", the
  assistant answers the colour's name. Every sample holds one image, to keep the recipe small; the
  family itself takes any number of images and videos per sample.

Only numpy and PIL are needed for the data. Usage::

    python examples/qwen2_vl/prepare.py [--family qwen2_vl] [--checkpoint DIR] [--train 400] [--eval 40] [--seed 0]

The foundation that reads the stand-in is ``qwen2_vl`` for ``qwen2_vl`` and ``qwen2_5_vl``, and
``qwen3_vl`` for ``qwen3_vl`` (:data:`FOUNDATIONS`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 220), "yellow": (230, 210, 40)}
"""Answer -> RGB fill of the square."""
QUESTION = "What colour is the square?"
FOUNDATIONS = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl", "qwen3_vl": "qwen3_vl"}
"""``--family`` (the stand-in's ``model_type``) -> the ``model.foundation.name`` that reads it."""


def draw(rng: np.random.Generator, colour: tuple[int, int, int], size: int) -> Image.Image:
    """A ``size`` x ``size`` RGB image: grey (128) with one filled square of ``colour``, its side
    between a quarter and a half of ``size``, at a random place."""
    img = np.full((size, size, 3), 128, dtype=np.uint8)
    side = int(rng.integers(size // 4, size // 2 + 1))
    y, x = (int(v) for v in rng.integers(0, size - side + 1, 2))
    img[y : y + side, x : x + side] = colour
    return Image.fromarray(img)


def write_split(out: Path, split: str, n: int, rng: np.random.Generator, size: int) -> int:
    """``n`` samples of ``split`` into ``out/<split>.jsonl`` and ``out/images/<split>_NNNNN.png``;
    returns ``n``. Images are written only when their bytes change."""
    (out / "images").mkdir(parents=True, exist_ok=True)
    names = list(COLOURS)
    rows = []
    for i in range(n):
        answer = names[int(rng.integers(len(names)))]
        rel = f"images/{split}_{i:05d}.png"
        path = out / rel
        img = draw(rng, COLOURS[answer], size)
        if not path.is_file() or not np.array_equal(np.asarray(Image.open(path).convert("RGB")), np.asarray(img)):
            img.save(path)
        rows.append(
            {
                "task": "colour",
                "messages": [
                    {"role": "user", "content": [{"type": "image", "path": rel}, {"type": "text", "text": QUESTION}]},
                    {"role": "assistant", "content": [{"type": "text", "text": answer}]},
                ],
            }
        )
    (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=tuple(FOUNDATIONS), default="qwen2_vl", help="the stand-in's model type")
    ap.add_argument("--checkpoint", type=Path, default=HERE / "standin", help="where the stand-in checkpoint goes")
    ap.add_argument("--out", type=Path, default=HERE / "data", help="where the JSONL and images go")
    ap.add_argument("--train", type=int, default=400, help="training samples")
    ap.add_argument("--eval", type=int, default=40, help="held-out samples")
    ap.add_argument("--size", type=int, default=56, help="image side in pixels (the processor resizes as published)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    config = args.checkpoint / "config.json"
    if config.is_file():
        held = json.loads(config.read_text()).get("model_type")
        if held != args.family:
            print(
                f"prepare.py: {args.checkpoint} already holds a {held!r} checkpoint, not {args.family!r} (--family); "
                f"give another --checkpoint folder, or delete {args.checkpoint} to write a {args.family} stand-in there",
                file=sys.stderr,
            )
            return 2
        print(f"checkpoint: {args.checkpoint} already holds a {held} config.json, kept")
    else:
        plugin = "omnicore_family_qwen3_vl" if args.family == "qwen3_vl" else "omnicore_family_qwen2_vl"
        try:
            standin = importlib.import_module(f"{plugin}.standin")
        except ImportError:
            print(f"prepare.py: {plugin} (the {args.family} family) is not installed; run `bash scripts/setup.sh` first", file=sys.stderr)
            return 2
        if args.family == "qwen3_vl":
            standin.save_standin(args.checkpoint, seed=args.seed)
        else:
            standin.save_standin(args.checkpoint, family=args.family, seed=args.seed)
        print(f"checkpoint: a tiny random {args.family} stand-in in {args.checkpoint} (foundation {FOUNDATIONS[args.family]})")
    rng = np.random.default_rng(args.seed)
    n_train = write_split(args.out, "train", args.train, rng, args.size)
    n_eval = write_split(args.out, "eval", args.eval, rng, args.size)
    print(f"data: {n_train} training and {n_eval} held-out samples in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
