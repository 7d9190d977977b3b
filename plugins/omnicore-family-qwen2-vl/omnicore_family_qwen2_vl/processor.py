"""The data side of the Qwen2-VL family: options, the checkpoint's own image and video
processing, and the number of ``<|image_pad|>`` / ``<|video_pad|>`` tokens per item.

Imports no model code: :func:`build_processor` reads the checkpoint folder's ``config.json`` and
processor files (``preprocessor_config.json``, ``video_preprocessor_config.json`` or the nested
``processor_config.json``), never its weights, so data workers build it from the options alone.

Token rule (transformers' ``Qwen2VLProcessor`` / ``Qwen2_5_VLProcessor``): an image or clip whose
patch grid is ``(gt, gh, gw)`` (``image_grid_thw`` / ``video_grid_thw``; images have ``gt = 1``)
expands its placeholder to ``gt * gh * gw // merge_size**2`` tokens, wrapped in
``<|vision_start|>`` ... ``<|vision_end|>``, which is also the number of rows the tower's merger
gives it. In the LM those tokens sit on the grid ``(gt, gh / merge, gw / merge)`` (:meth:`grid`,
for mRoPE); Qwen2.5-VL spaces a clip's frame groups by ``tokens_per_second * second_per_grid_t``
positions (:meth:`time_interval`), Qwen2-VL by one.

Images go through the checkpoint's image processor as ``AutoImageProcessor`` loads it (the PIL
backend where torchvision is missing). Clips go through the checkpoint's video processor as
``AutoVideoProcessor`` loads it where transformers can build it (it needs torchvision); elsewhere
through :class:`omnicore_family_kit.media_processors.FrameVideoProcessor`, which takes the same steps with the same settings
(frame sampling, each frame resized and normalised by the image processor class, tubelets of
``temporal_patch_size`` frames in the same patch order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from omnicore.api import Video
from omnicore_family_kit.checkpoint import checkpoint_folder as kit_checkpoint_folder
from omnicore_family_kit.media_processors import load_image_processor, load_video_processor, video_settings
from omnicore_family_kit.options import CheckpointOptions
from omnicore_family_qwen2_vl.plugin import MODEL_TYPES

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
WRAP = ("<|vision_start|>", "<|vision_end|>")
WHAT_TO_PUT = (
    "point options.checkpoint at a Qwen2-VL or Qwen2.5-VL folder as published (Qwen/Qwen2-VL-2B-Instruct, "
    "Qwen/Qwen2.5-VL-3B-Instruct, or what Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration.save_pretrained "
    "and the processor's save_pretrained write: config.json, model.safetensors, tokenizer and processor files)"
)
IMAGE_KEYS = ("pixel_values", "image_grid_thw")
VIDEO_KEYS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
"""The features of one item, under the names the HF model's ``forward`` takes."""


class Qwen2VLEncoderOptions(CheckpointOptions):
    """Options of ``encoder/qwen2_vl_encoder``."""

    checkpoint: str = Field(
        description=(
            "A published Qwen2-VL or Qwen2.5-VL folder (config.json of ...ForConditionalGeneration, its safetensors and "
            "processor files), or a Hub name in the local cache; its vision tower with the merger is loaded"
        )
    )
    modality: Literal["image", "video"] = Field(
        default="image",
        description=(
            "what this entry's processor reads: image (PIL images, the image processor, <|image_pad|>) or video "
            "(omnicore.api.Video clips, the video processor, <|video_pad|>). The module encodes both; the video entry the "
            "foundation brings shares the image module (share: image)"
        ),
    )


class Qwen2VLFoundationOptions(CheckpointOptions):
    """Options of ``foundation/qwen2_vl``."""

    checkpoint: str = Field(
        description=(
            "A published Qwen2-VL or Qwen2.5-VL folder (config.json, safetensors, tokenizer and processor files), or a Hub "
            "name in the local cache (e.g. Qwen/Qwen2-VL-2B-Instruct, Qwen/Qwen2.5-VL-3B-Instruct)"
        )
    )


def checkpoint_folder(checkpoint: str, what: str) -> Path:
    """``checkpoint`` as a Qwen2-VL or Qwen2.5-VL folder: :func:`omnicore_family_kit.checkpoint.checkpoint_folder` of
    :data:`MODEL_TYPES` (ValueError naming ``what``, ending with :data:`WHAT_TO_PUT`)."""
    return kit_checkpoint_folder(checkpoint, what, MODEL_TYPES, WHAT_TO_PUT)


