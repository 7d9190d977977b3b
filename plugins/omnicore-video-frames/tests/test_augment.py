"""Augmentation of clips while training: the patch layout round trip, shifts of the measured size,
reversal in time, and eval mode untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from omnicore.api import Video
from omnicore_video_frames.augment import VideoAugmentOptions, augment_clips, frames_to_patches, patches_to_frames
from omnicore_video_frames.encoder import build
from omnicore_video_frames.processor import build_processor

TINY = dict(depth=1, embed_dim=16, num_heads=2, mlp_ratio=2, hidden_size=24, patch_size=4, spatial_merge_size=2)
OPTS = {"config": TINY, "fps": 4, "max_frames": 8, "frame_size": [16, 24]}


def _frames(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 16, 24, 3), dtype=np.uint8)


def test_patches_to_frames_inverts_the_processors_patchify():
    proc = build_processor(OPTS)
    x = np.random.default_rng(1).standard_normal((6, 3, 16, 24)).astype(np.float32)
    patches, grid = proc.patchify(x)
    assert grid == (3, 4, 6)
    back = patches_to_frames(torch.from_numpy(patches), grid, 2, 4, 2)
    assert torch.equal(back, torch.from_numpy(x))
    assert torch.equal(frames_to_patches(back, 2, 4, 2), torch.from_numpy(patches))


def test_shift_moves_the_content_by_the_drawn_fraction():
    """A bright 4 x 4 square on black: its centre of mass moves by (dx * W, dy * H) pixels, the
    fractions being the generator's first two draws scaled to [-shift, shift]."""
    proc = build_processor(OPTS)
    frames = np.zeros((2, 3, 16, 24), dtype=np.float32)
    frames[:, :, 6:10, 10:14] = 1.0
    patches, grid = proc.patchify(frames)
    opts = VideoAugmentOptions(shift=0.2)
    for seed in range(4):
        draw = (torch.rand(2, generator=torch.Generator().manual_seed(seed)) * 2 - 1) * 0.2
        out = augment_clips(
            torch.from_numpy(patches), torch.tensor([grid]), opts, tp=2, p=4, m=2, generator=torch.Generator().manual_seed(seed)
        )
        moved = patches_to_frames(out, grid, 2, 4, 2)[0, 0]
        ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(24.0), indexing="ij")
        cy, cx = float((moved * ys).sum() / moved.sum()), float((moved * xs).sum() / moved.sum())
        assert cx == pytest.approx(11.5 + float(draw[0]) * 24, abs=0.05) and cy == pytest.approx(7.5 + float(draw[1]) * 16, abs=0.05)


def test_reverse_plays_some_clips_backwards_and_leaves_the_rest():
    proc = build_processor(OPTS)
    clips = [proc.preprocess(Video(frames=_frames(4, s), fps=4.0)) for s in range(12)]
    batch = proc.collate(clips)
    out = augment_clips(batch["pixel_values_videos"], batch["video_grid_thw"], VideoAugmentOptions(reverse=True), tp=2, p=4, m=2,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    flipped, start = [], 0
    for c in clips:
        n = c["pixel_values_videos"].shape[0]
        grid = tuple(c["video_grid_thw"].tolist())
        got, want = patches_to_frames(out[start : start + n], grid, 2, 4, 2), patches_to_frames(c["pixel_values_videos"], grid, 2, 4, 2)
        start += n
        assert torch.equal(got, want) or torch.equal(got, want.flip(0))
        flipped.append(not torch.equal(got, want))
    assert 0 < sum(flipped) < len(clips)  # about half, with this seed 1 to 11 of 12


def test_the_encoder_augments_in_training_mode_only():
    torch.manual_seed(0)
    plain = build(OPTS, hidden_size=8)
    torch.manual_seed(0)
    aug = build({**OPTS, "augment": {"shift": 0.1, "reverse": True}}, hidden_size=8)
    batch = aug.processor.collate([aug.processor.preprocess(Video(frames=_frames(n, n), fps=4.0)) for n in (4, 6)])
    with torch.no_grad():
        assert torch.equal(aug.eval()(batch), plain.eval()(batch))
        assert not torch.allclose(aug.train()(batch), plain.train()(batch))


def test_options_are_checked():
    assert not VideoAugmentOptions().active
    with pytest.raises(ValidationError, match="shift"):
        build({**OPTS, "augment": {"shift": 0.6}}, hidden_size=8)
    with pytest.raises(ValidationError, match="rotate"):
        build({**OPTS, "augment": {"rotate": 10}}, hidden_size=8)


def test_still_images_get_their_own_options_and_clips_theirs():
    """In one batch of a clip and a still image (``second_per_grid_ts`` 0, as ``video_frames_image``
    makes it): ``still_options`` shifts the image by its draw, ``options`` (reverse only) never shifts
    the clip, which is the input or the input reversed."""
    proc = build_processor(OPTS)
    clip = proc.preprocess(Video(frames=_frames(4, 3), fps=4.0))
    image = np.zeros((2, 3, 16, 24), dtype=np.float32)
    image[:, :, 6:10, 10:14] = 1.0
    patches, grid = proc.patchify(image)
    still = {
        "pixel_values_videos": torch.from_numpy(patches),
        "video_grid_thw": torch.tensor(grid),
        "second_per_grid_ts": torch.tensor(0.0),
    }
    batch = proc.collate([clip, still])
    flags = batch["second_per_grid_ts"] == 0
    assert flags.tolist() == [False, True]
    out = augment_clips(batch["pixel_values_videos"], batch["video_grid_thw"], VideoAugmentOptions(reverse=True), tp=2, p=4, m=2,
                        generator=torch.Generator().manual_seed(0), still=flags, still_options=VideoAugmentOptions(shift=0.2))  # fmt: skip
    n = clip["pixel_values_videos"].shape[0]
    cgrid = tuple(clip["video_grid_thw"].tolist())
    got, want = patches_to_frames(out[:n], cgrid, 2, 4, 2), patches_to_frames(clip["pixel_values_videos"], cgrid, 2, 4, 2)
    assert torch.equal(got, want) or torch.equal(got, want.flip(0))
    moved = patches_to_frames(out[n:], grid, 2, 4, 2)[0, 0]
    ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(24.0), indexing="ij")
    cx = float((moved * xs).sum() / moved.sum())
    assert abs(cx - 11.5) > 0.05 and abs(cx - 11.5) <= 0.2 * 24 + 0.05  # moved, within the still image's largest shift


def test_image_augment_defaults_to_augment_and_overrides_it():
    enc = build({**OPTS, "augment": {"shift": 0.05, "reverse": True}}, hidden_size=8)
    assert enc.image_augment == enc.augment
    enc = build({**OPTS, "augment": {"shift": 0.05, "reverse": True}, "image_augment": {"shift": 0.25}}, hidden_size=8)
    assert (enc.augment.shift, enc.augment.reverse, enc.image_augment.shift, enc.image_augment.reverse) == (0.05, True, 0.25, False)
