"""Shared fixtures: one tiny random CSM stand-in per session, transformers' own model and processor
of it (the references every test compares with), and speech clips at the codec's 24 kHz."""

from __future__ import annotations

import wave

import numpy as np
import pytest
import torch

from omnicore_family_csm.standin import save_standin

RATE = 24000


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """The stand-in folder (published layout, as transformers 5's save_pretrained writes it)."""
    return save_standin(tmp_path_factory.mktemp("csm") / "standin")


@pytest.fixture(scope="session")
def hf_model(standin):
    from transformers import CsmForConditionalGeneration

    return CsmForConditionalGeneration.from_pretrained(standin, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_processor(standin):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(standin)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_clip(n: int, seed: int = 0) -> np.ndarray:
    """``n`` samples of seeded noise (amplitude 0.1), float32, exactly representable in 16-bit PCM."""
    samples = (0.1 * np.random.default_rng(seed).standard_normal(n)).clip(-1, 1)
    return (np.round(samples * 32767) / 32768).astype(np.float32)


def write_wav(path, samples: np.ndarray, rate: int = RATE) -> None:
    """``samples`` (from :func:`make_clip`) as a 16-bit mono WAV that ``omnicore.api.load_audio`` reads back exactly."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(np.round(samples * 32768).astype("<i2").tobytes())


@pytest.fixture(scope="session")
def clip():
    """:func:`make_clip` (test modules cannot import this conftest by name: the repository's is first)."""
    return make_clip


@pytest.fixture(scope="session")
def wav():
    """:func:`write_wav`."""
    return write_wav
