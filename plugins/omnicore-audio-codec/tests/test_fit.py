"""Fitting the codec on real speech (the digits example's FSDD recordings), the loss and figures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from omnicore.api import load_audio
from omnicore_audio_codec.decoder import build
from omnicore_audio_codec.fit import fit_codec, reconstruction_figures
from omnicore_audio_codec.fit import main as fit_main
from omnicore_audio_codec.losses import clip_figures, multi_resolution_mel_loss

RECORDINGS = Path(__file__).resolve().parents[3] / "examples" / "digits" / "raw" / "fsdd" / "recordings"
TINY = {"num_filters": 4, "hidden_size": 16, "codebook_size": 32, "upsampling_ratios": [8, 5, 4, 2], "num_quantizers": 2}
needs_fsdd = pytest.mark.skipif(not RECORDINGS.is_dir(), reason="the digits example's FSDD recordings are not here")


def _takes(take: int, speakers: int = 2) -> list[Path]:
    names = sorted({p.name.split("_")[1] for p in RECORDINGS.glob("0_*_0.wav")})[:speakers]
    return [RECORDINGS / f"{d}_{s}_{take}.wav" for s in names for d in range(0, 10, 3)]


@needs_fsdd
def test_fit_lowers_the_loss_on_spoken_digits():
    clips = [load_audio(f) for f in _takes(5)]  # 8 kHz WAVs, resampled to 16 kHz
    assert clips and clips[0].sample_rate == 8000
    torch.manual_seed(0)
    d = build({"config": TINY}, hidden_size=8)
    before = {k: v.clone() for k, v in d.codec.state_dict().items()}
    losses = fit_codec(d, clips, steps=24, batch_size=4, lr=3e-3, seed=0, segment_seconds=0.25)
    assert len(losses) == 24 and all(np.isfinite(losses))
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:3]), losses
    after = d.codec.state_dict()
    assert not torch.equal(after["quantizer.layers.0.codebook.embed"], before["quantizer.layers.0.codebook.embed"])
    assert not any(p.requires_grad for p in d.codec.parameters()) and not d.codec.training  # freezing restored
    figs = reconstruction_figures(d, clips[:2])
    assert set(figs) == {"mel_l1", "snr_db"} and math.isfinite(figs["mel_l1"])


@needs_fsdd
def test_fit_cli_writes_a_folder_that_loads(tmp_path, capsys):
    files = _takes(6, speakers=1)[:2]
    argv = ["--audio", *map(str, files), "--held-out", str(files[0]), "--out", str(tmp_path / "codec"), "--steps", "2"]
    argv += ["--batch-size", "2", "--segment-seconds", "0.1", "--config", '{"num_filters": 4, "hidden_size": 8, "codebook_size": 16}']
    assert fit_main(argv) == 0
    assert {p.name for p in (tmp_path / "codec").iterdir()} == {"config.json", "model.safetensors"}
    assert "held-out (1 clips): mel_l1" in capsys.readouterr().out
    d = build({"checkpoint": str(tmp_path / "codec")}, hidden_size=8)
    assert (d.num_quantizers, d.bins, d.processor.hop_length) == (2, 16, 320)


def test_clip_figures_against_values_computed_by_hand():
    x = torch.from_numpy((0.3 * np.random.default_rng(0).standard_normal(4000)).astype(np.float32))  # energy in every band
    figs = clip_figures(0.9 * x, x, 16000)
    assert figs["snr_db"] == pytest.approx(20.0, abs=1e-3)  # noise 0.1 x: 10 log10(1 / 0.01)
    assert figs["mel_l1"] == pytest.approx(-math.log(0.9), rel=1e-3)  # mel magnitudes scale with amplitude: log 0.9 lower
    assert clip_figures(x, x, 16000) == {"mel_l1": 0.0, "snr_db": math.inf}
    assert float(multi_resolution_mel_loss(x[None], x[None], 16000)) == 0.0
    assert float(multi_resolution_mel_loss(0.5 * x[None], x[None], 16000)) > 0.5  # |log 0.5| = 0.69 per scale, plus linear
