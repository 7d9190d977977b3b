#!/usr/bin/env python3
"""Build "Moving MNIST" clips for the digits example: the task ``video_to_text``.

Each clip shows two or three MNIST digits (28 x 28) moving in straight lines on a black canvas
(64 pixels high, 96 wide) and bouncing off the walls, after Srivastava, Mansimov, Salakhutdinov,
"Unsupervised Learning of Video Representations using LSTMs", ICML 2015. Unlike theirs, each digit
keeps to its own **lane**: the canvas is cut into ``k`` equal vertical strips, left to right, and
digit ``i`` bounces inside strip ``i`` (off its side walls as off the canvas's). So no digit ever
covers another and the left-to-right order is the same in every frame: the question "Which digits
appear, in order?" has one answer, the digits left to right, separated by spaces, e.g. ``"3 7 1"``.
(With free motion, as in the first version, neighbouring digits overlapped in 95% of clips and
swapped places within 8 frames in 36%, so the answer depended on the frame.) A strip is
``width // k`` pixels wide, so three digits need a canvas at least 84 pixels wide.

Digits come from the shipped MNIST file with the split of ``build_data.py``: train clips use
indices 0-8999, eval clips 9000-9999. Each clip is a lossless FFV1 video (8-bit grey) in Matroska
(``.mkv``), a few kilobytes, that PyAV (and so ``omnicore.api.load_video``) decodes back to
exactly the frames written.

Output (``--out``, default ``examples/digits/data``)::

    videos/train_00000.mkv ...  videos/eval_00000.mkv ...
    videos_train.jsonl, videos_eval.jsonl   (chat format: a video part, then the question)

The two JSONL files are written when this script runs alone. ``build_data.py --videos N
--eval-videos M`` (what ``TASKS=5 run.sh`` runs) makes the same clips through :func:`write_clips`
and merges their rows into its own ``train.jsonl`` and ``eval.jsonl`` instead.

Only the standard library, numpy and PyAV (``av``) are needed. Usage::

    python examples/digits/make_videos.py [--train 2000] [--eval 200] [--frames 8] [--fps 4] [--seed 0]

The output is deterministic for given arguments (FFmpeg's bit-exact mode), and re-running rewrites
nothing that is unchanged.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
from build_data import DEFAULT_OUT, DEFAULT_RAW, MNIST_EVAL, MNIST_TRAIN, DataError, jsonl_bytes, load_mnist, write_if_changed

PROMPT_VIDEO = "Which digits appear, in order?"
DIGIT = 28
"""MNIST digits are 28 x 28 pixels."""
VIDEO_NAME = re.compile(r"^(train|eval)_[0-9]{5}\.mkv$")


def lanes(k: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The left and right bounds ``([k], [k])`` of the top-left x corner of ``k`` digits, one
    strip of ``width // k`` pixels each, left to right; a digit inside its strip never reaches
    the next one.

    Raises:
        DataError: if a strip is narrower than a digit.
    """
    strip = width // k
    if strip < DIGIT:
        raise DataError(f"--width {width} cannot hold {k} digits side by side ({k} x {DIGIT} pixels); widen it or lower --max-digits")
    low = strip * np.arange(k)
    return low, low + strip - DIGIT


