"""The data side of encoder/video_frames: frame sampling, tubelet layout, the token formula over a
grid of clip lengths, frame rates and sizes (checked against the encoder's output rows), pickling,
and no model code in data workers."""

from __future__ import annotations

import itertools
import math
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from omnicore.api import Video
from omnicore_video_frames.encoder import build
from omnicore_video_frames.processor import VideoFramesProcessor, build_processor, sample_indices

H = 16
TINY = dict(depth=1, embed_dim=16, num_heads=2, mlp_ratio=2, hidden_size=16, patch_size=4, spatial_merge_size=2)


def clip(n: int, h: int, w: int, fps: float, seed: int = 0) -> Video:
    return Video(frames=np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8), fps=fps)


@pytest.mark.parametrize(
    ("n", "source_fps", "fps", "max_frames", "want", "step"),
    [
        (8, 4, 4, 99, [0, 1, 2, 3, 4, 5, 6, 7], 0.25),  # the source rate: every frame
        (8, 4, 2, 99, [0, 2, 4, 6], 0.5),
        (8, 4, 3, 99, [0, 1, 2, 4, 5, 6], 1 / 3),  # times 0, 1/3, 2/3, 1, 4/3, 5/3 s
        (8, 4, 8, 99, [0, 1, 2, 3, 4, 5, 6, 7], 0.25),  # above the source rate: every frame once
        (8, 4, 4, 3, [0, 2, 5], 2 / 3),  # capped: spread evenly, floor(k * 8 / 3), 8 / 3 frames apart
        (3, 30, 1, 99, [0], 1.0),  # shorter than one step: the first frame
    ],
)
def test_sample_indices_by_hand(n, source_fps, fps, max_frames, want, step):
    idx, step_s = sample_indices(n, source_fps, fps, max_frames)
    assert idx.tolist() == want
    assert step_s == pytest.approx(step)


def test_sample_indices_match_timestamps():
    """Uncapped sampling keeps, for each time k / fps, the frame on screen then (frame j covers [j / r, (j + 1) / r))."""
    for n, r, f in itertools.product([1, 4, 9, 30], [5.0, 12.5, 29.97], [1.0, 2.0, 4.0]):
        idx, _ = sample_indices(n, r, f, 10_000)
        times = np.arange(len(idx)) / f
        on_screen = np.floor(times * r + 1e-9).astype(int)
        assert idx.tolist() == np.minimum(on_screen, n - 1).tolist(), (n, r, f)
        assert len(idx) == max(1, min(n, math.floor(n * f / r + 1e-9)))


