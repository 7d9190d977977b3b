"""Fitting the codec on real speech (the digits example's FSDD recordings), the loss and figures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from omnicore.api import Audio, load_audio
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_kmeans_codebooks_find_the_clusters_and_code_the_residuals():
    """Four tight clusters in 2-D: the first codebook's 4 entries are the cluster means (computed
    directly), and the second codes what is left, so two codebooks reconstruct better than one."""
    from types import SimpleNamespace

    from omnicore_audio_codec.fit import kmeans_codebooks

    gen = torch.Generator().manual_seed(0)
    centres = torch.tensor([[5.0, 5.0], [-5.0, 5.0], [5.0, -5.0], [-5.0, -5.0]])
    labels = torch.arange(400) % 4
    points = centres[labels] + 0.3 * torch.randn(400, 2, generator=gen)

    def book(n: int) -> SimpleNamespace:
        return SimpleNamespace(embed=torch.zeros(n, 2), embed_avg=torch.zeros(n, 2), cluster_size=torch.zeros(n))

    books = [book(4), book(4)]
    kmeans_codebooks(books, points, torch.Generator().manual_seed(1), iters=10)
    means = torch.stack([points[labels == k].mean(0) for k in range(4)])
    found = books[0].embed[torch.cdist(means, books[0].embed).argmin(1)]
    assert torch.allclose(found, means, atol=1e-5), (found, means)
    assert torch.equal(books[0].embed_avg, books[0].embed) and torch.equal(books[0].cluster_size, torch.ones(4))

    def err(n: int) -> float:
        r = points.clone()
        for b in books[:n]:
            r = r - b.embed[torch.cdist(r, b.embed).argmin(1)]
        return float(r.pow(2).sum(1).mean())

    assert err(1) == pytest.approx(float((points - means[labels]).pow(2).sum(1).mean()), rel=1e-5)
    assert err(2) < 0.6 * err(1)


@pytest.mark.slow
def test_the_autoencoder_phase_leaves_the_codebooks_until_kmeans_starts_them(monkeypatch):
    """ae_steps: the first steps bypass the quantiser (codebooks untouched), then k-means starts
    them once, on the latents of kmeans_batches batches; ae_steps must leave a quantised step."""
    import omnicore_audio_codec.fit as fit_module

    wave = torch.sin(torch.arange(8000) * 0.05) * torch.linspace(0, 0.5, 8000)
    clips = [Audio(samples=(wave * s).numpy().astype(np.float32), sample_rate=16000) for s in (0.5, 1.0)]
    torch.manual_seed(0)
    d = build({"config": TINY}, hidden_size=8)
    before = d.codec.quantizer.layers[0].codebook.embed.clone()
    calls = []
    real = fit_module.kmeans_codebooks

    def spy(books, latents, gen, iters=10):
        calls.append((books[0].embed.clone(), tuple(latents.shape)))
        real(books, latents, gen, iters)

    monkeypatch.setattr(fit_module, "kmeans_codebooks", spy)
    fit_codec(d, clips, steps=3, ae_steps=2, batch_size=2, segment_seconds=0.1, kmeans_batches=3)
    assert len(calls) == 1
    untouched, shape = calls[0]
    assert torch.equal(untouched, before)  # two autoencoder steps left the codebook as it was
    frames = -(-1600 // d.processor.hop_length)  # 0.1 s crops at 16 kHz, hop 320
    assert shape == (3 * 2 * frames, TINY["hidden_size"])  # 3 batches of 2 crops, one row per latent frame
    after = d.codec.quantizer.layers[0].codebook.embed
    assert not torch.equal(after, before) and torch.unique(after, dim=0).shape[0] > 1
    with pytest.raises(ValueError, match=r"ae_steps must be in \[0, steps=2\), got 2"):
        fit_codec(d, clips, steps=2, ae_steps=2)
