#!/usr/bin/env python3
"""Build the "digits" example data set (JSONL + PNG) from the files shipped in ``raw/``.

Five tasks about the ten digits, in the chat ``messages`` format with typed content parts; the
first three are built by default (``config.yaml``), the last two on request (``five.yaml``):

* ``image_to_text``  - a handwritten MNIST digit (PNG) -> the digit as one character
* ``audio_to_text``  - a spoken FSDD digit (8 kHz mono WAV) -> the digit as one character
* ``text_to_image``  - "Draw the digit 7." -> an MNIST image of that digit
* ``text_to_speech`` - "Say the digit 7." -> an FSDD recording of that digit (``--speak``, ``--eval-speak``)
* ``video_to_text``  - a Moving MNIST clip of 2-3 digits (``make_videos.py``) -> "3 7 1", the digits
  left to right (``--videos``, ``--eval-videos``)

Splits (see README.md):

* MNIST: only the 10,000-image *test* set is shipped. Indices 0..8999 are used for training and
  9000..9999 are held out for evaluation (a deviation from MNIST's official train/test split); the
  video clips follow the same split.
* FSDD: takes 0-4 are the official test split (eval), takes 5-24 of the official training takes
  5-49 are shipped and used for training (both for ``audio_to_text`` and ``text_to_speech``).

Only the standard library, numpy, pillow and soundfile are needed (and PyAV for ``--videos``). Usage::

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
PROMPT_SAY = "Say the digit {d}."
TASKS = ("image_to_text", "audio_to_text", "text_to_image", "text_to_speech", "video_to_text")
PROMPTED = ("text_to_image", "text_to_speech")  # tasks whose digit is in the prompt ("... the digit 7.")
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


def text_to_speech(digit: str, wav: str | None) -> dict:
    messages = [{"role": "user", "content": [{"type": "text", "text": PROMPT_SAY.format(d=digit)}]}]
    if wav is not None:
        messages.append({"role": "assistant", "content": [{"type": "audio", "path": wav}]})
    return {"task": "text_to_speech", "messages": messages}


def answer_digits(row: dict) -> list[str]:
    """The digits a row is about (for stats): the one in the prompt ("Draw/Say the digit 7."), or
    those of the assistant text ("7", or "3 7 1" for a video)."""
    if row["task"] in PROMPTED:
        return [row["messages"][0]["content"][0]["text"][-2]]
    return row["messages"][-1]["content"][0]["text"].split()


def sample(rng: random.Random, pool: list, n: int, what: str) -> list:
    if n < 0:
        raise DataError(f"{what}: count must be >= 0, got {n}")
    if n > len(pool):
        raise DataError(f"{what}: asked for {n} but only {len(pool)} are available")
    return sorted(rng.sample(pool, n))


def split_stats(rows: list[dict], split: str, problems: list[str], warnings: list[str]) -> dict:
    out = {}
    for task in TASKS:
        mine = [r for r in rows if r["task"] == task]
        digits = Counter(d for r in mine for d in answer_digits(r))
        n = len(mine)
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


def stream(seed: int, tag: str) -> random.Random:
    """One RNG stream per choice, so that changing one count does not reshuffle the others."""
    return random.Random(f"{seed}:{tag}")


def choose(args: argparse.Namespace, fsdd: list[tuple[str, int, Path]]) -> tuple[dict[str, list], dict[str, int]]:
    """The MNIST indices and FSDD ``(digit, path)`` pairs of every count (each from its own stream),
    and how many FSDD recordings each split has."""
    fsdd_train = [(d, p) for d, take, p in fsdd if take in FSDD_TRAIN_TAKES]
    fsdd_test = [(d, p) for d, take, p in fsdd if take in FSDD_TEST_TAKES]

    def pick(tag: str, pool: list, n: int, what: str) -> list:
        return sample(stream(args.seed, tag), pool, n, what)

    picks = {
        "train_images": pick("train-images", list(MNIST_TRAIN), args.train_images, "--train-images"),
        "gen": pick("gen", list(MNIST_TRAIN), args.gen, "--gen"),
        "eval_images": pick("eval-images", list(MNIST_EVAL), args.eval_images, "--eval-images"),
        "train_audio": pick("train-audio", fsdd_train, args.train_audio, "--train-audio (FSDD takes 5-24 shipped)"),
        "eval_audio": pick("eval-audio", fsdd_test, args.eval_audio, "--eval-audio (FSDD takes 0-4)"),
        "speak": pick("train-speech", fsdd_train, args.speak, "--speak (FSDD takes 5-24 shipped)"),
        "eval_speak": pick("eval-speech", fsdd_test, args.eval_speak, "--eval-speak (FSDD takes 0-4)"),
    }
    return picks, {"train": len(fsdd_train), "eval": len(fsdd_test)}


def make_rows(picks: dict[str, list], labels: np.ndarray, out: Path) -> tuple[list[dict], list[dict]]:
    """The train and eval rows of the MNIST and FSDD tasks, in a fixed order (shuffled later)."""

    def png(i: int) -> str:
        return f"images/{i:05d}.png"

    train = [image_to_text(png(i), str(labels[i])) for i in picks["train_images"]]
    train += [audio_to_text(rel(p, out), d) for d, p in picks["train_audio"]]
    train += [text_to_image(str(labels[i]), png(i)) for i in picks["gen"]]
    train += [text_to_speech(d, rel(p, out)) for d, p in picks["speak"]]
    evals = [image_to_text(png(i), str(labels[i])) for i in picks["eval_images"]]
    evals += [audio_to_text(rel(p, out), d) for d, p in picks["eval_audio"]]
    evals += [text_to_speech(d, rel(p, out)) for d, p in picks["eval_speak"]]
    return train, evals


def write_images(img_dir: Path, images: np.ndarray, needed: list[int]) -> tuple[int, int]:
    """Write the PNGs of the MNIST indices ``needed``, leave identical ones alone and remove stale
    ones from older runs. Returns ``(written, stale removed)``."""
    written = 0
    for i in needed:
        written += write_if_changed(img_dir / f"{i:05d}.png", png_bytes(images[i]))
    keep = {f"{i:05d}.png" for i in needed}
    stale = [n for n in os.listdir(img_dir) if PNG_NAME.match(n) and n not in keep]
    for n in stale:
        (img_dir / n).unlink()
    return written, len(stale)


def video_rows(out: Path, images: np.ndarray, labels: np.ndarray, args: argparse.Namespace) -> tuple[list, list, dict, str]:
    """``--videos`` train and ``--eval-videos`` eval clips (``video_to_text``), made by
    ``make_videos.py`` (its default clip options, this seed) into ``out/videos/``: train rows, eval
    rows, the note for stats.json and a line for the report."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import make_videos  # it imports this module: see the end of the file

    opts = make_videos.parse_args(["--seed", str(args.seed)])
    rows, written, stale, size = make_videos.write_clips(out, {"train": args.videos, "eval": args.eval_videos}, images, labels, opts)
    n = len(rows["train"]) + len(rows["eval"])
    note = {
        "script": "make_videos.py",
        "frames": opts.frames,
        "fps": opts.fps,
        "height": opts.height,
        "width": opts.width,
        "digits_per_clip": [opts.min_digits, opts.max_digits],
        "train_indices": [MNIST_TRAIN.start, MNIST_TRAIN.stop - 1],
        "eval_indices": [MNIST_EVAL.start, MNIST_EVAL.stop - 1],
        "note": "each digit moves in its own lane, so answers list the digits left to right in every frame; stats count every digit of a clip",
    }
    line = f"{n:5d} FFV1 .mkv clips, {size / 1e6:.1f} MB ({written} written, {n - written} unchanged, {stale} stale removed)"
    return rows["train"], rows["eval"], note, line


