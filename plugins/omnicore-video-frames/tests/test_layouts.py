"""The einops layouts (patchify into tubelets and back, frames channel-first) give bit for bit the
tensors of the reshape/permute expressions they replaced, written here as the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnicore_video_frames.augment import frames_to_patches, patches_to_frames
from omnicore_video_frames.processor import VideoFramesProcessor

# (gt, tp, C, gh, gw, P, m): one or two tubelets, square and oblong grids, merge 1 and 2
CASES = [(1, 2, 3, 4, 4, 2, 2), (2, 2, 3, 4, 6, 3, 2), (3, 1, 3, 2, 4, 2, 1), (1, 2, 1, 6, 2, 1, 2)]


def _old_frames_to_patches(frames: torch.Tensor, tp: int, p: int, m: int) -> torch.Tensor:
    t, c, h, w = frames.shape
    gt, gh, gw = t // tp, h // p, w // p
    x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tp * p * p)


def _old_patches_to_frames(patches: torch.Tensor, grid: tuple[int, int, int], tp: int, p: int, m: int) -> torch.Tensor:
    gt, gh, gw = grid
    c = patches.shape[1] // (tp * p * p)
    x = patches.reshape(gt, gh // m, gw // m, m, m, c, tp, p, p)
    x = x.permute(0, 6, 5, 1, 3, 7, 2, 4, 8)
    return x.reshape(gt * tp, c, gh * p, gw * p)


@pytest.mark.parametrize("case", CASES)
def test_tubelet_layouts_equal_the_reshape_permute_expressions(case):
    gt, tp, c, gh, gw, p, m = case
    g = torch.Generator().manual_seed(sum(case))
    frames = torch.randn(gt * tp, c, gh * p, gw * p, generator=g)
    patches = frames_to_patches(frames, tp, p, m)
    want = _old_frames_to_patches(frames, tp, p, m)
    assert patches.shape == want.shape == (gt * gh * gw, c * tp * p * p) and torch.equal(patches, want)
    back = patches_to_frames(patches, (gt, gh, gw), tp, p, m)
    assert torch.equal(back, _old_patches_to_frames(patches, (gt, gh, gw), tp, p, m)) and torch.equal(back, frames)
    for dtype in (torch.bfloat16, torch.float16):  # a pure layout: any dtype, the same bits
        assert torch.equal(frames_to_patches(frames.to(dtype), tp, p, m), want.to(dtype))


def test_frames_go_channel_first_as_the_numpy_transpose_did():
    proc = VideoFramesProcessor(patch_size=2, merge_size=2, temporal_patch_size=2, fps=2.0, max_frames=4)
    frames = np.random.default_rng(0).integers(0, 256, (3, 8, 12, 3), dtype=np.uint8)
    got = proc._normalise(frames)
    x = (frames.astype(np.float32) / 255.0 - proc.mean) / proc.std
    want = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    assert got.shape == (3, 3, 8, 12) and got.dtype == want.dtype and got.flags["C_CONTIGUOUS"]
    assert np.array_equal(got, want)
