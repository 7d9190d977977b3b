"""The data side of the Qwen3-VL family: options, the checkpoint's own image and video processing,
and how many ``<|image_pad|>`` / ``<|video_pad|>`` tokens each item takes and where.

Imports no model code: :func:`build_processor` reads the checkpoint folder's ``config.json`` and
processor files, never its weights, so data workers build it from the options alone.

Token rule (transformers' ``Qwen3VLProcessor``): an image whose patch grid is ``(1, gh, gw)``
expands to ``gh * gw // merge**2`` pads wrapped in ``<|vision_start|>`` ... ``<|vision_end|>``.
A clip of grid ``(gt, gh, gw)`` is written per frame group: ``<{s:.1f} seconds>`` (the mean time
of the group's first and last frame) then ``<|vision_start|>``, ``gh * gw // merge**2`` pads and
``<|vision_end|>``, ``gt`` times (:meth:`Qwen3VLMediaProcessor.runs`); the chat template's own
wrapper around the clip is dropped. Each run is its own mRoPE block of grid ``(1, gh / merge,
gw / merge)``, as Qwen3-VL's ``get_rope_index`` splits ``video_grid_thw`` per frame group.

Images go through the checkpoint's image processor as ``AutoImageProcessor`` loads it (the PIL
backend where torchvision is missing). Clips go through transformers' ``Qwen3VLVideoProcessor``
where it can be built (it needs torchvision), elsewhere through :class:`FrameVideoProcessor`,
which takes its steps with its settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from omnicore.api import Video
from omnicore_family_kit.checkpoint import checkpoint_folder as kit_checkpoint_folder
from omnicore_family_kit.media_processors import FrameVideoProcessor as Qwen2VLFrameVideoProcessor
from omnicore_family_kit.media_processors import load_image_processor, load_video_processor, video_settings
from omnicore_family_kit.options import CheckpointOptions
from omnicore_family_qwen3_vl.plugin import MODEL_TYPES

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
WRAP = ("<|vision_start|>", "<|vision_end|>")
WHAT_TO_PUT = (
    "point options.checkpoint at a Qwen3-VL folder as published (Qwen/Qwen3-VL-2B-Instruct, or what "
    "Qwen3VLForConditionalGeneration.save_pretrained and the processor's save_pretrained write: config.json, "
    "model.safetensors, tokenizer and processor files)"
)

VIDEO_SETTINGS_FILES = ("video_preprocessor_config.json",)
"""Where the video settings are read after ``processor_config.json``'s nested ``video_processor``
(:func:`omnicore_family_kit.media_processors.video_settings`): this family reads no ``preprocessor_config.json`` for them."""


class Qwen3VLEncoderOptions(CheckpointOptions):
    """Options of ``encoder/qwen3_vl_encoder``."""

    checkpoint: str = Field(
        description=(
            "A published Qwen3-VL folder (config.json of Qwen3VLForConditionalGeneration, its safetensors and processor "
            "files), or a Hub name in the local cache; its vision tower with the merger and the DeepStack mergers is loaded"
        )
    )
    modality: Literal["image", "video"] = Field(
        default="image",
        description=(
            "what this entry's processor reads: image (PIL images, the image processor, <|image_pad|>) or video "
            "(omnicore.api.Video clips, the video processor, a timestamp and <|video_pad|> run per frame group). The module "
            "encodes both; the video entry the foundation brings shares the image module (share: image)"
        ),
    )


class Qwen3VLFoundationOptions(CheckpointOptions):
    """Options of ``foundation/qwen3_vl``."""

    checkpoint: str = Field(
        description=(
            "A published Qwen3-VL folder (config.json, safetensors, tokenizer and processor files), or a Hub name in the "
            "local cache (e.g. Qwen/Qwen3-VL-2B-Instruct)"
        )
    )


def checkpoint_folder(checkpoint: str, what: str) -> Path:
    """``checkpoint`` as a Qwen3-VL folder: :func:`omnicore_family_kit.checkpoint.checkpoint_folder` of
    :data:`MODEL_TYPES` (ValueError naming ``what``, ending with :data:`WHAT_TO_PUT`)."""
    return kit_checkpoint_folder(checkpoint, what, MODEL_TYPES, WHAT_TO_PUT)


def smart_resize(frames: int, height: int, width: int, factor: int, temporal: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """A clip's frame size ``(height, width)`` after resizing, in multiples of ``factor`` (patch
    size times merge size), with the whole clip's pixels (frames rounded to a multiple of
    ``temporal``) kept within ``[min_pixels, max_pixels]``: the rule of transformers'
    ``Qwen3VLVideoProcessor`` (its module's ``smart_resize``), where the bounds count every frame.

    Raises:
        ValueError: fewer than ``temporal`` frames, or an aspect ratio above 200.
    """
    import math

    if frames < temporal:
        raise ValueError(f"video of {frames} frames is shorter than temporal_patch_size {temporal}")
    if height < factor or width < factor:  # small frames are scaled up to one factor on their short side
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    t = round(frames / temporal) * temporal
    if t * h * w > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h, w = max(factor, math.floor(height / beta / factor) * factor), max(factor, math.floor(width / beta / factor) * factor)
    elif t * h * w < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


class FrameVideoProcessor(Qwen2VLFrameVideoProcessor):
    """transformers' ``Qwen3VLVideoProcessor`` steps for machines where it cannot be built (it needs
    torchvision), with its settings and call signature, so transformers' ``Qwen3VLProcessor`` can
    hold it too. The call and pickling are :class:`omnicore_family_kit.media_processors.FrameVideoProcessor`'s (the
    Qwen2-VL steps, whose class transformers' Qwen3-VL one extends); the steps are replaced below.

    Per clip of ``T`` frames at ``fps`` (uint8 ``[T, H, W, 3]``):

    1. with ``do_sample_frames`` (on by default), ``n = int(T / fps * settings fps)`` frames
       (``num_frames`` when given), at least ``min_frames`` and at most ``max_frames`` and ``T``,
       at ``linspace(0, T - 1, n)`` rounded, recorded in the metadata's ``frames_indices``;
    2. every frame resized (bicubic, PIL) to the :func:`smart_resize` size of the whole clip,
       rescaled and normalised with ``image_mean`` / ``image_std``;
    3. the last frame repeated up to a multiple of ``temporal_patch_size`` and the frames cut into
       tubelets: ``pixel_values_videos [gt * gh * gw, 3 * tp * P * P]`` in the processor's order
       (tubelet, merge block, patch in the block; each patch as channel, frame, row, column).

    The resize is PIL's where transformers' class resizes with torchvision: pixels may differ in the
    last bits from that class's, never the grid.

    Args:
        settings: the video processor's dict (:func:`omnicore_family_kit.media_processors.video_settings`); its class defaults for missing keys.
    """

    DEFAULTS: dict[str, Any] = {
        "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_frames": 4,
        "max_frames": 768,
        "do_sample_frames": True,
        "fps": 2,
        "num_frames": None,
    }
    """``Qwen3VLVideoProcessor``'s class defaults (transformers 5.25) for the keys these steps read."""

    def __init__(self, settings: dict[str, Any]) -> None:
        s = {k: settings[k] if settings.get(k) is not None else v for k, v in self.DEFAULTS.items()}
        s["size"] = {k: int(v) for k, v in dict(s["size"]).items()}
        self.settings = s
        self.patch_size, self.merge_size = int(s["patch_size"]), int(s["merge_size"])
        self.temporal_patch_size = int(s["temporal_patch_size"])

    def sample_indices(self, total: int, fps: float | None, num_frames: int | None = None, target_fps: float | None = None) -> np.ndarray:
        """The frames ``Qwen3VLVideoProcessor.sample_frames`` keeps of a clip of ``total`` frames at
        ``fps`` (24 when unknown, as there); ``num_frames`` / ``target_fps`` override the settings.

        Raises:
            ValueError: ``num_frames`` and ``target_fps`` both given.
        """
        s = self.settings
        if num_frames is not None and target_fps is not None:
            raise ValueError("video processor: num_frames and fps are mutually exclusive; set only one")
        num_frames = num_frames if num_frames is not None else s["num_frames"]
        target_fps = target_fps if target_fps is not None else s["fps"]
        if num_frames is None and target_fps is not None:
            n = int(total / (fps or 24) * target_fps)
            num_frames = min(max(n, int(s["min_frames"])), int(s["max_frames"]), total)
        if num_frames is None:
            num_frames = min(max(total, int(s["min_frames"])), int(s["max_frames"]))
        return np.linspace(0, total - 1, num_frames).round().astype(int)

    def keep_frames(self, frames: np.ndarray, metadata: Any, sample: bool, num_frames: int | None, fps: float | None) -> np.ndarray:
        """Step 1, as the base class takes it, but every frame's index is recorded where the clip is
        not sampled and its metadata has none (the processor's timestamps are read from them)."""
        frames = super().keep_frames(frames, metadata, sample, num_frames, fps)
        if metadata.frames_indices is None:
            metadata.frames_indices = list(range(len(frames)))
        return frames

    def clip_patches(self, frames: np.ndarray) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """Sampled frames uint8 ``[F, H, W, 3]`` to ``(pixel_values_videos [gt*gh*gw, 3*tp*P*P],
        (gt, gh, gw))`` (steps 2 and 3 of the class docstring)."""
        from PIL import Image

        s, tp, p, m = self.settings, self.temporal_patch_size, self.patch_size, self.merge_size
        h, w = frames.shape[1:3]
        if s["do_resize"]:
            size = s["size"]
            h, w = smart_resize(len(frames), h, w, p * m, tp, size["shortest_edge"], size["longest_edge"])
            frames = np.stack([np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC)) for f in frames])
        x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).to(torch.float32)
        if s["do_rescale"]:
            x = x * float(s["rescale_factor"])
        if s["do_normalize"]:
            mean, std = (torch.tensor(s[k], dtype=torch.float32).view(1, 3, 1, 1) for k in ("image_mean", "image_std"))
            x = (x - mean) / std
        if pad := -len(x) % tp:
            x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)])
        gt, gh, gw = len(x) // tp, h // p, w // p
        x = x.view(gt, tp, 3, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return x.reshape(gt * gh * gw, 3 * tp * p * p).contiguous(), (gt, gh, gw)


def frame_group_seconds(indices: list[int], fps: float, temporal: int) -> list[float]:
    """Seconds of each frame group: the mean time of its first and last frame, the indices padded
    with the last one to a multiple of ``temporal`` (``Qwen3VLProcessor._calculate_timestamps``)."""
    indices = list(indices) + [indices[-1]] * (-len(indices) % temporal)
    seconds = [i / fps for i in indices]
    return [(seconds[k] + seconds[k + temporal - 1]) / 2 for k in range(0, len(seconds), temporal)]


class Qwen3VLMediaProcessor:
    """The :class:`omnicore.api.Processor` of the Qwen3-VL encoder for one modality (picklable, no
    weights).

    Attributes:
        modality: ``"image"`` or ``"video"``.
        placeholder: ``<|image_pad|>`` or ``<|video_pad|>``; ``wrap``: ``(<|vision_start|>,
            <|vision_end|>)``, around each run (one per image, one per frame group of a clip).
        image_processor, video_processor: the checkpoint's (only the one of :attr:`modality` is used).
        merge_size, temporal_patch_size, patch_size: the processor's.
    """

    wrap = WRAP

    def __init__(self, modality: str, image_processor: Any, video_processor: Any) -> None:
        if modality not in ("image", "video"):
            raise ValueError(f"qwen3_vl processor: modality must be 'image' or 'video', got {modality!r}")
        self.modality = modality
        self.placeholder = IMAGE_PAD if modality == "image" else VIDEO_PAD
        self.image_processor = image_processor
        self.video_processor = video_processor
        source = image_processor if modality == "image" else video_processor
        self.merge_size = int(source.merge_size)
        self.temporal_patch_size = int(source.temporal_patch_size)
        self.patch_size = int(source.patch_size)

    def preprocess(self, media: Any) -> dict[str, torch.Tensor]:
        """One item to the checkpoint processor's features.

        Args:
            media: a ``PIL.Image.Image`` (image) or an :class:`omnicore.api.Video` (video: uint8
                ``frames [T, H, W, 3]`` and ``fps``).

        Returns:
            image: ``{"pixel_values": float32 [gh * gw, 3 * tp * P * P], "image_grid_thw": int64
            [3]}``; video: ``{"pixel_values_videos": float32 [gt * gh * gw, 3 * tp * P * P],
            "video_grid_thw": int64 [3], "frame_seconds": float64 [gt]}`` (each frame group's
            time in seconds, :func:`frame_group_seconds`, written before its run).

        Raises:
            TypeError: the medium is not a PIL image (image) or a Video (video).
            ValueError: the frames are not ``[T, H, W, 3]``, or the processor refuses the item.
        """
        if self.modality == "image":
            from PIL import Image

            if not isinstance(media, Image.Image):
                raise TypeError(f"qwen3_vl image processor expects a PIL image (omnicore.api.load_image), got {type(media).__name__}")
            out = self.image_processor(images=[media], return_tensors="pt")
            return {
                "pixel_values": out["pixel_values"].to(torch.float32).contiguous(),
                "image_grid_thw": out["image_grid_thw"][0].to(torch.long),
            }
        if not isinstance(media, Video):
            raise TypeError(f"qwen3_vl video processor expects an omnicore.api.Video (omnicore.api.load_video), got {type(media).__name__}")
        frames = np.asarray(media.frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
            raise ValueError(f"video frames must be uint8 [T, H, W, 3] with T >= 1, got {frames.dtype} {tuple(frames.shape)}")
        meta = {"total_num_frames": len(frames), "fps": float(media.fps), "height": frames.shape[1], "width": frames.shape[2]}
        out = self.video_processor(videos=[frames], video_metadata=[meta], return_metadata=True, return_tensors="pt")
        md = out["video_metadata"][0]
        seconds = frame_group_seconds(
            list(md.frames_indices), float(md.fps or 24), self.temporal_patch_size
        )  # 24: Qwen3VLProcessor's default
        return {
            "pixel_values_videos": out["pixel_values_videos"].to(torch.float32).contiguous(),
            "video_grid_thw": out["video_grid_thw"][0].to(torch.long),
            "frame_seconds": torch.tensor(seconds, dtype=torch.float64),
        }

    def _grid_thw(self, features: dict[str, Any]) -> tuple[int, int, int]:
        """The patch grid ``(gt, gh, gw)`` of valid features; ValueError naming what is wrong otherwise."""
        pv_key, grid_key = ("pixel_values", "image_grid_thw") if self.modality == "image" else ("pixel_values_videos", "video_grid_thw")
        grid = features.get(grid_key) if isinstance(features, dict) else None
        pv = features.get(pv_key) if isinstance(features, dict) else None
        if grid is None or pv is None or tuple(torch.as_tensor(grid).shape) != (3,):
            raise ValueError(f"qwen3_vl {self.modality} features must hold {pv_key} and {grid_key} [3] (from preprocess)")
        gt, gh, gw = (int(v) for v in torch.as_tensor(grid))
        m = self.merge_size
        if pv.shape[0] != gt * gh * gw or gh % m or gw % m:
            raise ValueError(f"qwen3_vl {self.modality} features: {pv_key} {tuple(pv.shape)} does not fit {grid_key} {(gt, gh, gw)}")
        return gt, gh, gw

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Placeholder tokens (and merged rows) of one item: ``gt * gh * gw // merge_size**2``.

        Raises:
            ValueError: the features are not those :meth:`preprocess` makes.
        """
        gt, gh, gw = self._grid_thw(features)
        return gt * gh * gw // self.merge_size**2

    def grid(self, features: dict[str, Any]) -> tuple[int, int, int]:
        """The ``(t, h, w)`` layout of the item's tokens: ``(gt, gh / merge, gw / merge)``, in
        ``t, h, w`` raster order (the merger's order)."""
        gt, gh, gw = self._grid_thw(features)
        return gt, gh // self.merge_size, gw // self.merge_size

    def runs(self, features: dict[str, Any]) -> list[tuple[str, tuple[int, int, int]]]:
        """How the item is written (``Processor.runs``): an image as one run of its :meth:`grid`;
        a clip as one run per frame group, each after its time as text ``<{s:.1f} seconds>``
        (``Qwen3VLProcessor.replace_video_token``), each of grid ``(1, h, w)``."""
        t, h, w = self.grid(features)
        if self.modality == "image":
            return [("", (t, h, w))]
        seconds = [float(s) for s in torch.as_tensor(features["frame_seconds"]).tolist()]
        if len(seconds) != t:
            raise ValueError(f"qwen3_vl video features: {len(seconds)} frame_seconds for {t} frame groups")
        return [(f"<{s:.1f} seconds>", (1, h, w)) for s in seconds]

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Concatenate items in order, under the HF model's input names: images ``pixel_values
        [sum gh*gw, D]`` and ``image_grid_thw [B, 3]``; clips ``pixel_values_videos [sum gt*gh*gw,
        D]`` and ``video_grid_thw [B, 3]``.

        Raises:
            ValueError: ``items`` is empty, or an item's features are invalid (its index named).
        """
        if not items:
            raise ValueError(f"qwen3_vl {self.modality} processor: collate() needs at least one item")
        for i, item in enumerate(items):
            try:
                self._grid_thw(item)
            except ValueError as exc:
                raise ValueError(f"item {i}: {exc}") from None
        pv, grid = ("pixel_values", "image_grid_thw") if self.modality == "image" else ("pixel_values_videos", "video_grid_thw")
        return {
            pv: torch.cat([torch.as_tensor(it[pv]) for it in items]),
            grid: torch.stack([torch.as_tensor(it[grid], dtype=torch.long) for it in items]),
        }


def build_processor(options: dict[str, Any]) -> Qwen3VLMediaProcessor:
    """The processor factory of ``encoder/qwen3_vl_encoder``: reads the checkpoint's ``config.json``
    and processor files only.

    Raises:
        ValueError: the folder is not a Qwen3-VL checkpoint, or has no processor files.
        pydantic.ValidationError: unknown option keys or bad values.
    """
    opts = Qwen3VLEncoderOptions.model_validate(dict(options or {}))
    what = f"model.encoders.{opts.modality}.options.checkpoint"
    folder = checkpoint_folder(opts.checkpoint, what)
    image = load_image_processor(folder, what, WHAT_TO_PUT) if opts.modality == "image" else None
    video = None
    if opts.modality == "video":
        settings = video_settings(folder, what, WHAT_TO_PUT, files=VIDEO_SETTINGS_FILES)
        video = load_video_processor(folder, settings, fallback=FrameVideoProcessor)
    return Qwen3VLMediaProcessor(opts.modality, image, video)
