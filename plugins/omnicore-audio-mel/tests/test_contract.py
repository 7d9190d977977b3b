"""decoder/mel_rvq against omnicore's decoder contract suite (omnicore.testing.DecoderContract).

The suite's default audio (0.3 s, 1.1 s at 22.05 kHz, 0.7 s) is resampled to 8 kHz and padded to
max_seconds = 1.2 s: 9600 samples, 121 mel frames, 61 code frames of stack 2 per clip.
"""

from __future__ import annotations

import pytest

from omnicore.testing import DecoderContract

TINY = {"n_mels": 16, "stack": 2, "num_codebooks": 3, "codebook_size": 16, "griffin_lim_iters": 4}


@pytest.mark.slow
class TestMelDepthContract(DecoderContract):
    """Two of the tokenizer's three codebooks per frame: codes ``[frames, 2]``, a depth decoder for codebook 1."""

    name = "mel_rvq"
    options = {"config": TINY, "num_codebooks": 2, "max_seconds": 1.2, "depth": {"layers": 1, "hidden_size": 16, "heads": 2}}
    hidden_size = 32


class TestMelOneCodebookContract(DecoderContract):
    """The first codebook alone: one code per LM position, no depth decoder."""

    name = "mel_rvq"
    options = {"config": TINY, "num_codebooks": 1, "max_seconds": 1.2}
    hidden_size = 32
