"""decoder/movqgan against omnicore's decoder contract suite (omnicore.testing.DecoderContract)."""

from __future__ import annotations

from omnicore.testing import DecoderContract


class TestMoVQGANContract(DecoderContract):
    name = "movqgan"
    # 16x16 images, 2 levels: an 8x8 grid of codes from a 64-entry codebook
    options = {
        "config": {"block_out_channels": [32, 32], "latent_channels": 4, "num_vq_embeddings": 64, "sample_size": 16},
        "image_size": 16,
    }
    hidden_size = 32
    image_size = (16, 16)
