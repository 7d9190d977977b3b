"""The data side of encoder/whisper apart from its weights: the processor built from options alone
gives exactly the module's features, token counts and batches, survives pickling, and a checkpoint's
processor reads no weights (the weights file is deleted before it is built)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from omnicore.api import Audio, Registry
from omnicore_audio_whisper.encoder import build
from omnicore_audio_whisper.processor import WhisperAudioProcessor, build_processor

H = 32
TINY = {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "num_mel_bins": 80}
OPTIONS = {"config": TINY, "chunk_seconds": 1.0, "pool": 3}


def clips() -> list[Audio]:
    """0.4 s at 16 kHz, 2.5 s at 22.05 kHz (three windows of 1 s), 0.9 s at 8 kHz: token counts differ."""
    rng = np.random.default_rng(7)
    spec = [(0.4, 16000), (2.5, 22050), (0.9, 8000)]
    return [Audio((0.1 * rng.standard_normal(int(s * r))).astype(np.float32), r) for s, r in spec]


def assert_same_features(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])), k


def assert_processors_agree(proc, other) -> None:
    feats = [proc.preprocess(c) for c in clips()]
    for f, g in zip(feats, [other.preprocess(c) for c in clips()]):
        assert_same_features(f, g)
        assert proc.num_tokens(f) == other.num_tokens(g)
    assert_same_features(proc.collate(feats), other.collate(feats))


def test_processor_equals_the_modules_data_side():
    torch.manual_seed(0)
    module = build(OPTIONS, hidden_size=H)
    proc = Registry.discover().build_processor("encoder", "whisper", OPTIONS)
    assert isinstance(proc, WhisperAudioProcessor) and proc.modality == "audio"
    assert_processors_agree(proc, module.processor)
    # token counts by the formula: 0.4 s -> 40 frames -> 20 positions -> 7 tokens (pool 3);
    # 2.5 s -> windows of 100, 100, 50 frames -> 17 + 17 + 9; 0.9 s -> 90 frames -> 45 -> 15
    feats = [proc.preprocess(c) for c in clips()]
    assert [proc.num_tokens(f) for f in feats] == [7, 43, 15]
    assert tuple(feats[1]["input_features"].shape) == (3, 80, 100)
    with torch.no_grad():
        assert module.eval()(proc.collate(feats)).shape == (7 + 43 + 15, H)


def test_processor_pickles():
    proc = build_processor(OPTIONS)
    assert_processors_agree(proc, pickle.loads(pickle.dumps(proc)))


def test_long_audio_refuse_is_the_same_error():
    proc = build_processor(dict(OPTIONS, long_audio="refuse"))
    with pytest.raises(ValueError, match=r"audio is 2\.50 s long, .*chunk_seconds=1 s \(long_audio: refuse\)"):
        proc.preprocess(clips()[1])


def test_checkpoint_processor_reads_no_weights(tmp_path):
    torch.manual_seed(0)
    module = build(OPTIONS, hidden_size=H)
    module.save_pretrained(tmp_path / "ckpt")
    loaded = build({"checkpoint": str(tmp_path / "ckpt"), "chunk_seconds": 1.0, "pool": 3}, hidden_size=H)
    for name in ("model.safetensors", "omnicore_extra.safetensors"):
        (tmp_path / "ckpt" / name).unlink()
    proc = build_processor({"checkpoint": str(tmp_path / "ckpt"), "chunk_seconds": 1.0, "pool": 3})
    assert_processors_agree(proc, loaded.processor)
    assert proc.feature_extractor.to_dict() == loaded.feature_extractor.to_dict()


def test_checkpoint_processor_errors_name_the_folder(tmp_path):
    with pytest.raises(ValueError, match=rf"{tmp_path / 'none'} has no config.json"):
        build_processor({"checkpoint": str(tmp_path / "none")})
    with pytest.raises(ValueError, match="max_source_positions is set from chunk_seconds"):
        build_processor({"config": dict(TINY, max_source_positions=50)})


@pytest.mark.cli
def test_processor_module_imports_no_model_code():
    """Data workers import the processor's module: building a processor pulls in no model code."""
    code = (
        "import importlib, sys\n"
        "importlib.import_module('omnicore_audio_whisper.processor').build_processor({'config': {}})\n"
        "print(','.join(m for m in sys.modules if m.startswith(('transformers.models.whisper.modeling_whisper',))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ""
