"""encoder/siglip against omnicore's encoder contract suite (omnicore.testing.EncoderContract)."""

from __future__ import annotations

from omnicore.testing import EncoderContract


class TestSiglipContract(EncoderContract):
    name = "siglip"
    options = {
        "config": dict(image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    }
    hidden_size = 32
