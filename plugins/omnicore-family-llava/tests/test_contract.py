"""encoder/llava_encoder against omnicore's encoder contract suite, on both stand-in checkpoints.

The factory returns the tower on the meta device with its load plan (the core fills it after
sharding); :meth:`TestLlavaEncoderContract.build` fills it at once, as the core would.
"""

from __future__ import annotations

import pytest
import torch

from omnicore.api import fill_now
from omnicore.testing import EncoderContract


class TestLlavaEncoderContract(EncoderContract):
    name = "llava_encoder"
    plugin = "omnicore_family_llava.plugin"
    provider = "omnicore-family-llava"
    hidden_size = 32
    seeded_init = False  # every weight comes from the checkpoint: seeds change nothing

    @pytest.fixture(autouse=True)
    def _standin_options(self, standin):
        type(self).options = {"checkpoint": str(standin)}

    def build(self, options=None, *, seed=None, registry=None):
        module = super().build(options, seed=seed, registry=registry)
        return module if torch.get_default_device().type == "meta" else fill_now(module)
