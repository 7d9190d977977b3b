"""Shared fixtures: one tiny random stand-in per family (Qwen2-VL and Qwen2.5-VL) per session, and
transformers' own model and processor of it (the references every test compares with).

transformers' ``Qwen2VLProcessor`` / ``Qwen2_5_VLProcessor`` is loaded with ``AutoProcessor``
where torchvision is installed. Elsewhere it cannot be built as is (it insists its video processor
be a ``BaseVideoProcessor``, whose Qwen2-VL class needs torchvision), so the reference is the same
processor class holding the checkpoint's image processor and the kit's
:class:`omnicore_family_kit.media_processors.FrameVideoProcessor`: the token expansion, the
``mm_token_type_ids`` and ``second_per_grid_ts`` are still transformers' own code, and
``test_parts.py`` checks the clip pixels against transformers' image processor.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omnicore_family_qwen2_vl.standin import FAMILIES, save_standin

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


@pytest.fixture(scope="session", params=FAMILIES)
def family(request):
    """``qwen2_vl`` or ``qwen2_5_vl``: every test that uses a stand-in runs for both."""
    return request.param


@pytest.fixture(scope="session")
def standins(tmp_path_factory):
    """family -> its stand-in folder (written once per session)."""
    root = tmp_path_factory.mktemp("qwen2vl")
    return {f: save_standin(root / f, family=f) for f in FAMILIES}


@pytest.fixture(scope="session")
def standin(standins, family):
    """The stand-in folder of :func:`family` (published layout, as save_pretrained writes it)."""
    return standins[family]


_MODELS: dict[str, object] = {}


@pytest.fixture(scope="session")
def hf_model(standin):
    """transformers' ``...ForConditionalGeneration`` of the stand-in (fp32, eval)."""
    if str(standin) not in _MODELS:
        from transformers import AutoModelForImageTextToText

        _MODELS[str(standin)] = AutoModelForImageTextToText.from_pretrained(standin, dtype=torch.float32).eval()
    return _MODELS[str(standin)]


def load_hf_processor(folder: str | Path):
    """transformers' processor of ``folder`` (see the module docstring)."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLProcessor, Qwen2VLProcessor

    from omnicore_family_kit.media_processors import FrameVideoProcessor, video_settings

    folder = Path(folder)
    if HAS_TORCHVISION:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    base = Qwen2_5_VLProcessor if model_type == "qwen2_5_vl" else Qwen2VLProcessor

    class Processor(base):  # type: ignore[misc, valid-type]
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
