"""encoder/video_frames against omnicore's encoder contract suite (omnicore.testing.EncoderContract)."""

from __future__ import annotations

from typing import Any

import numpy as np

from omnicore.api import Video
from omnicore.testing import EncoderContract


def clips(seed: int = 0) -> list[Video]:
    """Three random clips that differ in length (odd and even), frame rate and size."""
    rng = np.random.default_rng(seed)
    shapes = [((5, 40, 56, 3), 4.0), ((8, 64, 64, 3), 10.0), ((3, 33, 20, 3), 2.0)]
    return [Video(frames=rng.integers(0, 256, shape, dtype=np.uint8), fps=fps) for shape, fps in shapes]


class TestVideoFramesContract(EncoderContract):
    name = "video_frames"
    options = {
        "config": dict(depth=1, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=32, patch_size=8, spatial_merge_size=2),
        "fps": 4,
        "max_frames": 6,
    }
    hidden_size = 32

    def make_media(self, modality: str) -> list[Any]:
        assert modality == "video"
        return clips(self.seed)
