"""encoder/whisper against omnicore's encoder contract suite (omnicore.testing.EncoderContract).

The suite's default audio (0.3 s, 1.1 s at 22.05 kHz, 0.7 s) gives 3, 11 and 7 tokens with
``pool=5``, so the per-item token counts really differ.
"""

from __future__ import annotations

from omnicore.testing import EncoderContract


class TestWhisperContract(EncoderContract):
    name = "whisper"
    options = {
        "config": {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "num_mel_bins": 80},
        "chunk_seconds": 1.5,
        "pool": 5,
    }
    hidden_size = 32
