"""A checkpoint folder's own image and video processors, and transformers' Qwen2-VL video steps
for machines without torchvision.

transformers' ``Qwen2VLVideoProcessor`` (the video processor of Qwen2-VL, Qwen2.5-VL and
Qwen2.5-Omni checkpoints, and the base of Qwen3-VL's) needs torchvision, which cannot be installed
beside every torch build. :func:`load_video_processor` returns the checkpoint's own processor where
torchvision is installed and a :class:`FrameVideoProcessor` of the same settings elsewhere, which
takes the same steps. A family plugin calls these instead of carrying its own copy.

Where :mod:`omnicore_family_kit.processors` loads a checkpoint's whole ``AutoProcessor`` (and
refuses videos without torchvision), this module builds its image and video processors one by
one, for a family that writes its items itself.

Importing this module is torch-free (torch and transformers are imported where they are used).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

VIDEO_SETTINGS_FILES = ("video_preprocessor_config.json", "preprocessor_config.json")
"""The flat files transformers reads a video processor's settings from, in its order, after the
nested ``video_processor`` of ``processor_config.json`` (older Hub folders keep one file for images
and video)."""


def _or_fix(fix: str) -> str:
    return f"; {fix}" if fix else ""


def video_settings(folder: Path, what: str, fix: str = "", files: tuple[str, ...] = VIDEO_SETTINGS_FILES) -> dict[str, Any]:
    """The checkpoint's video processor settings, found where transformers looks for them, in its
    order: ``processor_config.json``'s nested ``video_processor``, then the first of ``files``
    (:data:`VIDEO_SETTINGS_FILES`) in the folder.

    Args:
        folder: the checkpoint folder.
        what: the config field that named it (``model.encoders.video.options.checkpoint``), first
            in the error message.
        fix: what to put there, last in the error message (the family's own advice).
        files: the flat files to try, in order (a family whose processor reads fewer names them).

    Returns:
        The settings dict as saved (keys of transformers' video processor class).

    Raises:
        ValueError: naming ``what``, the folder and the files looked for, then ``fix``, when the
            folder holds none of them.
    """
    nested = folder / "processor_config.json"
    if nested.is_file():
        data = json.loads(nested.read_text())
        if isinstance(data.get("video_processor"), dict):
            return dict(data["video_processor"])
    for name in files:
        if (folder / name).is_file():
            return json.loads((folder / name).read_text())
    names = [*files, "processor_config.json"]
    looked = f"{', '.join(names[:-1])} or {names[-1]}"
    raise ValueError(f"{what}: {str(folder)!r} has no {looked}{_or_fix(fix)}")


def load_image_processor(folder: Path, what: str, fix: str = "") -> Any:
    """The checkpoint's own image processor (``AutoImageProcessor.from_pretrained``; transformers
    picks its PIL backend where torchvision is missing).

    Args:
        folder: the checkpoint folder; what, fix: as for :func:`video_settings`.

    Raises:
        ValueError: naming ``what``, the folder and ``fix`` when the folder has no
            ``preprocessor_config.json`` or ``processor_config.json``.
    """
    from transformers import AutoImageProcessor

    if not any((folder / f).is_file() for f in ("preprocessor_config.json", "processor_config.json")):
        raise ValueError(f"{what}: {str(folder)!r} has no preprocessor_config.json or processor_config.json{_or_fix(fix)}")
    return AutoImageProcessor.from_pretrained(str(folder))


class FrameVideoProcessor:
    """transformers' ``Qwen2VLVideoProcessor`` steps for machines where it cannot be built (it
    needs torchvision): the same settings (read from the checkpoint's video processor file) and
    the same call signature, so transformers' processors (``Qwen2VLProcessor``,
    ``Qwen2_5OmniProcessor``) can hold it too. Picklable (its settings only), for data workers.

    Per clip of ``T`` frames at ``fps`` (uint8 ``[T, H, W, 3]``):

    1. with ``do_sample_frames``, the frames ``Qwen2VLVideoProcessor.sample_frames`` keeps
       (``num_frames``, or ``fps`` frames per second bounded by ``min_frames`` / ``max_frames``,
       a multiple of ``temporal_patch_size``, spread evenly), recorded in the metadata's
       ``frames_indices`` (its ``sampled_fps`` is then ``len(indices) / T * fps``);
    2. each frame resized (``smart_resize`` to multiples of ``patch_size * merge_size`` within the
       ``size`` pixel bounds, capped per frame with ``cap_pixels_per_frame``), rescaled and
       normalised by transformers' ``Qwen2VLImageProcessorPil`` with these settings;
    3. the last frame repeated up to a multiple of ``temporal_patch_size`` and the frames cut into
       tubelets: ``pixel_values_videos`` ``[gt * gh * gw, 3 * tp * P * P]`` in the video
       processor's order (tubelet, then merge block, then patch in the block; each patch as
       channel, frame, row, column) and ``video_grid_thw`` ``(gt, gh, gw)``.

    A family whose processor differs in its steps subclasses it and replaces :data:`DEFAULTS`,
    ``__init__``, :meth:`sample_indices` (step 1), :meth:`keep_frames` or :meth:`clip_patches`
    (steps 2 and 3); :meth:`__call__` is shared.

    Args:
        settings: the video processor's dict (:func:`video_settings`); keys transformers' class
            reads, its class defaults for the missing ones (``min_pixels`` / ``max_pixels`` of
            older files override ``size``).
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
        ``fps`` (``num_frames`` / ``target_fps``: call overrides of the settings), as int ``[n]``.

        Raises:
            ValueError: ``num_frames`` and ``fps`` both given, fps sampling without the clip's fps,
                or a clip too short to give one tubelet.
        """
        import torch

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

    def keep_frames(self, frames: np.ndarray, metadata: Any, sample: bool, num_frames: int | None, fps: float | None) -> np.ndarray:
        """Step 1 for one clip: with ``sample``, the frames :meth:`sample_indices` keeps, their indices
        written to ``metadata.frames_indices``; else every frame, the metadata as given.

        Args:
            frames: uint8 ``[T, H, W, 3]``; metadata: the clip's ``VideoMetadata`` (changed in place).
            num_frames, fps: call overrides of the settings.
        """
        if not sample:
            return frames
        idx = self.sample_indices(len(frames), metadata.fps, num_frames, fps)
        metadata.frames_indices = idx.tolist()
        return frames[idx]

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
        import torch
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
            patches, grid = self.clip_patches(self.keep_frames(frames, md, sample, num_frames, fps))
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
        import torch

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


def load_video_processor(folder: Path, settings: dict[str, Any], fallback: type[FrameVideoProcessor] = FrameVideoProcessor) -> Any:
    """The checkpoint's own video processor: ``AutoVideoProcessor.from_pretrained`` where
    torchvision is installed (transformers' Qwen-VL video processors need it), else
    ``fallback(settings)``.

    Args:
        folder: the checkpoint folder.
        settings: its video processor settings (:func:`video_settings`), for the fallback.
        fallback: the class that takes the processor's steps without torchvision:
            :class:`FrameVideoProcessor` (the default) or a subclass of it for another family.
    """
    if importlib.util.find_spec("torchvision") is not None:
        from transformers import AutoVideoProcessor

        return AutoVideoProcessor.from_pretrained(str(folder))
    return fallback(settings)
