"""The checkpoint processor helpers that the Qwen-VL families share
(:mod:`omnicore_family_kit.media_processors`): where a checkpoint's video settings are read, its own
image and video processors, and :class:`~omnicore_family_kit.media_processors.FrameVideoProcessor`'s
frame sampling and tubelets on tiny inputs, against values worked out by hand or by plain numpy
indexing."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from omnicore_family_kit.media_processors import FrameVideoProcessor, load_image_processor, load_video_processor, video_settings


def test_video_settings_are_read_where_transformers_reads_them(tmp_path):
    """Nested ``video_processor`` first, then ``video_preprocessor_config.json``, then
    ``preprocessor_config.json``; a narrower ``files`` skips the last; none: the error names the
    field, the folder, every file looked for and the fix."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 1}))
    assert video_settings(tmp_path, "f") == {"patch_size": 1}
    with pytest.raises(ValueError) as err:
        video_settings(tmp_path, "model.encoders.video.options.checkpoint", "put X there", files=("video_preprocessor_config.json",))
    assert str(err.value) == (
        f"model.encoders.video.options.checkpoint: {str(tmp_path)!r} has no video_preprocessor_config.json or "
        "processor_config.json; put X there"
    )
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({"patch_size": 2}))
    assert video_settings(tmp_path, "f") == {"patch_size": 2}
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {"patch_size": 4}}))
    assert video_settings(tmp_path, "f") == {"patch_size": 2}  # no nested video_processor: the flat file
    (tmp_path / "processor_config.json").write_text(json.dumps({"video_processor": {"patch_size": 3}}))
    assert video_settings(tmp_path, "f") == {"patch_size": 3}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"has no video_preprocessor_config.json, preprocessor_config.json or processor_config.json$"):
        video_settings(empty, "f")


def test_the_processors_of_a_folder(tmp_path):
    """An image processor from the folder's file; without torchvision, the video processor is the
    fallback class of the settings given; a folder without files is refused, naming the fix."""
    with pytest.raises(ValueError, match=r"^f: .* has no preprocessor_config.json or processor_config.json; fix it$"):
        load_image_processor(tmp_path, "f", "fix it")
    config = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 2, "merge_size": 2, "temporal_patch_size": 2}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    image = load_image_processor(tmp_path, "f")
    assert type(image).__name__.startswith("Qwen2VLImageProcessor") and (image.patch_size, image.merge_size) == (2, 2)
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: load_video_processor returns transformers' own class")

    class Mine(FrameVideoProcessor):
        pass

    video = load_video_processor(tmp_path, {"patch_size": 2, "fps": 3.0})
    assert type(video) is FrameVideoProcessor and (video.patch_size, video.settings["fps"], video.settings["merge_size"]) == (2, 3.0, 2)
    assert type(load_video_processor(tmp_path, {}, fallback=Mine)) is Mine


def test_frame_video_processor_samples_frames_by_the_rule_worked_by_hand():
    """``Qwen2VLVideoProcessor.sample_frames``: ``num_frames`` rounded to tubelets and spread by
    ``arange(0, T, T / n)``; at ``fps``, ``T / clip fps * fps`` frames, at least ``min_frames``."""
    vp = FrameVideoProcessor({"num_frames": 4})
    assert vp.sample_indices(10, None).tolist() == [0, 2, 5, 7]  # arange(0, 10, 2.5) truncated
    assert vp.sample_indices(12, None, num_frames=6).tolist() == [0, 2, 4, 6, 8, 10]
    assert vp.sample_indices(12, None, num_frames=5).tolist() == [0, 3, 6, 9]  # round(5 / 2) is 2 (half to even): 4 frames
    at_rate = FrameVideoProcessor({"fps": 2.0})
    assert at_rate.sample_indices(20, 10.0).tolist() == [0, 5, 10, 15]  # 2 s at 2 fps: 4 frames
    assert at_rate.sample_indices(6, 30.0).tolist() == [0, 1, 3, 4]  # 0.2 s gives 0.4 frames: min_frames 4
    with pytest.raises(ValueError, match="mutually exclusive"):
        vp.sample_indices(10, 2.0, target_fps=1.0)
    with pytest.raises(ValueError, match="cannot be sampled to 4 frames"):
        vp.sample_indices(3, None)


def test_frame_video_processor_cuts_tubelets_in_the_video_processors_order():
    """3 frames 8 x 16 with patches of 4, 2 x 2 merge blocks, tubelets of 2 frames: the last frame
    repeated, 2 x 2 x 4 patches, each row the patch's values as channel, frame, row, column, rows in
    tubelet, merge block, patch-in-block order (numpy indexing below; no resize, no normalisation)."""
    rng = np.random.default_rng(0)
    clip = rng.integers(0, 256, (3, 8, 16, 3), dtype=np.uint8)
    vp = FrameVideoProcessor({"patch_size": 4, "merge_size": 2, "temporal_patch_size": 2, "do_resize": False, "do_normalize": False})
    out = vp(videos=[clip], video_metadata=[{"total_num_frames": 3, "fps": 2.0}], return_metadata=True)
    x = np.concatenate([clip, clip[-1:]]).astype(np.float32) / 255
    want = []
    for g in range(2):
        for bi, bj in [(0, 0), (0, 1)]:  # merge blocks of the 2 x 4 patch grid
            for i, j in [(0, 0), (0, 1), (1, 0), (1, 1)]:
                r, c = 2 * bi + i, 2 * bj + j
                patch = x[2 * g : 2 * g + 2, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4, :]  # [frame, row, col, channel]
                want.append(patch.transpose(3, 0, 1, 2).reshape(-1))
    assert out["video_grid_thw"].tolist() == [[2, 2, 4]]
    torch.testing.assert_close(out["pixel_values_videos"], torch.from_numpy(np.stack(want)), rtol=0, atol=1e-6)
    assert out["video_metadata"][0].frames_indices is None  # not sampled: the metadata as given