def expected_tokens(n: int, r: float, f: float, max_frames: int, h: int, w: int, frame_size, factor: int = 8) -> int:
    """The formula written out independently: frames kept, tubelets of 2 (last frame repeated), merged 8 x 8 pixel cells."""
    m = max(1, min(n, max_frames, math.floor(n * f / r + 1e-9)))
    if frame_size is None:
        out_h, out_w = (max(factor, math.floor(s / factor + 0.5) * factor) for s in (h, w))
    else:
        out_h, out_w = (frame_size, frame_size) if isinstance(frame_size, int) else frame_size
    return math.ceil(m / 2) * (out_h // factor) * (out_w // factor)


@pytest.mark.slow
@pytest.mark.parametrize("frame_size", [None, 16, (8, 24)])
def test_num_tokens_grid_equals_encoder_rows(frame_size):
    """Over clip lengths (odd and even), source rates, sampling rates and frame sizes: num_tokens equals the
    formula, tokens_for, grid's product and the encoder's output rows for that clip alone."""
    torch.manual_seed(0)
    lengths, rates, sizes = [1, 2, 3, 7, 12], [4.0, 10.0, 29.97], [(16, 16), (20, 30), (9, 41)]
    for f, max_frames in [(2.0, 16), (4.0, 5)]:
        opts = {"config": TINY, "fps": f, "max_frames": max_frames, "frame_size": frame_size}
        enc, proc = build(opts, hidden_size=H).eval(), build_processor(opts)
        for n, r, (h, w) in itertools.product(lengths, rates, sizes):
            feats = proc.preprocess(clip(n, h, w, r))
            want = expected_tokens(n, r, f, max_frames, h, w, frame_size)
            t, gh, gw = proc.grid(feats)
            assert proc.num_tokens(feats) == proc.tokens_for(n, r, h, w) == t * gh * gw == want, (n, r, h, w, f)
            with torch.no_grad():
                assert enc(proc.collate([feats])).shape == (want, H), (n, r, h, w, f)


def test_patch_layout_follows_transformers_positions():
    """Each row of pixel_values_videos is the patch at transformers' vision position ids for that row (blocks of 2 x 2
    patches together), its values ordered (channel, frame, row, column) like the tower's Conv3d kernel."""
    from transformers.vision_utils import get_vision_position_ids

    proc = build_processor({"config": TINY, "fps": 4, "frame_size": (16, 24)})
    n, h, w, p = 4, 16, 24, 4
    t_idx, y, x = np.meshgrid(np.arange(n), np.arange(h), np.arange(w), indexing="ij")
    frames = np.stack([t_idx * 50 + 1, y * 10, x * 10], axis=-1).astype(np.uint8)  # channel c encodes (t, y, x)
    feats = proc.preprocess(Video(frames=frames, fps=4))
    grid = feats["video_grid_thw"]
    assert grid.tolist() == [2, 4, 6]
    pos = get_vision_position_ids(grid[None], 2)  # [t * h * w, 2] (row, col) of each patch, repeated per tubelet
    mean, std = np.asarray(proc.mean), np.asarray(proc.std)
    raw = feats["pixel_values_videos"].numpy().reshape(-1, 3, 2, p, p) * std[None, :, None, None, None] + mean[None, :, None, None, None]
    pixels = np.rint(raw * 255).astype(int)
    for i, (row, col) in enumerate(pos.tolist()):
        tubelet = i // (4 * 6)
        assert (pixels[i, 0, :, 0, 0] == (2 * tubelet + np.arange(2)) * 50 + 1).all(), i
        assert (pixels[i, 1, 0, :, 0] == (row * p + np.arange(p)) * 10).all(), i
        assert (pixels[i, 2, 0, 0, :] == (col * p + np.arange(p)) * 10).all(), i


def test_odd_clips_repeat_the_last_frame():
    """A 3-frame clip gives exactly the features of the 4-frame clip whose 4th frame repeats the 3rd (Qwen2-VL)."""
    proc = build_processor({"config": TINY, "fps": 4})
    three = clip(3, 16, 16, 4.0)
    four = Video(frames=np.concatenate([three.frames, three.frames[-1:]]), fps=4.0)
    a, b = proc.preprocess(three), proc.preprocess(four)
    assert torch.equal(a["pixel_values_videos"], b["pixel_values_videos"])
    assert a["video_grid_thw"].tolist() == [2, 4, 4]


def test_normalisation_and_time_per_tubelet():
    """Pixels become (x / 255 - mean) / std with CLIP's constants; second_per_grid_ts = 2 / fps."""
    proc = build_processor({"config": TINY, "fps": 2})
    video = clip(8, 8, 8, 4.0)
    feats = proc.preprocess(video)
    first = feats["pixel_values_videos"][0].reshape(3, 2, 4, 4).numpy()
    want = (video.frames[0, :4, :4].astype(np.float64) / 255 - (0.48145466, 0.4578275, 0.40821073)) / (0.26862954, 0.26130258, 0.27577711)
    np.testing.assert_allclose(first[:, 0], want.transpose(2, 0, 1), atol=1e-5)
    np.testing.assert_allclose(first[:, 1].transpose(1, 2, 0), (video.frames[2, :4, :4] / 255 - proc.mean) / proc.std, atol=1e-5)
    assert float(feats["second_per_grid_ts"]) == pytest.approx(1.0)


def test_processor_pickles_and_agrees_with_module():
    opts = {"config": TINY, "fps": 3, "max_frames": 4, "frame_size": 16}
    proc, module = build_processor(opts), build(opts, hidden_size=H)
    copied = pickle.loads(pickle.dumps(proc))
    for video in (clip(5, 20, 20, 6.0), clip(2, 9, 30, 1.0, seed=1)):
        a, b, c = proc.preprocess(video), copied.preprocess(video), module.processor.preprocess(video)
        for k in a:
            assert torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]), k
        assert proc.num_tokens(a) == copied.num_tokens(b) == module.processor.num_tokens(c) and proc.grid(a) == module.processor.grid(c)


def test_bad_input_errors():
    with pytest.raises(
        ValueError,
        match=r"frame_size \(20, 16\): each side must be a multiple of patch_size \* spatial_merge_size = 8 \(e.g. 16 or 24 instead of 20\)",
    ):
        build_processor({"config": TINY, "frame_size": [20, 16]})
    with pytest.raises(ValueError, match="unknown Qwen2VLVisionConfig key 'num_head'; did you mean 'num_heads'"):
        build_processor({"config": dict(TINY, num_head=2)})
    with pytest.raises(ValueError, match="set either `checkpoint`"):
        build_processor({"config": TINY, "checkpoint": "/nowhere"})
    proc = build_processor({"config": TINY})
    with pytest.raises(TypeError, match="expects an omnicore.api.Video"):
        proc.preprocess(np.zeros((2, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 3\]"):
        proc.preprocess(Video(frames=np.zeros((2, 8, 8), np.uint8), fps=4))
    feats = proc.preprocess(clip(2, 8, 8, 4.0))
    with pytest.raises(ValueError, match=r"item 1: .*does not fit grid \(1, 4, 4\)"):
        proc.collate([feats, dict(feats, video_grid_thw=torch.tensor([1, 4, 4]))])


def test_checkpoint_processor_reads_no_weights(tmp_path):
    opts = {"config": TINY, "fps": 4, "frame_size": 16}
    build(opts, hidden_size=H).save_pretrained(tmp_path / "ckpt")
    for name in ("model.safetensors", "omnicore_extra.safetensors"):
        (tmp_path / "ckpt" / name).unlink()
    proc = build_processor({"checkpoint": str(tmp_path / "ckpt"), "fps": 4, "frame_size": 16})
    assert (proc.patch_size, proc.merge_size, proc.temporal_patch_size) == (4, 2, 2)
    with pytest.raises(ValueError, match=rf"{tmp_path / 'none'} has no config.json"):
        build_processor({"checkpoint": str(tmp_path / "none")})


@pytest.mark.cli
def test_processor_module_imports_no_model_code():
    """Data workers import the processor's module: building a processor pulls in no model code."""
    code = (
        "import sys\n"
        "from omnicore_video_frames.processor import build_processor\n"
        f"build_processor({{'config': {TINY!r}}})\n"
        "print(','.join(m for m in sys.modules if m.startswith('transformers.models.qwen2_vl.modeling')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ""


def test_processor_class_is_the_modules():
    assert isinstance(build_processor({"config": TINY}), VideoFramesProcessor)
