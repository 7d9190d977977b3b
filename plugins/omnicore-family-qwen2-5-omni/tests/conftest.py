"""Shared fixtures: one tiny random Qwen2.5-Omni stand-in per session (the whole model: thinker,
talker, token2wav), transformers' thinker of it and its processor (the references every test
compares with), and seeded media.

transformers' ``Qwen2_5OmniProcessor`` is loaded with ``AutoProcessor`` where torchvision is
installed. Elsewhere it cannot be built as is (its video processor class needs torchvision), so
the reference is the same processor class holding the checkpoint's image processor, feature
extractor and the kit's :class:`omnicore_family_kit.media_processors.FrameVideoProcessor`:
the token expansion (the clip's video and audio chunks included) is still transformers' own code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from omnicore_family_qwen2_5_omni.standin import save_standin

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


@pytest.fixture(scope="session", autouse=True)
def _quiet_transformers():
    """The tiny talker's config warns of token ids outside its toy vocabulary on every load."""
    import transformers

    transformers.logging.set_verbosity_error()


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """The whole-model stand-in folder (published layout, as save_pretrained writes it)."""
    return save_standin(tmp_path_factory.mktemp("omni") / "standin")


_MODELS: dict[str, object] = {}


@pytest.fixture(scope="session")
def hf_thinker(standin):
    """transformers' ``Qwen2_5OmniThinkerForConditionalGeneration`` of the stand-in (fp32, eval)."""
    if str(standin) not in _MODELS:
        from transformers import Qwen2_5OmniThinkerForConditionalGeneration

        _MODELS[str(standin)] = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(standin, dtype=torch.float32).eval()
    return _MODELS[str(standin)]


def load_hf_processor(folder: str | Path):
    """transformers' processor of ``folder`` (see the module docstring)."""
    from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer, Qwen2_5OmniProcessor

    from omnicore_family_kit.media_processors import FrameVideoProcessor, video_settings

    folder = Path(folder)
    if HAS_TORCHVISION:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)

    class Processor(Qwen2_5OmniProcessor):
        def check_argument_for_proper_class(self, name, arg):
            return type(arg) if name == "video_processor" else super().check_argument_for_proper_class(name, arg)

    tok = AutoTokenizer.from_pretrained(folder)
    return Processor(
        image_processor=AutoImageProcessor.from_pretrained(folder),
        video_processor=FrameVideoProcessor(video_settings(folder, "tests")),
        feature_extractor=AutoFeatureExtractor.from_pretrained(folder),
        tokenizer=tok,
        chat_template=tok.chat_template,
    )


@pytest.fixture(scope="session")
def hf_processor(standin):
    return load_hf_processor(standin)


@pytest.fixture
def hf_processor_of():
    """``folder -> transformers' processor`` (test modules cannot import this conftest by name)."""
    return load_hf_processor


def hf_inputs_for(hf_processor, data, user, answer, *, prompt_only=False):
    """transformers' processor outputs of one conversation (``user`` parts as omnicore's samples
    write them, files under ``data``; each clip's sound track taken from its file, as
    ``load_audio_from_video`` takes it) and whether a clip carries sound (the thinker's
    ``use_audio_in_video``)."""
    from omnicore.api import load_audio, load_image, load_video

    content = [p if p["type"] == "text" else {"type": p["type"]} for p in user]
    messages = [{"role": "user", "content": content}] + ([] if prompt_only else [{"role": "assistant", "content": answer}])
    text = hf_processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt_only)
    images, clips, sound, slots = [], [], [], []
    for p in user:
        if p["type"] == "image":
            images.append(load_image(Path(data) / p["path"]))
        elif p["type"] == "audio":
            sound.append(load_audio(Path(data) / p["path"]).samples)
            slots.append(None)
        elif p["type"] == "video":
            clip = load_video(Path(data) / p["path"], audio=True)
            if clip.audio is not None:
                sound.append(clip.audio.samples)
                slots.append(len(clips))
            clips.append(clip.frames)
    kwargs = {"images": images or None, "videos": clips or None, "audio": sound or None}
    with_sound = any(s is not None for s in slots)
    if with_sound:
        kwargs.update(load_audio_from_video=True, audio_from_video_indices=slots)
    return hf_processor(text=text, return_tensors="pt", **kwargs), with_sound


@pytest.fixture(scope="session")
def hf_call():
    """:func:`hf_inputs_for` (test modules cannot import this conftest by name)."""
    return hf_inputs_for


_BUILT: dict[tuple, tuple] = {}


def build_run(folder, data, **options):
    """``(model, tokenizer, chat processor, registry)`` of one ``qwen2_5_omni`` foundation entry on
    ``folder`` with ``options`` (eval mode; cached per folder and options)."""
    from omnicore.testing import ChatProcessor, Config, build_omni_model, isolated_registry

    key = (str(folder), tuple(sorted(options.items())))
    if key not in _BUILT:
        import omnicore_family_qwen2_5_omni.plugin as plugin

        registry = isolated_registry([(plugin, "omnicore-family-qwen2-5-omni")], builtins=True)
        cfg = Config.model_validate(
            {
                "run": {"output_dir": str(Path(data) / "run")},
                "model": {"foundation": {"name": "qwen2_5_omni", "options": {"checkpoint": str(folder), **options}}},
                "data": {"train": str(Path(data) / "train.jsonl")},
            }
        )
        torch.manual_seed(0)
        model, tok = build_omni_model(cfg, registry)
        _BUILT[key] = (model.eval(), tok, ChatProcessor.for_model(tok, model, cfg.data), registry)
    return _BUILT[key]


@pytest.fixture(scope="session")
def omni_run():
    """:func:`build_run`."""
    return build_run


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


def make_wave(seconds: float, seed: int = 0, rate: int = 16000) -> np.ndarray:
    """``seconds`` of seeded noise and a tone, float32 in [-1, 1] at ``rate`` Hz."""
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.shape[0]) * 0.1
    return (0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t) + noise).astype(np.float32)


def make_frames(n: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """``n`` seeded random uint8 RGB frames ``[n, height, width, 3]``."""
    return np.random.default_rng(seed).integers(0, 256, (n, height, width, 3), dtype=np.uint8)


def write_video(path, frames: np.ndarray, fps: float, wave: np.ndarray | None = None, rate: int = 16000) -> None:
    """RGB frames ``[T, H, W, 3]`` as lossless FFV1 in Matroska, with ``wave`` (mono float32) as a
    lossless PCM sound track when given."""
    from fractions import Fraction

    import av

    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=Fraction(fps).limit_denominator(1000))
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "bgr0"
        sound = container.add_stream("pcm_f32le", rate=rate) if wave is not None else None
        if sound is not None:
            sound.layout = "mono"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
        if sound is not None:
            chunk = av.AudioFrame.from_ndarray(wave.reshape(1, -1), format="flt", layout="mono")
            chunk.sample_rate, chunk.pts = rate, 0
            container.mux(sound.encode(chunk))
            container.mux(sound.encode())


@pytest.fixture(scope="session")
def image():
    """:func:`make_image`."""
    return make_image


@pytest.fixture(scope="session")
def wave():
    """:func:`make_wave`."""
    return make_wave


@pytest.fixture(scope="session")
def frames():
    """:func:`make_frames`."""
    return make_frames


@pytest.fixture(scope="session")
def video_file():
    """:func:`write_video`."""
    return write_video
