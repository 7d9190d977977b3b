"""Shared settings and data of the omnicore-audio-mel tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

RATE = 8000


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Run on one intra-op thread (restored afterwards): on a shared 2-core machine two OpenMP
    threads that compete with another busy process are many times slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def clips() -> list[np.ndarray]:
    """Six synthetic 0.3 s 'words' at 8 kHz (2400 samples): a gliding tone with two harmonics under a
    rise-and-fall envelope, plus a little noise; each clip its own pitch and glide."""
    n, seconds = 6, 0.3
    rng = np.random.default_rng(0)
    t = np.arange(round(seconds * RATE)) / RATE
    clips = []
    for i in range(n):
        f0 = 150 + 60 * i
        phase = 2 * np.pi * np.cumsum(f0 * (1 + (0.5 if i % 2 else -0.3) * t / seconds)) / RATE
        wave = np.sin(phase) + 0.5 * np.sin(2 * phase) + 0.25 * np.sin(3 * phase)
        wave = 0.3 * wave * np.sin(np.pi * t / seconds) ** 2 + 0.001 * rng.standard_normal(len(t))
        clips.append(wave.astype(np.float32))
    return clips
