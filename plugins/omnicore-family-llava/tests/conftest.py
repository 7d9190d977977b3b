"""Shared fixtures: one tiny random LLaVA stand-in per tower (CLIP + Llama, SigLIP + Qwen2) per
session, and transformers' own model and processor of it (the references every test compares with).
Every test that uses ``standin`` runs once per tower."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnicore_family_llava.standin import save_standin


@pytest.fixture(scope="session", params=["clip", "siglip"])
def tower(request):
    """The stand-in's tower: ``clip`` (llava-1.5 recipe) or ``siglip`` (llava-interleave recipe)."""
    return request.param


@pytest.fixture(scope="session")
def standin(tower, tmp_path_factory):
    """The stand-in folder (as transformers 5's save_pretrained writes it)."""
    return save_standin(tmp_path_factory.mktemp(f"llava_{tower}") / "standin", tower=tower)


@pytest.fixture(scope="session")
def hf_model(standin):
    from transformers import LlavaForConditionalGeneration

    return LlavaForConditionalGeneration.from_pretrained(standin, dtype=torch.float32).eval()


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


def make_image(width: int, height: int, seed: int = 0):
    """A ``width x height`` RGB ``PIL.Image`` of seeded noise."""
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture
def image():
    """:func:`make_image` (test modules cannot import this conftest by name: the repository's is first)."""
    return make_image
