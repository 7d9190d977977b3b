"""All five digits tasks in one model: FSDP2 on 2 processes equals 1 process with grad_accum 2.

The data holds image_to_text, audio_to_text, text_to_image (rows of the ``digits_jsonl`` fixture),
text_to_speech ("Say the digit D." -> an FSDD recording as the assistant's audio part, decoded to
EnCodec codes) and video_to_text (Moving MNIST clips written by ``examples/digits/make_videos.py``).
The file's row order puts every task in every packing window of both data shards, and each window
fills one micro-batch, so every micro-batch of the runs holds all five tasks (checked on the data
plan). Run with a 1-D (qwen2) and an mRoPE (qwen2_vl: 3-D positions from the image and video grids)
foundation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import DIGITS, tiny_config_dict
from test_mrope import MROPE_LM
from test_train import _omnicore

pytestmark = [pytest.mark.cli, pytest.mark.multiprocess]

TASKS = ("image_to_text", "audio_to_text", "text_to_image", "text_to_speech", "video_to_text")
PER_TASK = 8
SHARDS = 2  # 1 process x grad_accum 2 = 2 processes x grad_accum 1: the same two data shards
STEPS = 4
FSDD = DIGITS / "raw" / "fsdd" / "recordings"
TINY_VIDEO = {"depth": 1, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2, "hidden_size": 32, "patch_size": 8, "spatial_merge_size": 2}
# hop 8 * 5 * 4 = 160 samples at 16 kHz (100 frames/s), 2 codebooks of 16 entries
TINY_CODEC = {"num_filters": 4, "hidden_size": 8, "codebook_size": 16, "upsampling_ratios": [8, 5, 4], "num_quantizers": 2}
PARTS = ("loss/text", "loss/decoder.image", "loss/decoder.audio")


def _absolute(row: dict, base: Path) -> dict:
    """``row`` with its media paths made absolute (they were relative to ``base``)."""
    for msg in row["messages"]:
        for part in msg["content"] if isinstance(msg["content"], list) else []:
            if "path" in part:
                part["path"] = str((base / part["path"]).resolve())
    return row


def _say(digit: int, wav: Path) -> dict:
    return {
        "task": "text_to_speech",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"Say the digit {digit}."}]},
            {"role": "assistant", "content": [{"type": "audio", "path": str(wav)}]},
        ],
    }


@pytest.fixture(scope="module")
def five_jsonl(digits_jsonl, tmp_path_factory) -> Path:
    """``five.jsonl``: PER_TASK rows of each task, in the order task ``TASKS[(i // SHARDS) % 5]``
    for row ``i``, so that shard ``i % SHARDS`` reads the five tasks in turn."""
    out = tmp_path_factory.mktemp("five")
    cmd = [sys.executable, str(DIGITS / "make_videos.py"), "--out", str(out), "--train", str(PER_TASK), "--eval", "0", "--frames", "4"]
    subprocess.run(cmd, check=True, capture_output=True)
    rows: dict[str, list[dict]] = {t: [] for t in TASKS}
    for line in (digits_jsonl / "train.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["task"]].append(_absolute(row, digits_jsonl))
    rows["video_to_text"] = [_absolute(json.loads(x), out) for x in (out / "videos_train.jsonl").read_text().splitlines()]
    rows["text_to_speech"] = [_say(d, FSDD / f"{d}_nicolas_{5 + d}.wav") for d in range(PER_TASK)]
    lines = []
    for k in range(0, PER_TASK, SHARDS):
        for task in TASKS:
            assert len(rows[task]) >= k + SHARDS, task
            lines += [json.dumps(r) for r in rows[task][k : k + SHARDS]]
    path = out / "five.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _config(train: Path, out: Path, foundation: str, shared: bool = False, codebooks: str = "flat", **train_kw) -> dict:
    """``shared``: images go through the video tower (``video_frames_image``) and the video entry
    shares that module (``share: image``), as five.yaml has it. ``codebooks``: the speech codes'
    layout (``depth``: one LM position per frame, a depth decoder for codebook 1)."""
    cfg = tiny_config_dict(str(train), output_dir=str(out), **{"max_steps": STEPS, **train_kw})
    model = cfg["model"]
    if foundation == "qwen2_vl":
        model["foundation"]["options"]["config"] = dict(MROPE_LM)
    model["encoders"]["video"] = {
        "name": "video_frames",
        "options": {"config": dict(TINY_VIDEO), "fps": 4, "max_frames": 4, "frame_size": 32},
    }
    if shared:
        model["encoders"]["image"] = {"name": "video_frames_image", "options": {"config": dict(TINY_VIDEO), "image_size": 32}}
        model["encoders"]["video"]["share"] = "image"
    model["decoders"]["audio"] = {
        "name": "encodec",
        "options": {"config": dict(TINY_CODEC), "max_seconds": 0.5, "long_audio": "crop", "codebooks": codebooks},
    }
    if codebooks == "depth":
        model["decoders"]["audio"]["options"]["depth"] = {"layers": 1, "hidden_size": 16, "heads": 2}
    # in file order, one window of the five tasks per micro-batch (the budget holds the whole window)
    cfg["data"].update(shuffle=False, packing_window=len(TASKS), max_tokens=1024, num_workers=1)
    return cfg


def _plan(cfg: dict) -> list[list[list[tuple[str, bool | None]]]]:
    """What one process with ``grad_accum`` 2 reads, from the run's own data pipeline (the 2-process
    run reads the same two shards, one per rank): ``[step][micro-batch][sample]`` as ``(task,
    laid out)``, where ``laid out`` tells whether the sample's 3-D rotary positions differ between
    the axes (media laid out by their grids), None without 3-D positions (a 1-D foundation)."""
    from omnicore.config import Config
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.pipeline import DataPipeline
    from omnicore.data.sources import open_source
    from omnicore.model.build import build_omni_model

    conf = Config.model_validate(cfg)
    model, tok = build_omni_model(conf)
    chat = ChatProcessor.for_model(tok, model, conf.data, budget=True)
    sources = [open_source(s, Path.cwd()) for s in conf.data.source_list()]
    tasks = {f"{conf.data.train}:{i}": json.loads(x)["task"] for i, x in enumerate(Path(conf.data.train).read_text().splitlines(), 1)}
    pipe = DataPipeline(
        sources, chat, conf.data.model_copy(update={"num_workers": 0}), conf.run.seed, data_rank=0, data_size=1, grad_accum=SHARDS
    )
    try:
        return [[_samples(mb, tasks) for mb in pipe.step()] for _ in range(STEPS)]
    finally:
        pipe.close(now=True)


def _samples(mb, tasks: dict[str, str]) -> list[tuple[str, bool | None]]:
    cu, rope = mb.cu_seqlens.tolist(), mb.rope_position_ids
    out = []
    for i, where in enumerate(mb.wheres):
        rows = None if rope is None else rope[:, 0, cu[i] : cu[i + 1]]
        out.append((tasks[where], None if rows is None else bool((rows[0] != rows[1]).any() and (rows[1] != rows[2]).any())))
    return out


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "foundation,shared,codebooks",
    [("qwen2", False, "flat"), ("qwen2_vl", False, "flat"), ("qwen2_vl", True, "flat"), ("qwen2", False, "depth")],
    ids=["qwen2", "qwen2_vl", "shared_tower", "speech_depth"],
)
def test_two_processes_match_one_process_on_five_tasks(five_jsonl, tmp_path, foundation, shared, codebooks):
    """1 process x grad_accum 2 and FSDP2 on 2 processes (gloo) x grad_accum 1 read the same
    micro-batches, each holding all five tasks: the same loss and the same loss of every part (text,
    image codes, audio codes; with ``speech_depth`` also the depth decoder's codebook) at every step
    (rtol 1e-5), and the loss falls. ``shared_tower``: one module encodes images and video
    (five.yaml's layout)."""
    parts = PARTS + (("loss/decoder.audio.depth",) if codebooks == "depth" else ())
    one = _config(five_jsonl, tmp_path / "one", foundation, shared, codebooks, grad_accum=SHARDS)
    plan = _plan(one)
    assert len(plan) == STEPS and all(len(step) == SHARDS for step in plan)
    assert all(sorted(t for t, _ in mb) == sorted(TASKS) for step in plan for mb in step), plan
    # mRoPE: the image and the video samples get grid positions (t, h, w differ), the others none
    laid_out = {pair for step in plan for mb in step for pair in mb}
    assert laid_out == {(t, None if foundation == "qwen2" else t in ("image_to_text", "video_to_text")) for t in TASKS}
    two = _config(five_jsonl, tmp_path / "two", foundation, shared, codebooks, grad_accum=1)
    logs = {}
    for cfg, nproc in ((one, 1), (two, 2)):
        path = tmp_path / f"{nproc}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        logs[nproc] = _omnicore("train", str(path), nproc=nproc, cwd=tmp_path).stderr  # status lines are logged on stderr
    assert "dp_shard=2 x ep=1 x sp=1 (world 2); strategies: fsdp2;" in logs[2]
    rows_one, rows_two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert len(rows_one) == len(rows_two) == STEPS
    for key in ("loss", *parts):
        a, b = [r[key] for r in rows_one], [r[key] for r in rows_two]
        print(f"{foundation} {key}: one {a}, two {b}")
        assert b == pytest.approx(a, rel=1e-5), key
    # 5 samples per micro-batch, 2 micro-batches per step (the source is named after the file)
    assert [r["samples/five"] for r in rows_one] == [r["samples/five"] for r in rows_two] == [10 * (s + 1) for s in range(STEPS)]
    assert [r["targets"] for r in rows_one] == [r["targets"] for r in rows_two]
    assert all(rows_one[-1][k] < rows_one[0][k] for k in ("loss", *parts))  # it learns, every part


@pytest.mark.skip(
    reason="hangs on this machine (2026-12-08), at f2876ef too: a data worker forked at step 1 waits forever inside "
    "PyAV's decode (omnicore/data/media.py _decode_frames); kept out of CI until the worker start method is fixed"
)
def test_a_shared_tower_is_exported_once_and_its_export_evaluates_as_the_checkpoint(five_jsonl, tmp_path):
    """The export of a run whose video entry shares the image tower holds one tower, and the model
    read back from it gives the held-out losses of the run's last checkpoint (rel 1e-6)."""
    from omnicore.config import Config
    from omnicore.eval.heldout import heldout_loss_of
    from omnicore.eval.loading import load_trained
    from omnicore.train.loop import train

    d = _config(five_jsonl, tmp_path / "run", "qwen2_vl", True, max_steps=2, export=True)
    d["data"]["eval"] = str(five_jsonl)
    cfg = Config.model_validate(d)
    cfg.source = str(tmp_path / "config.yaml")
    train(cfg)
    export = tmp_path / "run" / "export"
    assert sorted(p.name for p in (export / "encoders").iterdir()) == ["audio", "image"]
    got = heldout_loss_of(cfg, *load_trained(cfg, export=str(export))[::2])
    want = heldout_loss_of(cfg, *load_trained(cfg, checkpoint=str(tmp_path / "run" / "checkpoints" / "step-00000002"))[::2])
    assert set(got) == set(want) and "loss/decoder.audio" in got
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-6), k
