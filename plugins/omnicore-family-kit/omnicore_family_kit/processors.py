"""A checkpoint's transformers processor, also where torchvision is missing.

transformers 5 builds the video processors of many multimodal processors (Qwen2-VL, InternVL,
LLaVA-OneVision, SmolVLM, GLM-4.1V) on torchvision, and ``AutoProcessor.from_pretrained`` of such a
folder fails without it, images included. A CPU machine often has no torchvision (a CPU wheel of
it pulls in another torch; see the install notes), so :func:`load_hf_processor` loads the same
processor class with a stand-in video processor that holds the saved settings and refuses videos:
images and text work as published, and a video gives one clear error naming what to install.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any


def has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def video_processor(name: str, settings: dict[str, Any]) -> Any:
    """transformers' video processor ``name`` with ``settings`` where torchvision is installed, else a
    ``VideoProcessorMixin`` that holds the settings, saves them under ``name`` and refuses videos."""
    import transformers
    from transformers.video_processing_utils import VideoProcessorMixin

    if has_torchvision():
        return getattr(transformers, name)(**settings)

    class VideoSettings(VideoProcessorMixin):
        def to_dict(self) -> dict[str, Any]:
            return {**{k: v for k, v in self.__dict__.items() if not k.startswith("_")}, "video_processor_type": name}

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise ImportError(f"{name} needs torchvision, which is not installed: this processor takes images only")

    return VideoSettings(**settings)


def processor_class_without_torchvision(name: str, video: bool) -> Any:
    """transformers' processor class ``name``; without torchvision, for a processor holding a video
    processor, a subclass of the same name whose argument check accepts :func:`video_processor`'s
    stand-in (transformers checks it against ``VIDEO_PROCESSOR_MAPPING``, which needs torchvision)."""
    import transformers
    from transformers.video_processing_utils import VideoProcessorMixin

    cls = getattr(transformers, name)
    if not video or has_torchvision():
        return cls

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor" and isinstance(argument, VideoProcessorMixin):
            return VideoProcessorMixin
        return cls.check_argument_for_proper_class(self, argument_name, argument)

    return type(name, (cls,), {"check_argument_for_proper_class": check_argument_for_proper_class})


def load_processor(folder: str | Path) -> Any:
    """``AutoProcessor.from_pretrained(folder, local_files_only=True)``; where the processor holds a video processor that
    needs torchvision and torchvision is missing, its class (:func:`_processor_class`) loaded with
    a stand-in video processor of the saved settings (see the module docstring).

    Raises:
        OSError, ValueError: transformers cannot build the processor from the folder.
    """
    from transformers import AutoProcessor

    path = Path(folder) / "processor_config.json"
    if not path.is_file():  # an older layout (the settings in preprocessor_config.json): transformers' own way
        return AutoProcessor.from_pretrained(folder, local_files_only=True)
    saved = json.loads(path.read_text())
    video = saved.get("video_processor")
    if video is None or has_torchvision():
        return AutoProcessor.from_pretrained(folder, local_files_only=True)
    settings = {k: v for k, v in video.items() if k != "video_processor_type"}
    cls = processor_class_without_torchvision(saved["processor_class"], video=True)
    return cls.from_pretrained(folder, local_files_only=True, video_processor=video_processor(video["video_processor_type"], settings))


@functools.cache
def load_hf_processor(folder: str) -> Any:
    """:func:`load_processor` once per process (offline).

    Raises:
        ValueError: transformers cannot build the checkpoint's processor (naming the folder, the
            reason and what the folder needs).
    """
    try:
        return load_processor(folder)
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError) as exc:
        raise ValueError(
            f"{folder}: transformers cannot build the checkpoint's processor ({type(exc).__name__}: {' '.join(str(exc).split())[:300]}); "
            "the folder needs the files its processor's save_pretrained writes (processor_config.json or preprocessor_config.json, "
            "tokenizer files) and the packages the processor imports"
        ) from exc
