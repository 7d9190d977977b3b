"""Over-long audio (longer than chunk_seconds) is split into encoder windows or refused, never cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnicore.api import Audio
from omnicore_audio_whisper.encoder import WhisperEncoderOptions, build, num_tokens_for_frames

TINY = {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "num_mel_bins": 80}


def noise(seconds: float, rate: int = 16000, seed: int = 0) -> Audio:
    rng = np.random.default_rng(seed)
    return Audio((0.1 * rng.standard_normal(int(round(seconds * rate)))).astype(np.float32), rate)


@pytest.fixture(scope="module")
def enc():
    torch.manual_seed(0)
    return build({"config": TINY, "chunk_seconds": 2.5, "pool": 5}, hidden_size=16).eval()


def test_default_policy_is_split():
    assert WhisperEncoderOptions().long_audio == "split"


def test_long_clip_splits_into_windows_with_consistent_tokens(enc):
    clip = noise(6.2)  # 2.5 s + 2.5 s + 1.2 s at 16 kHz
    feats = enc.processor.preprocess(clip)
    assert tuple(feats["input_features"].shape) == (3, 80, 250)
    assert feats["valid_frames"].tolist() == [250, 250, 120]
    # each window is exactly the features of that slice as a clip of its own
    for w, (a, b) in enumerate([(0, 40000), (40000, 80000), (80000, 99200)]):
        alone = enc.processor.preprocess(Audio(clip.samples[a:b], 16000))
        torch.testing.assert_close(feats["input_features"][w], alone["input_features"], rtol=0, atol=0)
    expected = 2 * num_tokens_for_frames(250, 5) + num_tokens_for_frames(120, 5)
    assert expected == 2 * 25 + 12
    assert enc.processor.num_tokens(feats) == expected
    short = enc.processor.preprocess(noise(1.0, seed=1))
    batch = enc.processor.collate([short, feats])
    assert batch["valid_frames"].tolist() == [100, 250, 250, 120]
    with torch.no_grad():
        out = enc(batch)
    assert tuple(out.shape) == (enc.processor.num_tokens(short) + expected, 16)
    # the clip's rows equal its windows encoded on their own, in order
    with torch.no_grad():
        alone_rows = enc(enc.processor.collate([feats]))
    torch.testing.assert_close(out[enc.processor.num_tokens(short) :], alone_rows, rtol=1e-5, atol=1e-6)


def test_clip_of_exactly_one_window_is_not_split(enc):
    feats = enc.processor.preprocess(noise(2.5))
    assert tuple(feats["input_features"].shape) == (80, 250)
    assert int(feats["valid_frames"]) == 250


def test_refuse_names_duration_and_limit():
    enc = build({"config": TINY, "chunk_seconds": 2.5, "pool": 5, "long_audio": "refuse"}, hidden_size=16)
    with pytest.raises(ValueError) as ei:
        enc.processor.preprocess(noise(6.2))
    msg = str(ei.value)
    assert "6.20 s" in msg and "chunk_seconds=2.5 s" in msg and "long_audio: refuse" in msg
    assert int(enc.processor.preprocess(noise(2.0))["valid_frames"]) == 200  # within the window: accepted
