"""encoder/qwen2_5_omni_audio and encoder/qwen2_5_omni_vision against omnicore's encoder contract
suite on the stand-in checkpoint: the audio tower, the vision tower as the image encoder and as the
video encoder (``modality: video``; clips without sound: the contract's clips carry none).

The factories return the towers on the meta device with their load plans (the core fills them
after sharding); ``build`` fills them at once, as the core would.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnicore.api import Video, fill_now
from omnicore.testing import EncoderContract


class _Standin(EncoderContract):
    plugin = "omnicore_family_qwen2_5_omni.plugin"
    provider = "omnicore-family-qwen2-5-omni"
    hidden_size = 64
    seeded_init = False  # every weight comes from the checkpoint: seeds change nothing
    extra: dict = {}

    @pytest.fixture(autouse=True)
    def _standin_options(self, standin):
        type(self).options = {"checkpoint": str(standin), **self.extra}

    def build(self, options=None, *, seed=None, registry=None):
        module = super().build(options, seed=seed, registry=registry)
        return module if torch.get_default_device().type == "meta" else fill_now(module)


class TestQwen25OmniAudioEncoderContract(_Standin):
    name = "qwen2_5_omni_audio"


class TestQwen25OmniImageEncoderContract(_Standin):
    name = "qwen2_5_omni_vision"
    modality = "image"


class TestQwen25OmniVideoEncoderContract(_Standin):
    name = "qwen2_5_omni_vision"
    modality = "video"
    extra = {"modality": "video"}

    def make_media(self, modality):
        """Three seeded clips of other lengths, sizes and rates."""
        rng = np.random.default_rng(self.seed)
        shapes = [(4, 56, 56, 2.0), (6, 40, 90, 3.0), (8, 112, 84, 4.0)]
        return [Video(frames=rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8), fps=fps) for n, h, w, fps in shapes]
