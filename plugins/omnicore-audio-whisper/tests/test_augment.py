"""Tests of SpecAugment masking in encoder ``whisper`` (omnicore_audio_whisper.augment)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnicore.api import Audio
from omnicore_audio_whisper.augment import SpecAugmentOptions, spec_augment
from omnicore_audio_whisper.encoder import build

TINY = {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "num_mel_bins": 80}


def _masked(opts: SpecAugmentOptions, seed: int = 0):
    feats = torch.randn(16, 80, 100)
    valid = torch.tensor([100, 40, 7, 0] * 4)
    out = spec_augment(feats, valid, opts, torch.Generator().manual_seed(seed))
    return feats, valid, out, out != feats


def test_time_masks_stay_in_the_clip_and_hold_its_mean():
    opts = SpecAugmentOptions(time_masks=2, time_width=8)
    feats, valid, out, changed = _masked(opts)
    frames = changed.any(1)  # [B, T]: frames with a change
    for b in range(16):
        n = int(valid[b])
        assert not frames[b, n:].any()  # never in the padding
        assert int(frames[b].sum()) <= 2 * 8
        assert changed[b][:, frames[b]].all()  # a time mask covers every mel channel
        mean = feats[b, :, :n].mean() if n else None
        if frames[b].any():
            torch.testing.assert_close(out[b][changed[b]], mean.expand(int(changed[b].sum())))
    assert frames[0].sum() > 0 and frames.sum() > 16  # masks are drawn, in many clips


def test_frequency_masks_cover_whole_bands_of_the_clip():
    opts = SpecAugmentOptions(freq_masks=2, freq_width=10)
    _, valid, _, changed = _masked(opts)
    for b in range(16):
        n = int(valid[b])
        rows = changed[b, :, :n].any(1)
        assert int(rows.sum()) <= 20
        assert changed[b][rows][:, :n].all() and not changed[b, :, n:].any()
    assert changed.any(2).sum(1).float().mean() > 3  # bands are drawn


def test_off_by_default_and_masks_vary_with_the_seed():
    feats = torch.randn(2, 80, 100)
    assert spec_augment(feats, torch.tensor([100, 50]), SpecAugmentOptions()) is feats
    opts = SpecAugmentOptions(freq_masks=1, freq_width=10, time_masks=1, time_width=10)
    assert not torch.equal(_masked(opts, 0)[3], _masked(opts, 1)[3])


def test_encoder_masks_in_training_mode_only():
    torch.manual_seed(0)
    opts = {"config": TINY, "chunk_seconds": 1.0, "spec_augment": {"freq_masks": 2, "freq_width": 20, "time_masks": 2, "time_width": 20}}
    enc = build(opts, hidden_size=16)
    plain = build({"config": TINY, "chunk_seconds": 1.0}, hidden_size=16)
    plain.load_state_dict(enc.state_dict())
    rng = np.random.default_rng(0)
    batch = enc.processor.collate(
        [enc.processor.preprocess(Audio(rng.standard_normal(n).astype(np.float32) * 0.1, 16000)) for n in (16000, 6000)]
    )
    enc.eval(), plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(enc(batch), plain(batch), rtol=0, atol=0)
    enc.train(), plain.train()
    with torch.no_grad():
        assert (enc(batch) - plain(batch)).abs().max() > 1e-4


def test_options_refuse_unknown_keys():
    with pytest.raises(ValueError, match="time_warp"):
        build({"config": TINY, "spec_augment": {"time_warp": 5}}, hidden_size=16)
