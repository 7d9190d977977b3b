"""examples/digits/build_data.py's two optional tasks (issue #14): ``--speak`` (text_to_speech) and
``--videos`` (video_to_text, clips made by make_videos.py). Off, they change nothing; on, they add
their rows without changing which images and recordings the other tasks draw, speech rows name the
digit of their recording, and video rows are make_videos.py's own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"
SMALL = ["--train-images", "12", "--train-audio", "8", "--gen", "6", "--eval-images", "4", "--eval-audio", "4", "--seed", "2"]


def build(out: Path, *extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(DIGITS / "build_data.py"), "--out", str(out), *SMALL, *extra], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    plain, five = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("five")
    build(plain)
    build(five, "--speak", "7", "--eval-speak", "3", "--videos", "5", "--eval-videos", "2")
    return plain, five


def test_new_tasks_add_rows_and_leave_the_others_alone(built):
    plain, five = built
    for split, speak, videos in (("train", 7, 5), ("eval", 3, 2)):
        old, new = rows(plain / f"{split}.jsonl"), rows(five / f"{split}.jsonl")
        kept = [r for r in new if r["task"] not in ("text_to_speech", "video_to_text")]
        assert sorted(map(json.dumps, kept)) == sorted(map(json.dumps, old))  # same samples, shuffled with the rest
        assert sum(r["task"] == "text_to_speech" for r in new) == speak
        assert sum(r["task"] == "video_to_text" for r in new) == videos
    assert (plain / "eval_generate.jsonl").read_bytes() == (five / "eval_generate.jsonl").read_bytes()
    assert not (plain / "videos").exists()


def test_speech_rows_name_their_recordings_digit(built):
    _, five = built
    for split, takes in (("train", range(5, 25)), ("eval", range(0, 5))):
        speech = [r for r in rows(five / f"{split}.jsonl") if r["task"] == "text_to_speech"]
        for r in speech:
            (user,), (answer,) = r["messages"][0]["content"], r["messages"][1]["content"]
            wav = Path(answer["path"])
            digit, _, take = wav.stem.split("_")  # FSDD: {digit}_{speaker}_{take}.wav
            assert user["text"] == f"Say the digit {digit}." and answer["type"] == "audio"
            assert int(take) in takes and (five / wav).is_file()


def test_video_rows_are_make_videos_own(built, tmp_path):
    _, five = built
    subprocess.run(
        [sys.executable, str(DIGITS / "make_videos.py"), "--out", str(tmp_path), "--train", "5", "--eval", "2", "--seed", "2"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    for split in ("train", "eval"):
        ours = sorted(
            (r for r in rows(five / f"{split}.jsonl") if r["task"] == "video_to_text"), key=lambda r: r["messages"][0]["content"][0]["path"]
        )
        assert ours == rows(tmp_path / f"videos_{split}.jsonl")
        for r in ours:
            path = r["messages"][0]["content"][0]["path"]
            assert (five / path).read_bytes() == (tmp_path / path).read_bytes()
    stats = json.loads((five / "stats.json").read_text())["splits"]["train"]["tasks"]["video_to_text"]
    digits = sum(len(r["messages"][1]["content"][0]["text"].split()) for r in rows(five / "train.jsonl") if r["task"] == "video_to_text")
    assert stats["count"] == 5 and sum(stats["digits"].values()) == digits  # every digit of a clip is counted


def test_rerun_rewrites_nothing(built):
    _, five = built
    out = build(five, "--speak", "7", "--eval-speak", "3", "--videos", "5", "--eval-videos", "2")
    assert "(0 written, 7 unchanged, 0 stale removed)" in out  # the clips
    assert out.count("[unchanged]") == 4  # the JSONL files and stats.json
