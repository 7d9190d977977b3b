"""The data side of encoder/siglip apart from its weights: the processor built from options alone
gives exactly the module's features, token counts and batches, survives pickling, and a checkpoint's
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
from omnicore_image_siglip.encoder import SiglipImageEncoder, build
from omnicore_image_siglip.processor import SiglipImageProcessor, build_processor

H = 32
TINY = dict(image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def images() -> list[Image.Image]:
    rng = np.random.default_rng(3)
    return [
        Image.fromarray(rng.integers(0, 256, (20, 33, 3), dtype=np.uint8), "RGB"),
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), "L"),
        Image.fromarray(rng.integers(0, 256, (50, 40, 4), dtype=np.uint8), "RGBA"),
    ]


def assert_processors_agree(proc, other) -> None:
    feats = [proc.preprocess(m) for m in images()]
    for f, g in zip(feats, [other.preprocess(m) for m in images()]):
        assert f.keys() == g.keys() and torch.equal(f["pixel_values"], g["pixel_values"])
        assert proc.num_tokens(f) == other.num_tokens(g) == 16
    assert torch.equal(proc.collate(feats)["pixel_values"], other.collate(feats)["pixel_values"])


def test_processor_equals_the_modules_data_side():
    torch.manual_seed(0)
    module = build({"config": TINY}, hidden_size=H).eval()
    proc = Registry.discover().build_processor("encoder", "siglip", {"config": TINY})
    assert isinstance(proc, SiglipImageProcessor) and proc.modality == "image"
    assert_processors_agree(proc, module.processor)
    feats = [proc.preprocess(m) for m in images()]
    # SigLIP's defaults: bicubic resize to 28x28, (x / 255 - 0.5) / 0.5; the grey image by hand
    grey = np.asarray(images()[1].convert("RGB").resize((28, 28), Image.BICUBIC), dtype=np.float64).transpose(2, 0, 1)
    np.testing.assert_allclose(feats[1]["pixel_values"].numpy(), (grey / 255 - 0.5) / 0.5, atol=1e-6)
    with torch.no_grad():
        assert module(proc.collate(feats)).shape == (3 * 16, H)


def test_processor_pickles():
    proc = build_processor({"config": TINY})
    assert_processors_agree(proc, pickle.loads(pickle.dumps(proc)))


def test_checkpoint_processor_reads_no_weights(tmp_path):
    from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(0)
    tower = SiglipVisionModel(SiglipVisionConfig(**TINY, vision_use_head=False))
    module = SiglipImageEncoder(tower, hidden_size=H, image_processor=SiglipImageProcessorPil(image_mean=[0.25, 0.5, 0.75]))
    module.save_pretrained(tmp_path / "ckpt")
    loaded = build({"checkpoint": str(tmp_path / "ckpt")}, hidden_size=H)
    for name in ("model.safetensors", "omnicore_extra.safetensors"):
        (tmp_path / "ckpt" / name).unlink()
    proc = build_processor({"checkpoint": str(tmp_path / "ckpt")})
    assert list(proc.image_processor.image_mean) == [0.25, 0.5, 0.75]
    assert_processors_agree(proc, loaded.processor)


def test_checkpoint_processor_errors_name_the_folder(tmp_path):
    with pytest.raises(ValueError, match=rf"{tmp_path / 'none'} has no config.json"):
        build_processor({"checkpoint": str(tmp_path / "none")})


@pytest.mark.cli
def test_processor_module_imports_no_model_code():
    """Data workers import the processor's module: building a processor pulls in no model code."""
    code = (
        "import importlib, sys\n"
        "importlib.import_module('omnicore_image_siglip.processor').build_processor({'config': {'image_size': 28, 'patch_size': 7}})\n"
        "print(','.join(m for m in sys.modules if m.startswith(('transformers.models.siglip.modeling_siglip',))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ""