def tokens_per_second(folder: Path) -> float | None:
    """Qwen2.5-VL's ``vision_config.tokens_per_second`` (transformers' default where the file has
    none); None for Qwen2-VL."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    return float(config.vision_config.tokens_per_second) if config.model_type == "qwen2_5_vl" else None


class Qwen2VLMediaProcessor:
    """The :class:`omnicore.api.Processor` of the Qwen2-VL encoder for one modality (picklable,
    no weights).

    Attributes:
        modality: ``"image"`` or ``"video"``.
        placeholder: ``<|image_pad|>`` or ``<|video_pad|>``; ``wrap``: ``(<|vision_start|>,
            <|vision_end|>)``: the checkpoint's own tokens, as its chat template and processor write them.
        image_processor: the checkpoint's image processor; video_processor: its video processor
            (see :func:`omnicore_family_kit.media_processors.load_video_processor`); only the one of :attr:`modality` is used.
        merge_size: patches merged per side into one token; tokens_per_second: Qwen2.5-VL's
            positions per second of video (None for Qwen2-VL: frame groups are counted).
    """

    wrap = WRAP

    def __init__(self, modality: str, image_processor: Any, video_processor: Any, *, tokens_per_second: float | None = None) -> None:
        if modality not in ("image", "video"):
            raise ValueError(f"qwen2_vl processor: modality must be 'image' or 'video', got {modality!r}")
        self.modality = modality
        self.placeholder = IMAGE_PAD if modality == "image" else VIDEO_PAD
        self.image_processor = image_processor
        self.video_processor = video_processor
        source = image_processor if modality == "image" else video_processor
        self.merge_size = int(source.merge_size)
        self.temporal_patch_size = int(source.temporal_patch_size)
        self.patch_size = int(source.patch_size)
        self.tokens_per_second = tokens_per_second

    def preprocess(self, media: Any) -> dict[str, torch.Tensor]:
        """One item to the checkpoint processor's features.

        Args:
            media: a ``PIL.Image.Image`` (image; any mode, converted to RGB as the image processor
                does) or an :class:`omnicore.api.Video` (video: uint8 ``frames [T, H, W, 3]`` and ``fps``).

        Returns:
            image: ``{"pixel_values": float32 [gh * gw, 3 * tp * P * P], "image_grid_thw": int64
            [3]}`` (``(1, gh, gw)``); video: ``{"pixel_values_videos": float32 [gt * gh * gw, 3 * tp
            * P * P], "video_grid_thw": int64 [3], "second_per_grid_ts": float32 []}`` (seconds of
            video per frame group: ``temporal_patch_size / sampled fps``, as
            ``Qwen2_5_VLProcessor`` computes it).

        Raises:
            TypeError: the medium is not a PIL image (image) or a Video (video).
            ValueError: the frames are not ``[T, H, W, 3]``, or the processor refuses the item
                (an aspect ratio above 200, a clip too short to sample).
        """
        if self.modality == "image":
            from PIL import Image

            if not isinstance(media, Image.Image):
                raise TypeError(f"qwen2_vl image processor expects a PIL image (omnicore.api.load_image), got {type(media).__name__}")
            out = self.image_processor(images=[media], return_tensors="pt")
            return {
                "pixel_values": out["pixel_values"].to(torch.float32).contiguous(),
                "image_grid_thw": out["image_grid_thw"][0].to(torch.long),
            }
        if not isinstance(media, Video):
            raise TypeError(f"qwen2_vl video processor expects an omnicore.api.Video (omnicore.api.load_video), got {type(media).__name__}")
        frames = np.asarray(media.frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
            raise ValueError(f"video frames must be uint8 [T, H, W, 3] with T >= 1, got {frames.dtype} {tuple(frames.shape)}")
        meta = {"total_num_frames": len(frames), "fps": float(media.fps), "height": frames.shape[1], "width": frames.shape[2]}
        out = self.video_processor(videos=[frames], video_metadata=[meta], return_metadata=True, return_tensors="pt")
        sampled_fps = float(out["video_metadata"][0].sampled_fps)
        return {
            "pixel_values_videos": out["pixel_values_videos"].to(torch.float32).contiguous(),
            "video_grid_thw": out["video_grid_thw"][0].to(torch.long),
            "second_per_grid_ts": torch.tensor(self.temporal_patch_size / sampled_fps, dtype=torch.float32),
        }

    def _grid_thw(self, features: dict[str, Any]) -> tuple[int, int, int]:
        """The patch grid ``(gt, gh, gw)`` of valid features; ValueError naming what is wrong otherwise."""
        pv_key, grid_key = ("pixel_values", "image_grid_thw") if self.modality == "image" else ("pixel_values_videos", "video_grid_thw")
        grid = features.get(grid_key) if isinstance(features, dict) else None
        pv = features.get(pv_key) if isinstance(features, dict) else None
        if grid is None or pv is None or tuple(torch.as_tensor(grid).shape) != (3,):
            raise ValueError(f"qwen2_vl {self.modality} features must hold {pv_key} and {grid_key} [3] (from preprocess)")
        gt, gh, gw = (int(v) for v in torch.as_tensor(grid))
        m = self.merge_size
        if pv.shape[0] != gt * gh * gw or gh % m or gw % m:
            raise ValueError(f"qwen2_vl {self.modality} features: {pv_key} {tuple(pv.shape)} does not fit {grid_key} {(gt, gh, gw)}")
        return gt, gh, gw

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Placeholder tokens (and merged rows) of one item: ``gt * gh * gw // merge_size**2``, as
        the HF processor expands them.

        Raises:
            ValueError: the features are not those :meth:`preprocess` makes.
        """
        gt, gh, gw = self._grid_thw(features)
        return gt * gh * gw // self.merge_size**2

    def grid(self, features: dict[str, Any]) -> tuple[int, int, int]:
        """The ``(t, h, w)`` layout of the item's tokens in the LM: ``(gt, gh / merge, gw / merge)``,
        tokens in ``t, h, w`` raster order (the merger's order), for mRoPE."""
        gt, gh, gw = self._grid_thw(features)
        return gt, gh // self.merge_size, gw // self.merge_size

    def time_interval(self, features: dict[str, Any]) -> float:
        """Positions per frame group along ``t``: Qwen2.5-VL's ``tokens_per_second *
        second_per_grid_t`` for a clip (a float32 product, as its ``get_rope_index`` computes it);
        1 for images and for Qwen2-VL (whose ``get_rope_index`` counts frame groups)."""
        if self.modality != "video" or self.tokens_per_second is None:
            return 1.0
        second = torch.as_tensor(features["second_per_grid_ts"], dtype=torch.float32)
        return float(self.tokens_per_second * second)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Concatenate items in order, under the HF model's input names: images ``pixel_values
        [sum gh*gw, D]`` and ``image_grid_thw [B, 3]``; clips ``pixel_values_videos [sum
        gt*gh*gw, D]``, ``video_grid_thw [B, 3]`` and ``second_per_grid_ts [B]``.

        Raises:
            ValueError: ``items`` is empty, or an item's features are invalid (its index named).
        """
        if not items:
            raise ValueError(f"qwen2_vl {self.modality} processor: collate() needs at least one item")
        for i, item in enumerate(items):
            try:
                self._grid_thw(item)
            except ValueError as exc:
                raise ValueError(f"item {i}: {exc}") from None
        if self.modality == "image":
            return {
                "pixel_values": torch.cat([torch.as_tensor(it["pixel_values"]) for it in items]),
                "image_grid_thw": torch.stack([torch.as_tensor(it["image_grid_thw"], dtype=torch.long) for it in items]),
            }
        return {
            "pixel_values_videos": torch.cat([torch.as_tensor(it["pixel_values_videos"]) for it in items]),
            "video_grid_thw": torch.stack([torch.as_tensor(it["video_grid_thw"], dtype=torch.long) for it in items]),
            "second_per_grid_ts": torch.stack([torch.as_tensor(it["second_per_grid_ts"], dtype=torch.float32) for it in items]),
        }


def build_processor(options: dict[str, Any]) -> Qwen2VLMediaProcessor:
    """The processor factory of ``encoder/qwen2_vl_encoder``: reads the checkpoint's ``config.json``
    and processor files only.

    Raises:
        ValueError: the folder is not a Qwen2-VL / Qwen2.5-VL checkpoint, or has no processor files.
        pydantic.ValidationError: unknown option keys or bad values.
    """
    opts = Qwen2VLEncoderOptions.model_validate(dict(options or {}))
    what = f"model.encoders.{opts.modality}.options.checkpoint"
    folder = checkpoint_folder(opts.checkpoint, what)
    tps = tokens_per_second(folder)
    image = load_image_processor(folder, what, WHAT_TO_PUT) if opts.modality == "image" else None
    video = load_video_processor(folder, video_settings(folder, what, WHAT_TO_PUT)) if opts.modality == "video" else None
    return Qwen2VLMediaProcessor(opts.modality, image, video, tokens_per_second=tps)
