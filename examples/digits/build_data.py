#!/usr/bin/env python3
"""Build the "digits" example data set (JSONL + PNG) from the files shipped in ``raw/``.

Three tasks about the ten digits, in the chat ``messages`` format with typed content parts:

* ``image_to_text``  - a handwritten MNIST digit (PNG) -> the digit as one character
* ``audio_to_text``  - a spoken FSDD digit (8 kHz mono WAV) -> the digit as one character
* ``text_to_image``  - "Draw the digit 7." -> an MNIST image of that digit

Splits (see README.md):

* MNIST: only the 10,000-image *test* set is shipped. Indices 0..8999 are used for training and
  9000..9999 are held out for evaluation (a deviation from MNIST's official train/test split).
* FSDD: takes 0-4 are the official test split (eval), takes 5-24 of the official training takes
  5-49 are shipped and used for training.

Only the standard library, numpy, pillow and soundfile are needed. Usage::

    python examples/digits/build_data.py [--out examples/digits/data] [--seed 0] ...

The output is deterministic for given arguments, and re-running rewrites nothing that is unchanged.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import random
import re
import struct
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
DEFAULT_RAW = HERE / "raw"
DEFAULT_OUT = HERE / "data"

MNIST_IMAGES = "mnist/t10k-images-idx3-ubyte.gz"
MNIST_LABELS = "mnist/t10k-labels-idx1-ubyte.gz"
MNIST_FIRST_LABELS = [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
MNIST_TRAIN = range(0, 9000)  # deviation: MNIST *test* images used for training
MNIST_EVAL = range(9000, 10000)  # held out by index
FSDD_DIR = "fsdd/recordings"
FSDD_NAME = re.compile(r"^([0-9])_([a-z]+)_([0-9]+)\.wav$")
FSDD_TEST_TAKES = range(0, 5)  # official FSDD test split
FSDD_TRAIN_TAKES = range(5, 25)  # subset of the official training takes 5-49 that is shipped

PROMPT_IMAGE = "Which digit is this?"
PROMPT_AUDIO = "Which digit is spoken?"
PROMPT_DRAW = "Draw the digit {d}."
TASKS = ("image_to_text", "audio_to_text", "text_to_image")
DIGITS = [str(d) for d in range(10)]
PNG_NAME = re.compile(r"^[0-9]{5}\.png$")


class DataError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- readers


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Read a gzip-compressed IDX file (big-endian header), checking its magic number."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as e:
        raise DataError(f"{path}: not a readable gzip file ({e})") from None
    if len(data) < 8:
        raise DataError(f"{path}: too short to be an IDX file ({len(data)} bytes)")
    (got,) = struct.unpack(">i", data[:4])
    if got != magic:
        raise DataError(f"{path}: bad IDX magic number {got}, expected {magic}")
    ndim = data[3]
    dims = struct.unpack(">" + "i" * ndim, data[4 : 4 + 4 * ndim])
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims))
    if len(data) - offset != expected:
        raise DataError(f"{path}: header says {dims} ({expected} bytes) but payload has {len(data) - offset} bytes")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def load_mnist(raw: Path) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(raw / MNIST_IMAGES, 2051)
    labels = read_idx(raw / MNIST_LABELS, 2049)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(f"{raw / MNIST_IMAGES}: expected N x 28 x 28 images, got shape {images.shape}")
    if len(images) != len(labels):
        raise DataError(f"MNIST: {len(images)} images but {len(labels)} labels")
    if len(images) != 10000:
        raise DataError(f"MNIST: expected the 10,000-image test set, got {len(images)} images")
    if labels.max() > 9:
        raise DataError(f"{raw / MNIST_LABELS}: label {labels.max()} out of range 0-9")
    first = labels[:10].tolist()
    if first != MNIST_FIRST_LABELS:
        raise DataError(
            f"{raw / MNIST_LABELS}: first labels are {first}, expected {MNIST_FIRST_LABELS}; "
            "the file is not the MNIST t10k set or was decoded wrongly"
        )
    return images, labels


def load_fsdd(raw: Path) -> list[tuple[str, int, Path]]:
    """Return (digit, take, path) for every recording named ``{digit}_{speaker}_{take}.wav``."""
    folder = raw / FSDD_DIR
    if not folder.is_dir():
        raise DataError(f"{folder}: FSDD recordings folder not found")
    out = []
    for name in sorted(os.listdir(folder)):
        m = FSDD_NAME.match(name)
        if m:
            out.append((m.group(1), int(m.group(3)), folder / name))
    if not out:
        raise DataError(f"{folder}: no recordings named {{digit}}_{{speaker}}_{{take}}.wav")
    return out


def check_wavs(paths: list[Path]) -> None:
    import soundfile as sf

    for p in paths:
        try:
            info = sf.info(str(p))
        except Exception as e:  # noqa: BLE001 - soundfile raises its own error types
            raise DataError(f"{p}: unreadable WAV ({e})") from None
        if info.samplerate != 8000 or info.channels != 1:
            raise DataError(f"{p}: expected 8 kHz mono, got {info.samplerate} Hz x {info.channels} channels")


# ----------------------------------------------------------------------------- writers


def write_if_changed(path: Path, data: bytes) -> bool:
    """Write ``data`` atomically unless the file already holds exactly it. Returns True if written."""
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def png_bytes(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    # A 2-D uint8 array becomes a greyscale ("L") image.
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(buf, format="PNG")
    data = buf.getvalue()
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise DataError("PNG encoding produced no valid PNG data")
    return data


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def rel(path: Path, start: Path) -> str:
    """Path of ``path`` relative to ``start`` with forward slashes (absolute if not possible)."""
    try:
        return os.path.relpath(path, start).replace(os.sep, "/")
    except ValueError:  # e.g. different drives on Windows
        return path.resolve().as_posix()


# ----------------------------------------------------------------------------- samples


def image_to_text(img: str, digit: str) -> dict:
    return {
        "task": "image_to_text",
        "messages": [
            {"role": "user", "content": [{"type": "image", "path": img}, {"type": "text", "text": PROMPT_IMAGE}]},
            {"role": "assistant", "content": [{"type": "text", "text": digit}]},
        ],
    }


def audio_to_text(wav: str, digit: str) -> dict:
    return {
        "task": "audio_to_text",
        "messages": [
            {"role": "user", "content": [{"type": "audio", "path": wav}, {"type": "text", "text": PROMPT_AUDIO}]},
            {"role": "assistant", "content": [{"type": "text", "text": digit}]},
        ],
    }


def text_to_image(digit: str, img: str | None) -> dict:
    messages = [{"role": "user", "content": [{"type": "text", "text": PROMPT_DRAW.format(d=digit)}]}]
    if img is not None:
        messages.append({"role": "assistant", "content": [{"type": "image", "path": img}]})
    return {"task": "text_to_image", "messages": messages}


def answer_digit(row: dict) -> str:
    """The digit a row is about (for stats): the assistant text, or the digit in the prompt."""
    if row["task"] == "text_to_image":
        return row["messages"][0]["content"][0]["text"][len("Draw the digit ")]
    return row["messages"][-1]["content"][0]["text"]


def sample(rng: random.Random, pool: list, n: int, what: str) -> list:
    if n < 0:
        raise DataError(f"{what}: count must be >= 0, got {n}")
    if n > len(pool):
        raise DataError(f"{what}: asked for {n} but only {len(pool)} are available")
    return sorted(rng.sample(pool, n))


def split_stats(rows: list[dict], split: str, problems: list[str], warnings: list[str]) -> dict:
    out = {}
    for task in TASKS:
        digits = Counter(answer_digit(r) for r in rows if r["task"] == task)
        n = sum(digits.values())
        if n == 0:
            continue
        missing = [d for d in DIGITS if d not in digits]
        if missing:
            msg = f"{split}/{task}: no samples of digit(s) {', '.join(missing)} among {n}"
            # With very small smoke-test sizes a random draw can miss a digit; at real sizes it is a bug.
            (problems if n >= 50 else warnings).append(msg)
        out[task] = {"count": n, "digits": {d: digits.get(d, 0) for d in DIGITS}}
    return {"count": len(rows), "tasks": out}


# ----------------------------------------------------------------------------- main


def build(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    raw = Path(args.raw).resolve()
    out = Path(args.out).resolve()
    img_dir = out / "images"
    img_dir.mkdir(parents=True, exist_ok=True)

    images, labels = load_mnist(raw)
    fsdd = load_fsdd(raw)
    fsdd_train = [(d, p) for d, take, p in fsdd if take in FSDD_TRAIN_TAKES]
    fsdd_test = [(d, p) for d, take, p in fsdd if take in FSDD_TEST_TAKES]

    # One RNG stream per choice, so that changing one count does not reshuffle the others.
    def rng(tag: str) -> random.Random:
        return random.Random(f"{args.seed}:{tag}")

    tr_img = sample(rng("train-images"), list(MNIST_TRAIN), args.train_images, "--train-images")
    gen_img = sample(rng("gen"), list(MNIST_TRAIN), args.gen, "--gen")
    ev_img = sample(rng("eval-images"), list(MNIST_EVAL), args.eval_images, "--eval-images")
    tr_wav = sample(rng("train-audio"), fsdd_train, args.train_audio, "--train-audio (FSDD takes 5-24 shipped)")
    ev_wav = sample(rng("eval-audio"), fsdd_test, args.eval_audio, "--eval-audio (FSDD takes 0-4)")
    check_wavs([p for _, p in tr_wav + ev_wav])

    def png(i: int) -> str:
        return f"images/{i:05d}.png"

    train = [image_to_text(png(i), str(labels[i])) for i in tr_img]
    train += [audio_to_text(rel(p, out), d) for d, p in tr_wav]
    train += [text_to_image(str(labels[i]), png(i)) for i in gen_img]
    rng("shuffle-train").shuffle(train)
    evals = [image_to_text(png(i), str(labels[i])) for i in ev_img]
    evals += [audio_to_text(rel(p, out), d) for d, p in ev_wav]
    rng("shuffle-eval").shuffle(evals)
    gen_prompts = [text_to_image(d, None) for d in DIGITS]

    # PNGs: write the ones referenced, leave identical ones alone, remove stale ones from older runs.
    needed = sorted(set(tr_img) | set(gen_img) | set(ev_img))
    written = 0
    for i in needed:
        written += write_if_changed(img_dir / f"{i:05d}.png", png_bytes(images[i]))
    keep = {f"{i:05d}.png" for i in needed}
    stale = [n for n in os.listdir(img_dir) if PNG_NAME.match(n) and n not in keep]
    for n in stale:
        (img_dir / n).unlink()

    problems: list[str] = []
    warnings: list[str] = []
    stats = {
        "seed": args.seed,
        "splits": {
            "train": split_stats(train, "train", problems, warnings),
            "eval": split_stats(evals, "eval", problems, warnings),
            "eval_generate": split_stats(gen_prompts, "eval_generate", problems, warnings),
        },
        "images": len(needed),
        "sources": {
            "mnist": {
                "files": [MNIST_IMAGES, MNIST_LABELS],
                "train_indices": [MNIST_TRAIN.start, MNIST_TRAIN.stop - 1],
                "eval_indices": [MNIST_EVAL.start, MNIST_EVAL.stop - 1],
                "note": "only MNIST's 10,000-image test set is shipped; its first 9,000 images are used for "
                "training and the last 1,000 are held out (not MNIST's official split)",
                "license": "CC BY-SA 3.0",
            },
            "fsdd": {
                "folder": FSDD_DIR,
                "train_takes": [FSDD_TRAIN_TAKES.start, FSDD_TRAIN_TAKES.stop - 1],
                "eval_takes": [FSDD_TEST_TAKES.start, FSDD_TEST_TAKES.stop - 1],
                "available": {"train": len(fsdd_train), "eval": len(fsdd_test)},
                "license": "CC BY-SA 4.0",
            },
        },
    }
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if problems:
        raise DataError("digit coverage check failed:\n  " + "\n  ".join(problems))

    files = {
        "train.jsonl": jsonl_bytes(train),
        "eval.jsonl": jsonl_bytes(evals),
        "eval_generate.jsonl": jsonl_bytes(gen_prompts),
        "stats.json": (json.dumps(stats, indent=2) + "\n").encode("utf-8"),
    }
    changed = {name: write_if_changed(out / name, data) for name, data in files.items()}

    def counts(split: str) -> str:
        t = stats["splits"][split]["tasks"]
        return ", ".join(f"{k} {v['count']}" for k, v in t.items())

    shown = os.path.relpath(out) if not os.path.relpath(out).startswith("..") else str(out)

    def line(name: str, text: str) -> None:
        flag = "" if changed.get(name, True) else "  [unchanged]"
        print(f"  {name:<20} {text}{flag}")

    print(f"wrote {shown}/")
    line("train.jsonl", f"{len(train):5d} lines ({counts('train')})")
    line("eval.jsonl", f"{len(evals):5d} lines ({counts('eval')})")
    line("eval_generate.jsonl", f"{len(gen_prompts):5d} lines (text_to_image prompts, one per digit)")
    line("stats.json", "counts and digit distribution per split and task")
    kept = len(needed) - written
    line("images/", f"{len(needed):5d} PNGs ({written} written, {kept} unchanged, {len(stale)} stale removed)")
    n_wav = len(tr_wav) + len(ev_wav)
    print(f"  audio: {n_wav} WAVs used in place from {rel(raw / FSDD_DIR, out)}/ (paths relative to {shown}/)")
    print(f"done in {time.perf_counter() - t0:.2f} s")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = p.add_argument
    add("--out", default=str(DEFAULT_OUT), help="output folder")
    add("--raw", default=str(DEFAULT_RAW), help="folder with the shipped mnist/ and fsdd/ sources")
    add("--train-images", type=int, default=9000, help="image_to_text train samples (MNIST indices 0-8999)")
    add("--train-audio", type=int, default=1200, help="audio_to_text train samples (FSDD takes 5-24, 1200 shipped)")
    add("--gen", type=int, default=3000, help="text_to_image train samples (MNIST indices 0-8999)")
    add("--eval-images", type=int, default=500, help="image_to_text eval samples (MNIST indices 9000-9999)")
    add("--eval-audio", type=int, default=300, help="audio_to_text eval samples (FSDD takes 0-4, 300 shipped)")
    add("--seed", type=int, default=0, help="seed for sampling and shuffling")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return build(args)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
