"""examples/digits/make_videos.py: the clips it writes decode (omnicore.api.load_video) to exactly
the frames it renders, answers list the digits left to right, the MNIST split holds, and the output
is deterministic. Also load_video's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from omnicore.api import MediaError, load_video

DIGITS = Path(__file__).resolve().parents[3] / "examples" / "digits"
ARGS = ["--train", "6", "--eval", "4", "--frames", "7", "--fps", "5", "--seed", "3"]


def run(out: Path) -> str:
    proc = subprocess.run(
        [sys.executable, str(DIGITS / "make_videos.py"), "--out", str(out), *ARGS], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("videos")
    run(out)
    return out


@pytest.fixture(scope="module")
def script(made):
    sys.path.insert(0, str(DIGITS))
    try:
        import make_videos

        yield make_videos
    finally:
        sys.path.remove(str(DIGITS))


@pytest.mark.cli
def test_decoded_frames_equal_the_rendered_ones(made, script):
    args = script.parse_args(["--out", str(made), *ARGS])
    images, labels = script.load_mnist(Path(args.raw))
    for split, n, pool in (("train", 6, range(0, 9000)), ("eval", 4, range(9000, 10000))):
        rows = [json.loads(line) for line in (made / f"videos_{split}.jsonl").read_text().splitlines()]
        assert len(rows) == n
        rng = np.random.default_rng([3, 0 if split == "train" else 1])  # the script's stream for this split
        for row in rows:
            indices, start, velocity = script.clip_plan(rng, pool, args)
            low, high = script.bounds(len(indices), args)
            corners = script.trajectory(start, velocity, 7, high, low)
            frames = script.render(images[indices], corners, 64, 96)
            video = load_video(made / row["messages"][0]["content"][0]["path"])
            assert video.fps == 5.0 and video.frames.shape == (7, 64, 96, 3)
            for c in range(3):  # lossless: grey in every channel, exactly
                assert np.array_equal(video.frames[..., c], frames)
            assert row["mnist"] == indices.tolist() and all(i in pool for i in indices)
            assert 2 <= len(indices) <= 3
            left_to_right = [int(labels[i]) for _, i in sorted(zip(start[:, 0], indices))]
            assert row["messages"][1]["content"][0]["text"] == " ".join(map(str, left_to_right))
            # every frame: the digits stay left to right and 28-pixel boxes never overlap (own lanes)
            assert (np.diff(corners[:, :, 0], axis=1) >= 28).all()
            assert (corners >= 0).all() and (corners[:, :, 0] <= 96 - 28).all() and (corners[:, :, 1] <= 64 - 28).all()
            # the digits move: each corner changes over the clip
            assert (np.ptp(corners, axis=0).sum(axis=1) > 0).all()
            assert row["messages"][0]["content"][1]["text"] == "Which digits appear, in order?"


@pytest.mark.cli
def test_rerun_is_deterministic(made, tmp_path):
    assert "(0 files written, 0 stale removed)" in run(made)
    run(tmp_path)
    names = sorted(p.name for p in (made / "videos").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "videos").iterdir()) and len(names) == 10
    for name in names:
        assert (made / "videos" / name).read_bytes() == (tmp_path / "videos" / name).read_bytes(), name


@pytest.mark.cli
def test_digits_bounce_inside_the_canvas(script):
    corners = script.trajectory(np.array([[35.0, 1.0]]), np.array([[3.0, -2.5]]), 4, 36)
    assert corners[:, 0, 0].tolist() == [35, 34, 31, 28]  # 38 reflects to 34 off the right wall
    assert corners[:, 0, 1].tolist() == [1, 2, 4, 6]  # -1.5 reflects to 1.5 off the top; np.rint rounds halves to even


@pytest.mark.cli
def test_digits_bounce_inside_their_lanes(script):
    args = script.parse_args([])
    low, high = script.bounds(3, args)
    assert low[:, 0].tolist() == [0, 32, 64] and high[:, 0].tolist() == [4, 36, 68] and high[:, 1].tolist() == [36] * 3
    # digit 1 heads right at 3 px/frame from x 35 in its lane [32, 36]: 38 reflects to 34, 31 to 33, then 36
    corners = script.trajectory(np.array([[2.0, 0.0], [35.0, 10.0], [64.0, 0.0]]), np.array([[0.0, 0], [3, 0], [0, 0]]), 4, high, low)
    assert corners[:, 1, 0].tolist() == [35, 34, 33, 36]
    assert corners[:, 1, 1].tolist() == [10] * 4


@pytest.mark.cli
def test_a_canvas_too_narrow_for_the_digits_is_an_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(DIGITS / "make_videos.py"), "--out", str(tmp_path), "--train", "1", "--eval", "0", "--width", "80"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "--width 80 cannot hold 3 digits side by side" in proc.stderr


def test_load_video_errors(tmp_path):
    with pytest.raises(MediaError, match=rf"video file not found: {tmp_path / 'none.mkv'}"):
        load_video(tmp_path / "none.mkv")
    with pytest.raises(MediaError, match=r"cannot read video \(9 bytes from table row 3\)"):
        load_video(b"not video", name="table row 3")
    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(MediaError, match="a.png"):
        load_video(tmp_path / "a.png")
