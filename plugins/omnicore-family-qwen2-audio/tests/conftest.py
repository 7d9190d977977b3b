"""Shared fixtures: one tiny random Qwen2-Audio stand-in per session and transformers' own model and
processor of it (the references every test compares with)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnicore_family_qwen2_audio.standin import save_standin


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """The stand-in folder (published layout, as transformers 5's save_pretrained writes it)."""
    return save_standin(tmp_path_factory.mktemp("qwen2audio") / "standin")


@pytest.fixture(scope="session")
def hf_model(standin):
    from transformers import Qwen2AudioForConditionalGeneration

    return Qwen2AudioForConditionalGeneration.from_pretrained(standin, dtype=torch.float32).eval()


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
    """``n`` samples of seeded noise (amplitude 0.1) at 16 kHz."""
    return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def audio_rows(hf_model, hf_processor, clips: list[np.ndarray]) -> tuple[torch.Tensor, dict]:
    """transformers' merged embeddings at the ``<|AUDIO|>`` positions for ``clips`` (one text with
    one audio span per clip), captured at the language model's input; and the processor's output."""
    text = "".join(f"x{i}<|audio_bos|><|AUDIO|><|audio_eos|>" for i in range(len(clips)))
    inputs = hf_processor(text=text, audio=clips, sampling_rate=16000, return_tensors="pt")
    seen = {}

    def grab(module, args, kwargs):
        seen["embeds"] = kwargs["inputs_embeds"]

    handle = hf_model.model.language_model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            hf_model(**inputs)
    finally:
        handle.remove()
    mask = inputs["input_ids"][0] == hf_model.config.audio_token_id
    return seen["embeds"][0][mask], inputs


@pytest.fixture
def clip():
    """:func:`make_clip` (test modules cannot import this conftest by name: the repository's is first)."""
    return make_clip


@pytest.fixture
def hf_audio_rows(hf_model, hf_processor):
    """``clips -> (rows, inputs)``: :func:`audio_rows` with the session's transformers model and processor."""
    return lambda clips: audio_rows(hf_model, hf_processor, clips)
