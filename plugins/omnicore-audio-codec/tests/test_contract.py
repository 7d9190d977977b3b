"""decoder/encodec against omnicore's decoder contract suite (omnicore.testing.DecoderContract).

The suite's default audio (0.3 s, 1.1 s at 22.05 kHz, 0.7 s) is padded to max_seconds = 1.2 s:
with hop 160 at 16 kHz that is 120 frames x 2 codebooks = 240 codes per clip.
"""

from __future__ import annotations

import pytest

from omnicore.testing import DecoderContract


@pytest.mark.slow
class TestEncodecContract(DecoderContract):
    name = "encodec"
    options = {
        "config": {"num_filters": 4, "hidden_size": 8, "codebook_size": 16, "upsampling_ratios": [8, 5, 4], "num_quantizers": 2},
        "max_seconds": 1.2,
    }
    hidden_size = 32


@pytest.mark.slow
class TestEncodecDepthContract(DecoderContract):
    """The same codec with one LM position per frame: codes ``[frames, 2]``, a depth decoder for codebook 1."""

    name = "encodec"
    options = {
        "config": {"num_filters": 4, "hidden_size": 8, "codebook_size": 16, "upsampling_ratios": [8, 5, 4], "num_quantizers": 2},
        "max_seconds": 1.2,
        "codebooks": "depth",
        "depth": {"layers": 1, "hidden_size": 16, "heads": 2},
    }
    hidden_size = 32
