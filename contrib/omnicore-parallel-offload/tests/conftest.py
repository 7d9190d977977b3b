"""Fixtures of the plugin's tests: a tiny omni-modal run config and a small real-data set.

The core's ``digits_jsonl`` fixture lives in omnicore's own ``tests/conftest.py``, which a plugin's
tests do not see; this builds the same kind of data set with ``examples/digits/build_data.py`` from
the omnicore source tree (found from this file, or from ``OMNICORE_SOURCE``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("OMNICORE_SOURCE", Path(__file__).resolve().parents[3]))
BUILD_DATA = SOURCE / "examples" / "digits" / "build_data.py"

# the tiny components of omnicore's tests/conftest.py
TINY_LM = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}
TINY_SIGLIP = {
    "image_size": 28,
    "patch_size": 7,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
TINY_WHISPER = {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "num_mel_bins": 80}
TINY_MOVQ = {"block_out_channels": [32, 32, 32], "latent_channels": 4, "vq_embed_dim": 4, "num_vq_embeddings": 64, "layers_per_block": 1}


def tiny_run_config(train: str, output_dir: str, strategy: str, max_steps: int) -> dict:
    """A run config (as a dict) for the tiny omni-modal model, with the given parallel strategy."""
    return {
        "run": {"output_dir": output_dir, "seed": 0, "device": "cpu"},
        "model": {
            "foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM)}},
            "encoders": {
                "image": {"name": "siglip", "options": {"config": dict(TINY_SIGLIP)}},
                "audio": {"name": "whisper", "options": {"config": dict(TINY_WHISPER), "chunk_seconds": 2.5, "pool": 5}},
            },
            "decoders": {"image": {"name": "movqgan", "options": {"config": dict(TINY_MOVQ), "image_size": 32}}},
        },
        "data": {"train": train, "max_tokens": 512, "shuffle": True},
        "train": {"max_steps": max_steps, "lr": 3e-3, "warmup_steps": 1, "progress": False, "export": False, "save_every": 0},
        "parallel": {"strategies": [strategy], "backend": "gloo"},
    }


@pytest.fixture(scope="session")
def digits_data(tmp_path_factory) -> Path:
    """train.jsonl (24 images, 16 clips, 8 image targets) and its media, built from the shipped digits."""
    if not BUILD_DATA.is_file():
        pytest.skip(f"needs the omnicore source tree for {BUILD_DATA} (set OMNICORE_SOURCE)")
    out = tmp_path_factory.mktemp("digits")
    subprocess.run(
        [
            sys.executable,
            str(BUILD_DATA),
            "--out",
            str(out),
            "--train-images",
            "24",
            "--train-audio",
            "16",
            "--gen",
            "8",
            "--eval-images",
            "6",
            "--eval-audio",
            "6",
            "--seed",
            "0",
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def run_config():
    """:func:`tiny_run_config`, as a fixture (test modules cannot import this conftest by name)."""
    return tiny_run_config