def clip_plan(rng: np.random.Generator, pool: range, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One clip's digits and motion: ``(mnist_indices [k], start [k, 2] as (x, y), velocity [k, 2])``
    in pixels and pixels per frame; digit ``i`` starts anywhere in lane ``i`` (:func:`lanes`), so the
    indices are left to right."""
    k = int(rng.integers(args.min_digits, args.max_digits + 1))
    low, high = lanes(k, args.width)
    xs = low + rng.integers(0, high - low + 1)
    ys = rng.integers(0, args.height - DIGIT + 1, k)
    angle = rng.uniform(0, 2 * np.pi, k)
    speed = rng.uniform(args.min_speed, args.max_speed, k)
    velocity = np.stack([np.cos(angle), np.sin(angle)], axis=1) * speed[:, None]
    indices = rng.choice(np.asarray(pool), size=k, replace=False)
    return indices, np.stack([xs, ys], axis=1).astype(np.float64), velocity


def bounds(k: int, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """The lowest and highest top-left corners ``([k, 2], [k, 2])`` of a clip's ``k`` digits: their
    lanes in x, the canvas in y."""
    low, high = lanes(k, args.width)
    return np.stack([low, np.zeros(k, int)], 1), np.stack([high, np.full(k, args.height - DIGIT)], 1)


def trajectory(start: np.ndarray, velocity: np.ndarray, frames: int, high, low=0) -> np.ndarray:
    """Top-left corners ``[frames, k, 2]`` (rounded to pixels) of digits moving by ``velocity`` per
    frame and bouncing (mirror reflection) off walls at ``low`` and ``high`` (pixels: numbers, or
    ``[k, 2]`` arrays of per-digit bounds as :func:`bounds` gives)."""
    low = np.broadcast_to(np.asarray(low, dtype=np.float64), start.shape)
    high = np.broadcast_to(np.asarray(high, dtype=np.float64), start.shape)
    pos, vel = start.copy(), velocity.copy()
    out = np.empty((frames, *start.shape), dtype=np.int64)
    for t in range(frames):
        out[t] = np.rint(pos)
        pos = pos + vel
        under, over = pos < low, pos > high
        pos[under], vel[under] = 2 * low[under] - pos[under], -vel[under]
        pos[over], vel[over] = 2 * high[over] - pos[over], -vel[over]
        pos = np.clip(pos, low, high)  # a lane narrower than one step: stay at its wall
    return out


def render(digits: np.ndarray, corners: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 frames ``[T, height, width]``: each digit ``[28, 28]`` at its corner (overlaps, which
    lanes rule out, would combine by maximum)."""
    frames = np.zeros((len(corners), height, width), dtype=np.uint8)
    for t, frame_corners in enumerate(corners):
        for digit, (x, y) in zip(digits, frame_corners):
            box = frames[t, y : y + DIGIT, x : x + DIGIT]
            np.maximum(box, digit, out=box)
    return frames


def mkv_bytes(frames: np.ndarray, fps: int) -> bytes:
    """Grey frames ``[T, H, W]`` as a lossless FFV1 stream in Matroska, bit-exact (no random IDs)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska", options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream("ffv1", rate=Fraction(fps))
        stream.height, stream.width = frames.shape[1:]
        stream.pix_fmt = "gray"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="gray")))
        container.mux(stream.encode())
    return buf.getvalue()


def video_to_text(path: str, answer: str, indices: list[int]) -> dict:
    return {
        "task": "video_to_text",
        "mnist": indices,
        "messages": [
            {"role": "user", "content": [{"type": "video", "path": path}, {"type": "text", "text": PROMPT_VIDEO}]},
            {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        ],
    }


def make_split(
    split: str, n: int, pool: range, images: np.ndarray, labels: np.ndarray, args: argparse.Namespace
) -> tuple[list[dict], dict[str, bytes]]:
    """``n`` clips of one split: their JSONL rows and ``{file name: mkv bytes}``."""
    rng = np.random.default_rng([args.seed, 0 if split == "train" else 1])
    rows, files = [], {}
    for i in range(n):
        indices, start, velocity = clip_plan(rng, pool, args)
        low, high = bounds(len(indices), args)
        corners = trajectory(start, velocity, args.frames, high, low)
        name = f"{split}_{i:05d}.mkv"
        files[name] = mkv_bytes(render(images[indices], corners, args.height, args.width), args.fps)
        answer = " ".join(str(int(labels[j])) for j in indices)  # indices are already left to right
        rows.append(video_to_text(f"videos/{name}", answer, [int(j) for j in indices]))
    return rows, files


def write_clips(
    out: Path, counts: dict[str, int], images: np.ndarray, labels: np.ndarray, args: argparse.Namespace
) -> tuple[dict[str, list[dict]], int, int, int]:
    """Make ``counts["train"]`` and ``counts["eval"]`` clips (MNIST indices 0-8999 and 9000-9999) into
    ``out/videos/``: files already holding the same bytes are left alone and clips of older runs that
    are no longer made are removed. Also used by ``build_data.py --videos``.

    Returns ``(rows per split, files written, stale files removed, total bytes of the clips)``.

    Raises:
        DataError: bad clip options (digit counts, frames, rate, canvas size).
    """
    if not 1 <= args.min_digits <= args.max_digits:
        raise DataError(f"need 1 <= --min-digits <= --max-digits, got {args.min_digits} and {args.max_digits}")
    if args.frames < 1 or args.fps < 1 or args.height < DIGIT:
        raise DataError(f"need --frames >= 1, --fps >= 1 and --height >= {DIGIT}")
    lanes(args.max_digits, args.width)  # raises if the widest clip does not fit
    folder = out / "videos"
    folder.mkdir(parents=True, exist_ok=True)
    rows, files = {}, {}
    for split, pool in (("train", MNIST_TRAIN), ("eval", MNIST_EVAL)):
        rows[split], clips = make_split(split, counts[split], pool, images, labels, args)
        files.update(clips)
    written = sum(write_if_changed(folder / name, data) for name, data in files.items())
    stale = [name for name in os.listdir(folder) if VIDEO_NAME.match(name) and name not in files]
    for name in stale:
        (folder / name).unlink()
    return rows, written, len(stale), sum(len(d) for d in files.values())


def build(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    out = Path(args.out).resolve()
    images, labels = load_mnist(Path(args.raw).resolve())
    rows, written, stale, size = write_clips(out, {"train": args.train, "eval": args.eval}, images, labels, args)
    written += sum(write_if_changed(out / f"videos_{split}.jsonl", jsonl_bytes(r)) for split, r in rows.items())
    n = len(rows["train"]) + len(rows["eval"])
    print(f"wrote {out}/videos_train.jsonl ({len(rows['train'])} clips), videos_eval.jsonl ({len(rows['eval'])} clips)")
    print(f"  videos/: {n} FFV1 .mkv files, {size / 1e6:.1f} MB ({written} files written, {stale} stale removed)")
    print(f"done in {time.perf_counter() - t0:.2f} s")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = p.add_argument
    add("--out", default=str(DEFAULT_OUT), help="output folder (videos/ and the two JSONL files go there)")
    add("--raw", default=str(DEFAULT_RAW), help="folder with the shipped mnist/")
    add("--train", type=int, default=2000, help="train clips (MNIST indices 0-8999)")
    add("--eval", type=int, default=200, help="eval clips (MNIST indices 9000-9999)")
    add("--frames", type=int, default=8, help="frames per clip")
    add("--fps", type=int, default=4, help="frame rate written in the files")
    add("--height", type=int, default=64, help="canvas height in pixels")
    add("--width", type=int, default=96, help="canvas width in pixels (at least 28 per digit: each digit has its own lane)")
    add("--min-digits", type=int, default=2, help="fewest digits per clip")
    add("--max-digits", type=int, default=3, help="most digits per clip")
    add("--min-speed", type=float, default=1.5, help="slowest digit speed, pixels per frame")
    add("--max-speed", type=float, default=3.0, help="fastest digit speed, pixels per frame")
    add("--seed", type=int, default=0, help="seed of digits, positions and motion")
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
