"""Clips without torchvision: transformers' ``Qwen2VLVideoProcessor`` steps (the video processor
of Qwen2.5-Omni checkpoints) with the checkpoint's settings.

transformers' ``Qwen2VLVideoProcessor`` (and so ``AutoVideoProcessor`` of these checkpoints) needs
torchvision. Where torchvision is installed :func:`load_video_processor` returns it as
``AutoVideoProcessor`` loads it; elsewhere :class:`FrameVideoProcessor` takes the same steps with
the same settings (the frames ``sample_frames`` keeps, each frame resized and normalised by the PIL
image processor, tubelets in the video processor's patch order). The same class as in
omnicore-family-qwen2-vl (a plugin imports no other plugin).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch


def video_settings(folder: Path, what: str, fix: str) -> dict[str, Any]:
    """The checkpoint's video processor settings, found where transformers looks for them, in its
    order: ``processor_config.json``'s nested ``video_processor``, then
    ``video_preprocessor_config.json``, then ``preprocessor_config.json`` (older Hub folders keep
    one file for images and video).

    Raises:
        ValueError: naming ``what`` and ``fix`` (what to put there) when the folder holds none of them.
    """
    nested = folder / "processor_config.json"
    if nested.is_file():
        data = json.loads(nested.read_text())
        if isinstance(data.get("video_processor"), dict):
            return dict(data["video_processor"])
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        if (folder / name).is_file():
            return json.loads((folder / name).read_text())
    raise ValueError(
        f"{what}: {str(folder)!r} has no video_preprocessor_config.json, preprocessor_config.json or processor_config.json; {fix}"
    )


class FrameVideoProcessor:
    """transformers' ``Qwen2VLVideoProcessor`` steps for machines where it cannot be built (it
    needs torchvision): the same settings (read from the checkpoint's video processor file) and
    the same call signature, so transformers' ``Qwen2_5OmniProcessor`` can hold it too.

    Per clip of ``T`` frames at ``fps`` (uint8 ``[T, H, W, 3]``):

    1. with ``do_sample_frames``, the frames ``Qwen2VLVideoProcessor.sample_frames`` keeps
       (``num_frames``, or ``fps`` frames per second bounded by ``min_frames`` / ``max_frames``,
       a multiple of ``temporal_patch_size``, spread evenly), recorded in the metadata's
       ``frames_indices`` (its ``sampled_fps`` is then ``len(indices) / T * fps``);
    2. each frame resized (``smart_resize`` to multiples of ``patch_size * merge_size`` within the
       ``size`` pixel bounds, capped per frame with ``cap_pixels_per_frame``), rescaled and
       normalised by the PIL image processor class of the family with these settings;
    3. the last frame repeated up to a multiple of ``temporal_patch_size`` and the frames cut into
       tubelets: ``pixel_values_videos`` ``[gt * gh * gw, 3 * tp * P * P]`` in the video
       processor's order (tubelet, then merge block, then patch in the block; each patch as
       channel, frame, row, column) and ``video_grid_thw`` ``(gt, gh, gw)``.

    Args:
        settings: the video processor's dict (:func:`video_settings`); keys transformers' class
            reads, its class defaults for the missing ones.
    """

    DEFAULTS: dict[str, Any] = {
        "size": {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768},
        "resample": 3,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_frames": 4,
        "max_frames": 768,
        "do_sample_frames": False,
        "fps": None,
        "num_frames": None,
        "cap_pixels_per_frame": None,
        "max_video_tokens": 128000,
    }
    """``Qwen2VLVideoProcessor``'s class defaults (transformers 5.24)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        s = {k: settings[k] if settings.get(k) is not None else v for k, v in self.DEFAULTS.items()}
        size = dict(settings.get("size") or self.DEFAULTS["size"])
        if settings.get("min_pixels") is not None:
            size["shortest_edge"] = int(settings["min_pixels"])
        if settings.get("max_pixels") is not None:
            size["longest_edge"] = int(settings["max_pixels"])
        s["size"] = {"shortest_edge": int(size["shortest_edge"]), "longest_edge": int(size["longest_edge"])}
        self.settings = s
        self.patch_size, self.merge_size = int(s["patch_size"]), int(s["merge_size"])
        self.temporal_patch_size = int(s["temporal_patch_size"])
        self._image_processor: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"])  # type: ignore[misc]

    @property
    def image_processor(self) -> Any:
        """The PIL image processor that resizes and normalises each frame (built on first use)."""
        if self._image_processor is None:
            from transformers import Qwen2VLImageProcessorPil

            s = self.settings
            keys = ("resample", "do_resize", "do_rescale", "rescale_factor", "do_normalize", "do_convert_rgb", "image_mean", "image_std")
            self._image_processor = Qwen2VLImageProcessorPil(
                size=dict(s["size"]),
                patch_size=self.patch_size,
                merge_size=self.merge_size,
                temporal_patch_size=1,
                **{k: s[k] for k in keys},
            )
        return self._image_processor

    def sample_indices(self, total: int, fps: float | None, num_frames: int | None = None, target_fps: float | None = None) -> np.ndarray:
        """The frames ``Qwen2VLVideoProcessor.sample_frames`` keeps of a clip of ``total`` frames at
        ``fps`` (``num_frames`` / ``target_fps``: call overrides of the settings).

        Raises:
            ValueError: ``num_frames`` and ``fps`` both given, fps sampling without the clip's fps,
                or a clip too short to give one tubelet.
        """
        s, tp = self.settings, self.temporal_patch_size
        num_frames = num_frames if num_frames is not None else s["num_frames"]
        target_fps = target_fps if target_fps is not None else s["fps"]
        if num_frames is not None and target_fps is not None:
            raise ValueError("video processor: num_frames and fps are mutually exclusive; set only one")
        n: int | None = None
        if num_frames is not None:
            n = round(num_frames / tp) * tp
        elif target_fps is not None:
            if fps is None:
                raise ValueError("video processor: sampling at fps frames per second needs the clip's own fps")
            most = math.floor(min(int(s["max_frames"]), total) / tp) * tp
            want = min(max(total / fps * target_fps, int(s["min_frames"])), most, total)
            n = math.floor(want / tp) * tp
        if n is None:
            return np.arange(total)
        if n < 1 or n > total:
            raise ValueError(f"video of {total} frames cannot be sampled to {n} frames (temporal_patch_size {tp}); give a longer clip")
        return torch.arange(0, total, total / n).int().numpy()

    def __call__(
        self,
        videos: Any,
        video_metadata: Any = None,
        return_metadata: bool = False,
        return_tensors: Any = None,
        do_sample_frames: bool | None = None,
        num_frames: int | None = None,
        fps: float | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        """Clips to ``{"pixel_values_videos": [sum gt*gh*gw, 3*tp*P*P], "video_grid_thw": int64
        [B, 3]}`` (and ``"video_metadata"`` with ``return_metadata``), as transformers' video
        processor returns them (float32 torch tensors whatever ``return_tensors`` says).

        Args:
            videos: one clip or a list of clips, each uint8 ``[T, H, W, 3]``.
            video_metadata: one dict (or ``VideoMetadata``) per clip: ``total_num_frames``, ``fps``.
            do_sample_frames, num_frames, fps: call overrides of the settings.

        Raises:
            ValueError: a clip is not uint8-like ``[T, H, W, 3]`` with ``T >= 1``; see :meth:`sample_indices`.
        """
        from transformers.video_utils import VideoMetadata

        clips = [videos] if isinstance(videos, np.ndarray) and videos.ndim == 4 else list(videos)
        metas = video_metadata if isinstance(video_metadata, (list, tuple)) else [video_metadata] * len(clips)
        sample = self.settings["do_sample_frames"] if do_sample_frames is None else do_sample_frames
        pixels, grids, out_meta = [], [], []
        for clip, meta in zip(clips, metas, strict=True):
            frames = np.asarray(clip)
            if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
                raise ValueError(f"video frames must be [T, H, W, 3] with T >= 1, got {tuple(frames.shape)}")
            if meta is None:
                md = VideoMetadata(total_num_frames=len(frames), fps=None, frames_indices=list(range(len(frames))))
            else:
                md = meta if isinstance(meta, VideoMetadata) else VideoMetadata(**dict(meta))
            if sample:
                idx = self.sample_indices(len(frames), md.fps, num_frames, fps)
                md.frames_indices = idx.tolist()
                frames = frames[idx]
            patches, grid = self.clip_patches(frames)
            pixels.append(patches)
            grids.append(grid)
            out_meta.append(md)
        out: dict[str, Any] = {"pixel_values_videos": torch.cat(pixels), "video_grid_thw": torch.tensor(grids, dtype=torch.long)}
        if return_metadata:
            out["video_metadata"] = out_meta
        return out

    def clip_patches(self, frames: np.ndarray) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """Sampled frames uint8 ``[F, H, W, 3]`` to ``(pixel_values_videos [gt*gh*gw, 3*tp*P*P],
        (gt, gh, gw))`` (steps 2 and 3 of the class docstring)."""
        s, tp, p = self.settings, self.temporal_patch_size, self.patch_size
        size = dict(s["size"])
        if s["cap_pixels_per_frame"]:  # Qwen2VLVideoProcessor.resize: a share of the whole clip's pixel budget per frame
            factor = p * self.merge_size
            total_pixels = int(int(s["max_video_tokens"]) * factor * factor * 0.9)
            size["longest_edge"] = max(min(size["longest_edge"], total_pixels * tp // len(frames)), int(size["shortest_edge"] * 1.05))
        out = self.image_processor(images=list(frames), size=size, return_tensors="pt")
        grid = out["image_grid_thw"][0]
        gh, gw = int(grid[1]), int(grid[2])
        per_frame = out["pixel_values"].reshape(len(frames), gh * gw, 3, p, p)
        if pad := -len(frames) % tp:
            per_frame = torch.cat([per_frame, per_frame[-1:].expand(pad, -1, -1, -1, -1)])
        gt = per_frame.shape[0] // tp
        tubelets = per_frame.reshape(gt, tp, gh * gw, 3, p, p).permute(0, 2, 3, 1, 4, 5)
        return tubelets.reshape(gt * gh * gw, 3 * tp * p * p).contiguous(), (gt, gh, gw)


def load_video_processor(folder: Path, what: str, settings: dict[str, Any]) -> Any:
    """The checkpoint's own video processor: ``AutoVideoProcessor.from_pretrained`` where
    torchvision is installed (transformers' ``Qwen2VLVideoProcessor`` needs it), else a
    :class:`FrameVideoProcessor` of ``settings`` (:func:`video_settings`)."""
    if importlib.util.find_spec("torchvision") is not None:
        from transformers import AutoVideoProcessor

        return AutoVideoProcessor.from_pretrained(str(folder))
    return FrameVideoProcessor(settings)