def make_stats(args: argparse.Namespace, splits: dict[str, list[dict]], n_images: int, fsdd: dict[str, int], videos: dict | None) -> dict:
    """The content of stats.json; prints the coverage warnings (tiny sizes) to stderr.

    Raises:
        DataError: a task of a split with 50 samples or more lacks a digit.
    """
    problems: list[str] = []
    warnings: list[str] = []
    stats = {
        "seed": args.seed,
        "splits": {name: split_stats(rows, name, problems, warnings) for name, rows in splits.items()},
        "images": n_images,
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
                "available": fsdd,
                "license": "CC BY-SA 4.0",
            },
        },
    }
    if videos is not None:
        stats["sources"]["videos"] = videos
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if problems:
        raise DataError("digit coverage check failed:\n  " + "\n  ".join(problems))
    return stats


def report(out: Path, raw: Path, stats: dict, changed: dict[str, bool], media: dict[str, str], n_wav: int) -> None:
    """Print what was written: a line per file (``[unchanged]`` when it already held the same bytes)
    and ``media`` (folder -> line)."""
    splits = stats["splits"]

    def counts(split: str) -> str:
        return ", ".join(f"{k} {v['count']}" for k, v in splits[split]["tasks"].items())

    shown = os.path.relpath(out) if not os.path.relpath(out).startswith("..") else str(out)

    def line(name: str, text: str) -> None:
        flag = "" if changed.get(name, True) else "  [unchanged]"
        print(f"  {name:<20} {text}{flag}")

    print(f"wrote {shown}/")
    line("train.jsonl", f"{splits['train']['count']:5d} lines ({counts('train')})")
    line("eval.jsonl", f"{splits['eval']['count']:5d} lines ({counts('eval')})")
    line("eval_generate.jsonl", f"{splits['eval_generate']['count']:5d} lines (text_to_image prompts, one per digit)")
    line("stats.json", "counts and digit distribution per split and task")
    for name, text in media.items():
        line(name, text)
    print(f"  audio: {n_wav} WAVs used in place from {rel(raw / FSDD_DIR, out)}/ (paths relative to {shown}/)")


