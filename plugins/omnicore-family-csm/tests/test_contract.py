"""decoder/csm_audio against omnicore's decoder contract suite, on the stand-in checkpoint (``K = 4``
codebooks per frame: the suite's depth-decoder checks run)."""

from __future__ import annotations

import pytest

from omnicore.testing import DecoderContract


class TestCsmAudioDecoderContract(DecoderContract):
    name = "csm_audio"
    plugin = "omnicore_family_csm.plugin"
    provider = "omnicore-family-csm"
    hidden_size = 32
    seeded_init = False  # every tensor comes from the checkpoint: seeds change nothing

    @pytest.fixture(autouse=True)
    def _standin_options(self, standin):
        type(self).options = {"checkpoint": str(standin), "max_seconds": 0.5}
