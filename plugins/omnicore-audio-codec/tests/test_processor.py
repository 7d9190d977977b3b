"""The data side of decoder/encodec apart from its weights: the processor built from options alone
gives exactly the module's features, code counts and batches, survives pickling, and a checkpoint's
processor reads no weights (the weights file is deleted before it is built)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from omnicore.api import Audio, Registry
from omnicore_audio_codec.decoder import build
from omnicore_audio_codec.processor import CodecProcessor, build_processor

TINY = {"num_filters": 4, "hidden_size": 8, "codebook_size": 16, "upsampling_ratios": [8, 5, 4], "num_quantizers": 2}
H = 16


def clips() -> list[Audio]:
    rng = np.random.default_rng(5)
    return [
        Audio((0.2 * rng.standard_normal(2000)).astype(np.float32), 16000),
        Audio((0.2 * rng.standard_normal(900)).astype(np.float32), 8000),
    ]


def assert_processors_agree(proc, other) -> None:
    feats = [proc.preprocess(m) for m in clips()]
    for f, g in zip(feats, [other.preprocess(m) for m in clips()]):
        assert torch.equal(f["input_values"], g["input_values"])
        assert proc.num_tokens(f) == other.num_tokens(g)
    a, b = proc.collate(feats), other.collate(feats)
    assert all(torch.equal(a[k], b[k]) for k in ("input_values", "num_samples"))


def test_processor_equals_the_modules_data_side():
    torch.manual_seed(0)
    options = {"config": TINY, "max_seconds": 0.25}
    module = build(options, hidden_size=H).eval()
    proc = Registry.discover().build_processor("decoder", "encodec", options)
    assert isinstance(proc, CodecProcessor)
    assert (proc.sample_rate, proc.hop_length, proc.num_quantizers, proc.max_samples) == (16000, 160, 2, 4000)
    assert_processors_agree(proc, module.processor)
    feats = [proc.preprocess(m) for m in clips()]
    assert [proc.num_tokens(f) for f in feats] == [50, 50]  # ceil(4000 / 160) * 2
    assert module.encode(proc.collate(feats)).shape == (100,)


def test_processor_pickles():
    proc = build_processor({"config": TINY})
    assert proc.max_seconds == 1.0 and proc.max_samples == 16000
    assert_processors_agree(proc, pickle.loads(pickle.dumps(proc)))


@pytest.mark.slow
@pytest.mark.parametrize(("given", "want"), [(None, 0.25), (0.5, 0.5)])
def test_checkpoint_processor_reads_no_weights(tmp_path, given, want):
    torch.manual_seed(0)
    build({"config": TINY, "max_seconds": 0.25}, hidden_size=H).save_pretrained(tmp_path / "ckpt")
    options = {"checkpoint": str(tmp_path / "ckpt"), "max_seconds": given}
    loaded = build(options, hidden_size=H)
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    proc = build_processor(options)
    assert proc.max_seconds == loaded.max_seconds == want  # the value saved with the adapter unless given
    assert_processors_agree(proc, loaded.processor)


@pytest.mark.cli
def test_processor_module_imports_no_model_code():
    """Data workers import the processor's module: building a processor pulls in no model code."""
    code = (
        "import importlib, sys\n"
        "importlib.import_module('omnicore_audio_codec.processor').build_processor({'config': {}})\n"
        "print(','.join(m for m in sys.modules if m.endswith(('modeling_encodec', 'transformers.modeling_utils'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ""