def build(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    raw = Path(args.raw).resolve()
    out = Path(args.out).resolve()
    img_dir = out / "images"
    img_dir.mkdir(parents=True, exist_ok=True)

    images, labels = load_mnist(raw)
    picks, fsdd = choose(args, load_fsdd(raw))
    wavs = list(dict.fromkeys(p for key in ("train_audio", "eval_audio", "speak", "eval_speak") for _, p in picks[key]))
    check_wavs(wavs)
    train, evals = make_rows(picks, labels, out)
    media, videos = {}, None
    if args.videos or args.eval_videos:
        v_train, v_eval, videos, media["videos/"] = video_rows(out, images, labels, args)
        train, evals = train + v_train, evals + v_eval
    stream(args.seed, "shuffle-train").shuffle(train)
    stream(args.seed, "shuffle-eval").shuffle(evals)
    gen_prompts = [text_to_image(d, None) for d in DIGITS]

    needed = sorted(set(picks["train_images"]) | set(picks["gen"]) | set(picks["eval_images"]))
    written, stale = write_images(img_dir, images, needed)
    media = {"images/": f"{len(needed):5d} PNGs ({written} written, {len(needed) - written} unchanged, {stale} stale removed)", **media}
    stats = make_stats(args, {"train": train, "eval": evals, "eval_generate": gen_prompts}, len(needed), fsdd, videos)

    files = {
        "train.jsonl": jsonl_bytes(train),
        "eval.jsonl": jsonl_bytes(evals),
        "eval_generate.jsonl": jsonl_bytes(gen_prompts),
        "stats.json": (json.dumps(stats, indent=2) + "\n").encode("utf-8"),
    }
    changed = {name: write_if_changed(out / name, data) for name, data in files.items()}
    report(out, raw, stats, changed, media, len(wavs))
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
    add("--speak", type=int, default=0, help="text_to_speech train samples (FSDD takes 5-24, 1200 shipped)")
    add("--eval-speak", type=int, default=0, help="text_to_speech eval samples (FSDD takes 0-4, 300 shipped)")
    add("--videos", type=int, default=0, help="video_to_text train clips (make_videos.py; MNIST indices 0-8999)")
    add("--eval-videos", type=int, default=0, help="video_to_text eval clips (make_videos.py; MNIST indices 9000-9999)")
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
    # make_videos.py imports this module as ``build_data``: let it find this one (one DataError class)
    sys.modules.setdefault("build_data", sys.modules[__name__])
    sys.exit(main())
