"""The data side of decoder/movqgan apart from its weights: the processor built from options alone
gives exactly the module's features, code counts and batches, survives pickling, and a checkpoint's
processor reads no weights (the weights file is deleted before it is built)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from omnicore.api import Registry
from omnicore_image_movqgan.decoder import build
from omnicore_image_movqgan.processor import MoVQGANProcessor, build_processor

TINY = {"block_out_channels": [32, 32], "latent_channels": 4, "num_vq_embeddings": 64, "sample_size": 16}
H = 32


def images() -> list[Image.Image]:
    rng = np.random.default_rng(5)
    return [
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8), "RGB"),
        Image.fromarray(rng.integers(0, 256, (9, 30), dtype=np.uint8), "L"),
    ]


def assert_processors_agree(proc, other) -> None:
    feats = [proc.preprocess(m) for m in images()]
    for f, g in zip(feats, [other.preprocess(m) for m in images()]):
        assert torch.equal(f["pixel_values"], g["pixel_values"])
        assert proc.num_tokens(f) == other.num_tokens(g)
    assert torch.equal(proc.collate(feats)["pixel_values"], other.collate(feats)["pixel_values"])


@pytest.mark.slow
def test_processor_equals_the_modules_data_side():
    torch.manual_seed(0)
    options = {"config": TINY, "image_size": 16}
    module = build(options, hidden_size=H).eval()
    proc = Registry.discover().build_processor("decoder", "movqgan", options)
    assert isinstance(proc, MoVQGANProcessor) and (proc.image_size, proc.downsample_factor) == (16, 2)
    assert_processors_agree(proc, module.processor)
    feats = [proc.preprocess(m) for m in images()]
    assert [proc.num_tokens(f) for f in feats] == [64, 64]  # (16 / 2) ** 2
    want = np.asarray(images()[0].resize((16, 16), Image.BICUBIC), dtype=np.float32) / 127.5 - 1.0
    np.testing.assert_array_equal(feats[0]["pixel_values"].permute(1, 2, 0).numpy(), want)
    assert module.encode(proc.collate(feats)).shape == (128,)


def test_processor_pickles():
    proc = build_processor({"config": TINY})
    assert (proc.image_size, proc.downsample_factor) == (32, 2)
    assert_processors_agree(proc, pickle.loads(pickle.dumps(proc)))


@pytest.mark.parametrize(("saved", "given", "want"), [(16, None, 16), (16, 8, 8)])
def test_checkpoint_processor_reads_no_weights(tmp_path, saved, given, want):
    torch.manual_seed(0)
    build({"config": dict(TINY, sample_size=32), "image_size": saved}, hidden_size=H).save_pretrained(tmp_path / "ckpt")
    options = {"checkpoint": str(tmp_path / "ckpt"), "image_size": given}
    loaded = build(options, hidden_size=H)
    (tmp_path / "ckpt" / "diffusion_pytorch_model.safetensors").unlink()
    proc = build_processor(options)
    assert proc.image_size == loaded.image_size == want  # the size saved with the adapter unless given
    assert_processors_agree(proc, loaded.processor)


def test_checkpoint_processor_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match=rf"cannot read {tmp_path / 'none' / 'config.json'}"):
        build_processor({"checkpoint": str(tmp_path / "none")})


@pytest.mark.cli
def test_processor_module_imports_no_model_code():
    """Data workers import the processor's module: building a processor pulls in no model code."""
    code = (
        "import importlib, sys\n"
        "importlib.import_module('omnicore_image_movqgan.processor').build_processor({'config': {}})\n"
        "print(','.join(m for m in sys.modules if m.startswith(('diffusers',))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ""
