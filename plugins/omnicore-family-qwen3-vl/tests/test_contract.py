"""encoder/qwen3_vl_encoder against omnicore's encoder contract suite on the stand-in checkpoint,
as the image encoder and as the video encoder (``modality: video``); its DeepStack rows
(``EncoderOutput.layer_embeds``) are checked with the placeholder rows.

The factory returns the tower on the meta device with its load plan (the core fills it after
sharding); ``build`` fills it at once, as the core would.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnicore.api import Video, fill_now
from omnicore.testing import EncoderContract


class TestQwen3VLImageEncoderContract(EncoderContract):
    name = "qwen3_vl_encoder"
    plugin = "omnicore_family_qwen3_vl.plugin"
    provider = "omnicore-family-qwen3-vl"
    hidden_size = 64
    seeded_init = False  # every weight comes from the checkpoint: seeds change nothing
    modality = "image"

    @pytest.fixture(autouse=True)
    def _standin_options(self, standin):
        type(self).options = {"checkpoint": str(standin), "modality": self.modality}
        type(self).core_foundation = {"name": "qwen3_vl", "options": {"checkpoint": str(standin)}}  # it takes the DeepStack rows

    def build(self, options=None, *, seed=None, registry=None):
        module = super().build(options, seed=seed, registry=registry)
        return module if torch.get_default_device().type == "meta" else fill_now(module)


class TestQwen3VLVideoEncoderContract(TestQwen3VLImageEncoderContract):
    modality = "video"
    core_export = False  # the qwen3_vl export holds one tower; a video tower apart from the image one it brings has no place

    def make_media(self, modality):
        """Three seeded clips of other lengths, sizes and rates (one an odd number of frames)."""
        rng = np.random.default_rng(self.seed)
        shapes = [(4, 64, 64, 2.0), (3, 40, 90, 1.0), (6, 112, 84, 5.0)]
        return [Video(frames=rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8), fps=fps) for n, h, w, fps in shapes]
