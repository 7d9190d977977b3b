"""Reconstruction losses and figures for fitting and judging the codec (pure torch, no model code).

**Multi-resolution mel loss** (the frequency-domain reconstruction loss of EnCodec, Défossez et al.
2022, section 3.4, on log-mel magnitudes as in HiFi-GAN's mel loss, Kong et al. 2020): for each
window ``n_fft`` in :data:`MEL_SCALES` (hop ``n_fft / 4``, Hann window, ``min(64, n_fft / 8)``
Slaney mel bands from 0 Hz to Nyquist), the mean absolute difference of the mel magnitudes plus that
of their natural logs (``log(mel + 1e-5)``), averaged over the scales.

**Figures** of a reconstruction ``y`` of a clip ``x`` (:func:`clip_figures`): ``mel_l1``, the mean
absolute difference of ``log(mel + 1e-5)`` at ``n_fft`` 1024 (64 bands; lower is better, 0 for a
perfect copy), and ``snr_db``, ``10 log10(sum x^2 / sum (x - y)^2)`` (higher is better; waveform
codecs at low bitrates keep the spectrum better than the phase, so it is low even when speech is clear).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

MEL_SCALES: tuple[int, ...] = (128, 256, 512, 1024)
"""Window lengths (samples) of the multi-resolution mel loss."""
LOG_EPS = 1e-5


@lru_cache(maxsize=32)
def _mel_basis(n_fft: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """Slaney mel filters ``[n_fft // 2 + 1, n_mels]`` (transformers' ``mel_filter_bank``)."""
    from transformers.audio_utils import mel_filter_bank

    fb = mel_filter_bank(n_fft // 2 + 1, n_mels, 0.0, sample_rate / 2, sample_rate, norm="slaney", mel_scale="slaney")
    return torch.tensor(fb, dtype=torch.float32)


def mel_spectrogram(x: torch.Tensor, sample_rate: int, n_fft: int, n_mels: int | None = None) -> torch.Tensor:
    """Mel magnitudes ``[B, n_mels, frames]`` of waveforms ``x`` ``[B, L]`` (hop ``n_fft // 4``, Hann)."""
    n_mels = n_mels or min(64, n_fft // 8)
    window = torch.hann_window(n_fft, device=x.device, dtype=x.dtype)
    spec = torch.stft(x, n_fft, hop_length=n_fft // 4, window=window, return_complex=True).abs()
    basis = _mel_basis(n_fft, n_mels, int(sample_rate)).to(device=x.device, dtype=x.dtype)
    return torch.einsum("bft,fm->bmt", spec, basis)


def multi_resolution_mel_loss(y: torch.Tensor, x: torch.Tensor, sample_rate: int, scales: tuple[int, ...] = MEL_SCALES) -> torch.Tensor:
    """The module docstring's mel loss of reconstructions ``y`` against targets ``x`` (both ``[B, L]``)."""
    total = y.new_zeros(())
    for n_fft in scales:
        my, mx = mel_spectrogram(y, sample_rate, n_fft), mel_spectrogram(x, sample_rate, n_fft)
        total = total + (my - mx).abs().mean() + (torch.log(my + LOG_EPS) - torch.log(mx + LOG_EPS)).abs().mean()
    return total / len(scales)


def clip_figures(y: torch.Tensor, x: torch.Tensor, sample_rate: int) -> dict[str, float]:
    """``{"mel_l1", "snr_db"}`` of one reconstruction ``y`` ``[L]`` of ``x`` ``[L]`` (module docstring).

    Raises:
        ValueError: if the lengths differ.
    """
    if y.shape != x.shape:
        raise ValueError(f"clip_figures: reconstruction of shape {tuple(y.shape)} for a clip of {tuple(x.shape)}")
    my, mx = mel_spectrogram(y[None], sample_rate, 1024, 64), mel_spectrogram(x[None], sample_rate, 1024, 64)
    mel_l1 = float((torch.log(my + LOG_EPS) - torch.log(mx + LOG_EPS)).abs().mean())
    noise = float(((x - y) ** 2).sum())
    snr = 10 * math.log10(float((x**2).sum()) / noise) if noise > 0 else math.inf
    return {"mel_l1": mel_l1, "snr_db": snr}
