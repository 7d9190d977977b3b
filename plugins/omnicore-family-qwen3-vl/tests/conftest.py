"""Shared fixtures: one tiny random Qwen3-VL stand-in per session, and transformers' own model and
processor of it (the references every test compares with).

transformers' ``Qwen3VLProcessor`` is loaded with ``AutoProcessor`` where torchvision is installed.
Elsewhere it cannot be built as is (its video processor class needs torchvision), so the reference
is the same processor class holding the checkpoint's image processor and the plugin's
:class:`~omnicore_family_qwen3_vl.processor.FrameVideoProcessor`: the token expansion (timestamps,
one wrapped run per frame group) and ``mm_token_type_ids`` are still transformers' own code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from omnicore_family_qwen3_vl.standin import save_standin

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """The stand-in folder (published layout, as save_pretrained writes it)."""
    return save_standin(tmp_path_factory.mktemp("qwen3vl") / "standin")


_MODELS: dict[str, object] = {}


@pytest.fixture(scope="session")
def hf_model(standin):
    """transformers' ``Qwen3VLForConditionalGeneration`` of the stand-in (fp32, eval)."""
    if str(standin) not in _MODELS:
        from transformers import AutoModelForImageTextToText

        _MODELS[str(standin)] = AutoModelForImageTextToText.from_pretrained(standin, dtype=torch.float32).eval()
    return _MODELS[str(standin)]


def load_hf_processor(folder: str | Path):
    """transformers' processor of ``folder`` (see the module docstring)."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen3VLProcessor

    from omnicore_family_kit.media_processors import video_settings
    from omnicore_family_qwen3_vl.processor import FrameVideoProcessor

    folder = Path(folder)
    if HAS_TORCHVISION:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)

    class Processor(Qwen3VLProcessor):
        def check_argument_for_proper_class(self, name, arg):
            return type(arg) if name == "video_processor" else super().check_argument_for_proper_class(name, arg)

    tok = AutoTokenizer.from_pretrained(folder)
    return Processor(
        image_processor=AutoImageProcessor.from_pretrained(folder),
        tokenizer=tok,
        video_processor=FrameVideoProcessor(video_settings(folder, "tests")),
        chat_template=tok.chat_template,
    )


@pytest.fixture(scope="session")
def hf_processor(standin):
    return load_hf_processor(standin)


@pytest.fixture
def hf_processor_of():
    """``folder -> transformers' processor`` (test modules cannot import this conftest by name)."""
    return load_hf_processor


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_image(height: int, width: int, seed: int = 0):
    """A seeded random RGB ``PIL.Image`` of ``height x width`` pixels."""
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def make_frames(n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """``n`` seeded random uint8 RGB frames ``[n, height, width, 3]``."""
    return np.random.default_rng(seed).integers(0, 256, (n, height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="session")
def image():
    """:func:`make_image`."""
    return make_image


@pytest.fixture(scope="session")
def frames():
    """:func:`make_frames`."""
    return make_frames
