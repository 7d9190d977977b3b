#!/usr/bin/env python3
"""Data and a stand-in checkpoint for the family fine-tuning recipe (``run.sh`` next to this file).

Two things are written, both deterministic for given arguments:

* ``--checkpoint`` (default ``examples/families/standins/<family>``): a tiny random checkpoint of
  model type ``--family`` (default ``qwen2_vl``), written by the family kit's
  :func:`omnicore_family_kit.standins.save_standin`: the model type's transformers class
  (``Qwen2VLForConditionalGeneration``, ``LlavaNextForConditionalGeneration``, ...) saved with
  ``save_pretrained``, a byte-level tokenizer with the model's special tokens and a chat template in
  its published style, and the model's own processor class. It has the layout of the published
  checkpoints at toy size, with random weights; nothing is downloaded. Skipped when the folder
  already holds a ``config.json`` of the same model type (a real checkpoint put there is kept);
  refused when its model type is another one, so a switch of ``--family`` never trains the old
  model. Then the foundation that ``model.foundation: {name: auto}`` picks for the folder is built
  (from ``config.json`` alone, no weights): its name, class and part names are printed, and a model
  type that no installed family serves exactly stops here with the family's reason.
* ``--out`` (default ``examples/families/data``): ``train.jsonl`` and ``eval.jsonl`` in omnicore's
  chat format, and their PNG images. Each image is a filled square of one of :data:`COLOURS` at a
  random place and size on a grey background; the user asks "What colour is the square?", the
  assistant answers the colour's name. Every sample holds one image, to keep the recipe small.

``--family`` takes the image model types the kit has stand-ins of (:func:`image_model_types`);
``--list`` prints, for each, the foundation ``auto`` picks or the reason it is refused.
``--data-only`` writes the data alone (for a published checkpoint given by Hub name). Usage::

    python examples/families/prepare.py [--family qwen2_vl] [--checkpoint DIR] [--train 400] [--eval 40] [--seed 0]
    python examples/families/prepare.py --list
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 220), "yellow": (230, 210, 40)}
"""Answer -> RGB fill of the square."""
QUESTION = "What colour is the square?"
DEFAULT_FAMILY = "qwen2_vl"
"""The model type ``--family`` (and ``run.sh``'s ``FAMILY``) defaults to."""
SETUP = "run `bash scripts/setup.sh` (or pip install omnicore-family-kit) first"


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


def image_model_types() -> tuple[str, ...]:
    """The model types of the family kit's stand-ins that take images
    (``omnicore_family_kit.standins.STANDINS``), in the kit's order: the values ``--family`` takes.
    Whether omnicore serves each one exactly is the installed families' answer (:func:`serving`).

    Raises:
        ImportError: omnicore-family-kit is not installed.
    """
    from omnicore_family_kit.standins import STANDINS

    return tuple(t for t, s in STANDINS.items() if s.modality == "image")


class Served(NamedTuple):
    """Who serves a checkpoint folder: ``foundation`` (the name ``auto`` resolves to), the class in
    its ``config.json``'s ``architectures`` (``class_name``), and the family's part names for
    ``train.freeze`` / ``train.lr_multipliers`` (``parts``)."""

    foundation: str
    class_name: str
    parts: tuple[str, ...]


def serving(folder: Path) -> Served:
    """Build the foundation that ``model.foundation: {name: auto, options: {checkpoint: folder}}``
    picks (from ``config.json`` and the processor files; no weights are read).

    Raises:
        ValueError, omnicore.api.RegistryError: no installed family serves the folder's model type
            exactly; the message is the family's, with its reason.
    """
    from omnicore.api import Registry

    registry = Registry.discover()
    config = json.loads((folder / "config.json").read_text())
    name = registry.foundation_for(config["model_type"])
    foundation = registry.build("foundation", name, {"checkpoint": str(folder)})
    parts = getattr(foundation, "part_names", None)
    return Served(name, ", ".join(config.get("architectures") or ["?"]), tuple(parts()) if callable(parts) else ())


def write_checkpoint(family: str, folder: Path, seed: int) -> int:
    """The stand-in of ``family`` in ``folder`` (kept where a ``config.json`` of that model type is
    there), checked by :func:`serving`; returns 0, or 2 after printing why not: another model type
    is in the folder, the kit is missing, or no installed family serves ``family`` exactly (a
    stand-in written here is then removed)."""
    config = folder / "config.json"
    wrote = False
    if config.is_file():
        held = json.loads(config.read_text()).get("model_type")
        if held != family:
            print(
                f"prepare.py: {folder} already holds a {held!r} checkpoint, not {family!r} (--family); "
                f"give another --checkpoint folder, or delete {folder} to write a {family} stand-in there",
                file=sys.stderr,
            )
            return 2
        print(f"checkpoint: {folder} already holds a {held} config.json, kept")
    else:
        from transformers.utils.logging import disable_progress_bar

        from omnicore_family_kit.standins import save_standin

        disable_progress_bar()  # save_pretrained's bar of one shard
        save_standin(family, folder, seed=seed)
        wrote = True
        print(f"checkpoint: a tiny random {family} stand-in in {folder}")
    from omnicore.api import RegistryError

    try:
        served = serving(folder)
    except (ValueError, RegistryError) as exc:
        if wrote:
            shutil.rmtree(folder)
        print(f"prepare.py: {family}: {exc}", file=sys.stderr)
        return 2
    print(f"foundation: auto picks {served.foundation} ({served.class_name})")
    print(f"part names for train.freeze: {', '.join(served.parts) or 'none'}")
    return 0


def list_types(seed: int) -> int:
    """Print each of :func:`image_model_types` with the foundation ``auto`` picks for its stand-in
    (written to a temporary folder) and its class, or ``refused`` and the reason; returns 0."""
    from transformers.utils.logging import disable_progress_bar

    from omnicore.api import RegistryError
    from omnicore_family_kit.standins import save_standin

    disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        for family in image_model_types():
            folder = save_standin(family, Path(tmp) / family, seed=seed)
            try:
                served = serving(folder)
            except (ValueError, RegistryError) as exc:
                reason = str(exc).split("cannot serve it exactly: ")[-1]
                print(f"{family}: refused: {reason}")
            else:
                print(f"{family}: {served.foundation} ({served.class_name}); parts {', '.join(served.parts)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default=DEFAULT_FAMILY, help="the stand-in's model type (--list shows them)")
    ap.add_argument("--checkpoint", type=Path, help="where the stand-in goes (default: examples/families/standins/<family>)")
    ap.add_argument("--data-only", action="store_true", help="write the data only (the checkpoint is a published one)")
    ap.add_argument("--list", action="store_true", help="print each model type, the foundation auto picks or why none does")
    ap.add_argument("--out", type=Path, default=HERE / "data", help="where the JSONL and images go")
    ap.add_argument("--train", type=int, default=400, help="training samples")
    ap.add_argument("--eval", type=int, default=40, help="held-out samples")
    ap.add_argument("--size", type=int, default=56, help="image side in pixels (the processor resizes as published)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.data_only:
        try:
            types = image_model_types()
        except ImportError:
            print(f"prepare.py: omnicore-family-kit (the stand-ins and the generic family) is not installed; {SETUP}", file=sys.stderr)
            return 2
        if args.list:
            return list_types(args.seed)
        if args.family not in types:
            print(f"prepare.py: --family {args.family!r} has no stand-in; choose one of {', '.join(types)}", file=sys.stderr)
            return 2
        status = write_checkpoint(args.family, args.checkpoint or HERE / "standins" / args.family, args.seed)
        if status:
            return status
    rng = np.random.default_rng(args.seed)
    n_train = write_split(args.out, "train", args.train, rng, args.size)
    n_eval = write_split(args.out, "eval", args.eval, rng, args.size)
    print(f"data: {n_train} training and {n_eval} held-out samples in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
