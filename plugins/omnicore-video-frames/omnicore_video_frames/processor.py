"""The data side of ``encoder/video_frames``: options, frame sampling, tubelet patches, token counts
and batching.

Imports no model code (transformers' ``Qwen2VLVisionConfig`` only, lazily, to read a tower's
patch sizes), so data workers build :class:`VideoFramesProcessor` with :func:`build_processor`
from the options alone: a checkpoint folder's ``config.json`` is read, never its weights.
:class:`omnicore_video_frames.encoder.VideoFramesEncoder` holds the same processor.

The steps, for one clip of ``n`` frames at ``r`` frames per second, ``H x W`` pixels
(:class:`omnicore.api.Video`, decoded by :func:`omnicore.api.load_video`)::

    sample m frames at `fps` (at most `max_frames`)    -> uint8 [m, H, W, 3]
    resize each frame to `frame_size` (Pillow bicubic) -> uint8 [m, S_h, S_w, 3]
    x / 255, (x - mean) / std per channel (CLIP's)     -> float32 [m, 3, S_h, S_w]
    repeat the last frame up to a multiple of tp = 2   -> [gt * tp, 3, S_h, S_w]
    cut into tubelets of tp frames x P x P pixels      -> pixel_values_videos [gt * gh * gw, 3 * tp * P * P]

with ``gh = S_h / P``, ``gw = S_w / P``. The tower sees ``gt * gh * gw`` patches; its merger joins
each ``M x M`` block of neighbouring patches (``M = spatial_merge_size``, 2), so the encoder gives
``gt * (gh / M) * (gw / M)`` tokens. Patches are laid out as transformers' Qwen2-VL video processor
lays them out (``Qwen2VLVideoProcessor.patchify``): tubelet by tubelet, then ``M x M`` blocks in
row-major order, then the patches of a block in row-major order; each patch flattened as
``(channel, frame, row, column)``, the order of the tower's ``Conv3d`` patch embedding.

Sources: Qwen2-VL (Wang et al. 2024, "Qwen2-VL: Enhancing Vision-Language Model's Perception of
the World at Any Resolution", arXiv:2409.12191): 2-frame tubelets (a clip of an odd number of
frames repeats its last frame), 14-pixel patches merged 2 x 2, CLIP's normalisation constants.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from einops import rearrange
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from omnicore.api import Video
from omnicore_video_frames.augment import VideoAugmentOptions, frames_to_patches

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
"""OpenAI CLIP's per-channel mean and standard deviation of pixels in [0, 1], used by Qwen2-VL."""

FEATURE_KEYS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
"""The features of one clip (transformers' Qwen2-VL / Qwen2.5-VL names)."""


class VideoEncoderOptions(BaseModel):
    """Options of encoder ``video_frames`` (the ``options`` mapping in config). Exactly one of
    ``checkpoint`` and ``config`` must be set.

    Example (a tiny tower for 64 x 64 Moving MNIST clips at 4 fps: 8 frames give 4 tubelets of
    4 x 4 merged tokens, 64 tokens per clip)::

        encoders:
          video:
            name: video_frames
            options:
              config: {depth: 2, embed_dim: 64, num_heads: 4, mlp_ratio: 2, hidden_size: 64,
                       patch_size: 8, spatial_merge_size: 2, temporal_patch_size: 2}
              fps: 4
              max_frames: 8
              frame_size: 64
    """

    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = Field(
        default=None,
        description=(
            "Local folder to load from: one written by this encoder's save_pretrained (projector restored), by "
            "transformers' Qwen2VisionTransformerPretrainedModel.save_pretrained, or a full Qwen2-VL folder "
            "(Qwen2VLForConditionalGeneration; its vision tower is taken, the projector starts fresh). Nothing is downloaded."
        ),
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "transformers.Qwen2VLVisionConfig keyword arguments for a randomly initialised tower (used when `checkpoint` "
            "is unset): depth, embed_dim (tower width), num_heads, mlp_ratio, hidden_size (width after the 2x2 merge, "
            "the projector's input), patch_size (pixels, P), spatial_merge_size (M), temporal_patch_size (frames per "
            "tubelet, 2 as in Qwen2-VL), in_channels (must be 3)."
        ),
    )
    fps: float = Field(
        default=2.0,
        gt=0,
        description=(
            "Frames sampled per second of video: frame floor(k * source_fps / fps) for k = 0, 1, ...; a rate above the "
            "source's takes every frame once. A variable-rate clip: the frame whose timestamp is nearest k / fps seconds."
        ),
    )
    max_frames: int = Field(
        default=16,
        ge=1,
        description="At most this many frames per clip; a longer clip gets max_frames frames spread evenly over its length.",
    )
    frame_size: int | tuple[int, int] | None = Field(
        default=None,
        description=(
            "Frames are resized to this (pixels): one int for square frames or [height, width]; each side a multiple of "
            "patch_size * spatial_merge_size. None: each clip keeps its size rounded to the nearest such multiple."
        ),
    )
    image_size: int | tuple[int, int] | None = Field(
        default=None,
        description=(
            "encoder video_frames_image only: still images are resized to this (pixels; one int or [height, width], each side a "
            "multiple of patch_size * spatial_merge_size) and encoded as clips of temporal_patch_size copies, one tubelet, as "
            "Qwen2-VL encodes images. None: each image keeps its size rounded to the nearest such multiple"
        ),
    )
    freeze: bool = Field(
        default=False,
        description="Freeze the vision tower (requires_grad=False, run without autograd); the projector always trains.",
    )
    augment: VideoAugmentOptions = Field(
        default_factory=VideoAugmentOptions,
        description=(
            "Random changes per clip while training (never in eval or generation): shift (largest translation, a fraction "
            "of the frame's sides) and reverse (play backwards with probability 1/2; only where time's direction does not "
            "matter). See omnicore_video_frames.augment."
        ),
    )
    image_augment: VideoAugmentOptions | None = Field(
        default=None,
        description=(
            "encoder video_frames_image only: random changes per still image while training (items with second_per_grid_ts "
            "0), as `augment` is per clip; shift is a fraction of the image's sides. None: still images get `augment`. A "
            "tower shared by images and clips often wants larger shifts on small images (digits centred in a 32-pixel image "
            "land anywhere on a clip's token grid) than on clips (whose edge objects a large shift pushes out)"
        ),
    )

    @field_validator("config")
    @classmethod
    def _known_config_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        import difflib

        from transformers import Qwen2VLVisionConfig

        valid = (set(Qwen2VLVisionConfig().to_dict()) | set(Qwen2VLVisionConfig.attribute_map)) - {
            "transformers_version",
            "model_type",
            "architectures",
        }
        for key in value:
            if key not in valid:
                close = difflib.get_close_matches(key, sorted(valid), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown Qwen2VLVisionConfig key {key!r}{hint}")
        if value.get("in_channels", 3) != 3:
            raise ValueError("in_channels must be 3: frames are decoded as RGB")
        return value

    @field_validator("frame_size", "image_size")
    @classmethod
    def _positive_size(cls, value: int | tuple[int, int] | None, info: ValidationInfo) -> int | tuple[int, int] | None:
        sides = (value,) if isinstance(value, int) else value or ()
        if any(s < 1 for s in sides):
            raise ValueError(f"{info.field_name} must be positive pixels, got {value}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> VideoEncoderOptions:
        if self.checkpoint and self.config:
            raise ValueError(
                "set either `checkpoint` (load a tower) or `config` (build one from scratch), not both; "
                "a checkpoint's architecture comes from its own config.json"
            )
        if not self.checkpoint and not self.config:
            raise ValueError(
                "set `checkpoint` (a local Qwen2-VL vision folder) or `config` (Qwen2VLVisionConfig kwargs such as "
                "depth, embed_dim, num_heads, hidden_size, patch_size, spatial_merge_size, temporal_patch_size)"
            )
        return self


# ---------------------------------------------------------------------------------------------
# The formulas (pure functions of the clip's length, rate and size)
# ---------------------------------------------------------------------------------------------


def sample_indices(num_frames: int, source_fps: float, fps: float, max_frames: int) -> tuple[np.ndarray, float]:
    """Which frames of a clip are kept, and the time between two kept frames.

    With ``n = num_frames`` at ``r = source_fps``, the clip lasts ``n / r`` seconds and sampling at
    ``f = fps`` gives ``natural = max(1, floor(n * f / r))`` frames at ``k / f`` seconds, i.e. frame
    ``floor(k * r / f)`` (``k = 0 .. natural - 1``). The count is capped at ``n`` (never a frame
    twice) and at ``max_frames``; a capped clip takes ``m`` frames spread evenly, frame
    ``floor(k * n / m)``.

    Returns:
        ``(indices, step_seconds)``: int64 ``[m]`` increasing frame indices and the seconds from one
        kept frame to the next (``1 / f``, or ``n / (m * r)`` when capped).

    Raises:
        ValueError: if ``num_frames`` < 1 or a rate is not positive.
    """
    if num_frames < 1:
        raise ValueError(f"a video needs at least one frame, got {num_frames}")
    if not (source_fps > 0 and fps > 0):
        raise ValueError(f"frame rates must be positive, got source_fps={source_fps}, fps={fps}")
    natural = max(1, math.floor(num_frames * fps / source_fps + 1e-9))
    m = min(natural, num_frames, max_frames)
    step = source_fps / fps if m == natural else num_frames / m  # in source frames
    indices = np.minimum(np.floor(np.arange(m) * step + 1e-9).astype(np.int64), num_frames - 1)
    return indices, step / source_fps


def output_size(height: int, width: int, frame_size: int | tuple[int, int] | None, factor: int) -> tuple[int, int]:
    """The ``(height, width)`` frames are resized to: ``frame_size`` (an int is square), or, when it is
    None, each side rounded to the nearest multiple of ``factor`` (halves up; at least ``factor``)."""
    if frame_size is None:
        return tuple(max(factor, int(side / factor + 0.5) * factor) for side in (height, width))  # type: ignore[return-value]
    if isinstance(frame_size, int):
        return frame_size, frame_size
    return int(frame_size[0]), int(frame_size[1])


# ---------------------------------------------------------------------------------------------
# The processor
# ---------------------------------------------------------------------------------------------


class VideoFramesProcessor:
    """The :class:`omnicore.components.Processor` of ``encoder/video_frames`` (picklable, no weights).

    Attributes:
        modality: ``"video"``.
        patch_size: ``P``, pixels; merge_size: ``M`` (patches merged ``M x M`` into one token);
        temporal_patch_size: ``tp``, frames per tubelet (2).
        fps, max_frames, frame_size: the sampling and size options (see :class:`VideoEncoderOptions`).
        mean, std: per-channel normalisation (CLIP's).

    Build it with :func:`build_processor`, or from a tower's config with :meth:`for_config`.
    """

    modality = "video"

    def __init__(
        self,
        *,
        patch_size: int,
        merge_size: int,
        temporal_patch_size: int,
        fps: float,
        max_frames: int,
        frame_size: int | tuple[int, int] | None = None,
    ) -> None:
        """Raises:
        ValueError: if a size is not positive, or a side of ``frame_size`` is not a multiple of
            ``patch_size * merge_size`` (naming ``frame_size`` and the nearest valid sizes).
        """
        if min(patch_size, merge_size, temporal_patch_size) < 1:
            raise ValueError(
                f"patch_size, spatial_merge_size and temporal_patch_size must be >= 1: {patch_size}, {merge_size}, {temporal_patch_size}"
            )
        self.patch_size, self.merge_size, self.temporal_patch_size = int(patch_size), int(merge_size), int(temporal_patch_size)
        self.fps, self.max_frames = float(fps), int(max_frames)
        self.frame_size = tuple(frame_size) if isinstance(frame_size, (list, tuple)) else frame_size
        factor = self.factor
        if frame_size is not None:
            for side in output_size(1, 1, self.frame_size, factor):
                if side % factor:
                    lo, hi = max(factor, side // factor * factor), (side // factor + 1) * factor
                    raise ValueError(
                        f"frame_size {frame_size}: each side must be a multiple of patch_size * spatial_merge_size = {factor} "
                        f"(e.g. {lo} or {hi} instead of {side})"
                    )
        self.mean = np.asarray(CLIP_MEAN, dtype=np.float32)
        self.std = np.asarray(CLIP_STD, dtype=np.float32)

    @property
    def factor(self) -> int:
        """``P * M``: frame sides are multiples of it, so the merge tiles every frame."""
        return self.patch_size * self.merge_size

    @classmethod
    def for_config(cls, config: Any, options: VideoEncoderOptions) -> VideoFramesProcessor:
        """The processor of a tower with ``config`` (a ``Qwen2VLVisionConfig``) and these options."""
        return cls(
            patch_size=int(config.patch_size),
            merge_size=int(config.spatial_merge_size),
            temporal_patch_size=int(config.temporal_patch_size),
            fps=options.fps,
            max_frames=options.max_frames,
            frame_size=options.frame_size,
        )

    # ---- the formula ----------------------------------------------------------------------

    def grid_for(self, num_frames: int, source_fps: float, height: int, width: int) -> tuple[int, int, int]:
        """The tower's patch grid ``(gt, gh, gw)`` (before the merge) of a clip of ``num_frames``
        frames at ``source_fps``, ``height x width`` pixels: ``gt = ceil(m / tp)`` with ``m`` from
        :func:`sample_indices`, ``gh, gw`` = the output size (:func:`output_size`) over ``P``."""
        m = len(sample_indices(num_frames, source_fps, self.fps, self.max_frames)[0])
        out_h, out_w = output_size(height, width, self.frame_size, self.factor)
        return -(-m // self.temporal_patch_size), out_h // self.patch_size, out_w // self.patch_size

    def tokens_for(self, num_frames: int, source_fps: float, height: int, width: int) -> int:
        """Tokens of such a clip: ``gt * (gh / M) * (gw / M)`` (see :meth:`grid_for`); equal to
        :meth:`num_tokens` of its features and to the encoder's output rows."""
        gt, gh, gw = self.grid_for(num_frames, source_fps, height, width)
        return gt * (gh // self.merge_size) * (gw // self.merge_size)

    # ---- the Processor contract -----------------------------------------------------------

    def preprocess(self, media: Any) -> dict[str, torch.Tensor]:
        """One :class:`omnicore.api.Video` to tubelet patches (see the module docstring).

        Returns:
            ``pixel_values_videos`` float32 ``[gt * gh * gw, 3 * tp * P * P]``; ``video_grid_thw``
            int64 ``[3]`` = ``(gt, gh, gw)``; ``second_per_grid_ts`` float32 scalar: seconds of video
            per tubelet (``tp`` times the sampling step; for time-aligned positions).

        Raises:
            TypeError: if ``media`` is not a Video.
            ValueError: if its frames are not uint8 ``[T, H, W, 3]`` with ``T >= 1`` or its fps is not positive.
        """
        if not isinstance(media, Video):
            raise TypeError(f"video_frames preprocess expects an omnicore.api.Video (omnicore.api.load_video), got {type(media).__name__}")
        frames = np.asarray(media.frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
            raise ValueError(f"video frames must be uint8 [T, H, W, 3] with T >= 1, got {frames.dtype} {tuple(frames.shape)}")
        idx, step_s = self.sample(media)
        out_h, out_w = output_size(frames.shape[1], frames.shape[2], self.frame_size, self.factor)
        x = self._normalise(resize_frames(frames[idx], out_h, out_w))  # [m, 3, S_h, S_w]
        patches, grid = self.patchify(x)
        return {
            "pixel_values_videos": torch.from_numpy(patches),
            "video_grid_thw": torch.tensor(grid, dtype=torch.long),
            "second_per_grid_ts": torch.tensor(step_s * self.temporal_patch_size, dtype=torch.float32),
        }

    def sample(self, media: Video) -> tuple[np.ndarray, float]:
        """The frames of ``media`` kept and the seconds between two kept ones: for a constant-rate
        clip :func:`sample_indices`; for a variable-rate one (``media.times``) the frame seen
        nearest each time ``k / fps`` over the clip's length (``media.seconds``), at most
        ``max_frames`` times spread evenly (``Video.frames_at``; a frame shown for long may be
        kept twice, as a viewer sees it twice)."""
        if media.times is None:
            return sample_indices(len(media.frames), float(media.fps), self.fps, self.max_frames)
        natural = max(1, math.floor(media.seconds * self.fps + 1e-9))
        m = min(natural, self.max_frames)
        step = 1.0 / self.fps if m == natural else media.seconds / m
        return media.frames_at(np.arange(m) * step), step

    def _normalise(self, frames: np.ndarray) -> np.ndarray:
        """uint8 ``[m, S_h, S_w, 3]`` to float32 ``[m, 3, S_h, S_w]``: ``(x / 255 - mean) / std``."""
        x = (frames.astype(np.float32) / 255.0 - self.mean) / self.std
        return np.ascontiguousarray(rearrange(x, "t h w c -> t c h w"))

    def patchify(self, x: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        """float ``[m, C, S_h, S_w]`` to ``([gt * gh * gw, C * tp * P * P], (gt, gh, gw))``, the last
        frame repeated up to a multiple of ``tp`` (layout: the module docstring; the cut itself is
        :func:`~omnicore_video_frames.augment.frames_to_patches`, which the augmentation inverts)."""
        tp, p = self.temporal_patch_size, self.patch_size
        if pad := -len(x) % tp:
            x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
        m, _, h, w = x.shape
        patches = frames_to_patches(torch.from_numpy(np.ascontiguousarray(x)), tp, p, self.merge_size)
        return np.ascontiguousarray(patches.numpy()), (m // tp, h // p, w // p)

    def _check(self, features: dict[str, Any]) -> tuple[int, int, int]:
        """The ``(gt, gh, gw)`` of valid features; ValueError naming what is wrong otherwise."""
        grid = features.get("video_grid_thw") if isinstance(features, dict) else None
        pv = features.get("pixel_values_videos") if isinstance(features, dict) else None
        if grid is None or pv is None or tuple(grid.shape) != (3,):
            raise ValueError("video_frames features must hold pixel_values_videos and video_grid_thw [3] (from preprocess)")
        gt, gh, gw = (int(v) for v in grid)
        width = 3 * self.temporal_patch_size * self.patch_size**2
        if tuple(pv.shape) != (gt * gh * gw, width) or gh % self.merge_size or gw % self.merge_size:
            raise ValueError(
                f"video_frames features: pixel_values_videos {tuple(pv.shape)} does not fit grid {(gt, gh, gw)} (patch width {width})"
            )
        return gt, gh, gw

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Tokens (and encoder output rows) of one clip: ``gt * (gh / M) * (gw / M)`` from its
        ``video_grid_thw``, the same value as :meth:`tokens_for` of its length, rate and size.

        Raises:
            ValueError: if the features are not those :meth:`preprocess` makes.
        """
        t, h, w = self.grid(features)
        return t * h * w

    def grid(self, features: dict[str, Any]) -> tuple[int, int, int]:
        """The layout ``(t, h, w)`` of the clip's output tokens after the merge: ``(gt, gh / M, gw / M)``;
        token ``i`` sits at ``t = i // (h * w)``, row ``(i // w) % h``, column ``i % w``
        (``t * h * w == num_tokens``). For 3-D (mRoPE) positions."""
        gt, gh, gw = self._check(features)
        return gt, gh // self.merge_size, gw // self.merge_size

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Concatenate clips in order: ``pixel_values_videos`` ``[sum gt*gh*gw, 3*tp*P*P]``,
        ``video_grid_thw`` int64 ``[B, 3]``, ``second_per_grid_ts`` float32 ``[B]``.

        Raises:
            ValueError: if ``items`` is empty or an item's features are invalid (its index named).
        """
        if not items:
            raise ValueError("video_frames collate needs at least one item")
        for i, item in enumerate(items):
            try:
                self._check(item)
            except ValueError as exc:
                raise ValueError(f"item {i}: {exc}") from None
        return {
            "pixel_values_videos": torch.cat([item["pixel_values_videos"] for item in items]),
            "video_grid_thw": torch.stack([item["video_grid_thw"] for item in items]),
            "second_per_grid_ts": torch.stack(
                [torch.as_tensor(item.get("second_per_grid_ts", 0.0), dtype=torch.float32) for item in items]
            ),
        }


class VideoFramesImageProcessor(VideoFramesProcessor):
    """The :class:`omnicore.components.Processor` of ``encoder/video_frames_image``: a still image
    as a clip of ``tp`` copies of itself (one tubelet), as Qwen2-VL's image processor tiles an image
    in time, so that the one tower encodes images and video (``model.encoders.video.share: image``).

    Features keep the video names (``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts``
    = 0): the shared module takes batches of either processor unchanged. ``grid`` is ``(1, h, w)``.
    """

    modality = "image"

    @classmethod
    def for_config(cls, config: Any, options: VideoEncoderOptions) -> VideoFramesImageProcessor:
        """The image processor of a tower with ``config`` (``image_size`` as the frame size)."""
        return cls(
            patch_size=int(config.patch_size),
            merge_size=int(config.spatial_merge_size),
            temporal_patch_size=int(config.temporal_patch_size),
            fps=1.0,
            max_frames=int(config.temporal_patch_size),
            frame_size=options.image_size,
        )

    def preprocess(self, media: Any) -> dict[str, torch.Tensor]:
        """One ``PIL.Image.Image`` (any mode; converted to RGB) to one tubelet of patches.

        Returns:
            ``pixel_values_videos`` float32 ``[gh * gw, 3 * tp * P * P]``, ``video_grid_thw`` int64
            ``[3]`` = ``(1, gh, gw)``, ``second_per_grid_ts`` 0.

        Raises:
            TypeError: if ``media`` is not a PIL image.
        """
        from PIL import Image

        if not isinstance(media, Image.Image):
            raise TypeError(f"video_frames_image preprocess expects a PIL image (omnicore.api.load_image), got {type(media).__name__}")
        frame = np.asarray(media.convert("RGB"), dtype=np.uint8)
        out_h, out_w = output_size(frame.shape[0], frame.shape[1], self.frame_size, self.factor)
        x = self._normalise(resize_frames(frame[None], out_h, out_w))
        patches, grid = self.patchify(np.repeat(x, self.temporal_patch_size, axis=0))
        return {
            "pixel_values_videos": torch.from_numpy(patches),
            "video_grid_thw": torch.tensor(grid, dtype=torch.long),
            "second_per_grid_ts": torch.tensor(0.0),
        }


def build_image_processor(options: dict[str, Any]) -> VideoFramesImageProcessor:
    """The processor factory of ``encoder/video_frames_image`` (see :func:`build_processor`)."""
    opts = VideoEncoderOptions.model_validate(dict(options))
    return VideoFramesImageProcessor.for_config(read_vision_config(opts), opts)


def resize_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 ``[m, h, w, 3]`` to ``[m, height, width, 3]`` with Pillow's bicubic filter (unchanged
    when already that size)."""
    if frames.shape[1:3] == (height, width):
        return frames
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.Resampling.BICUBIC)) for f in frames])


def build_processor(options: dict[str, Any]) -> VideoFramesProcessor:
    """The processor factory of ``encoder/video_frames`` (``ComponentSpec.processor``): options to a
    :class:`VideoFramesProcessor`, reading at most the checkpoint's ``config.json`` (a full Qwen2-VL
    config gives its ``vision_config``).

    Raises:
        ValueError: if the checkpoint folder has no readable Qwen2-VL ``config.json``, or
            ``frame_size`` does not fit the patch sizes.
        pydantic.ValidationError: if the options are invalid.
    """
    opts = VideoEncoderOptions.model_validate(dict(options))
    return VideoFramesProcessor.for_config(read_vision_config(opts), opts)


def read_vision_config(opts: VideoEncoderOptions) -> Any:
    """The ``Qwen2VLVisionConfig`` of the options: from ``config``, or the checkpoint's ``config.json``.

    Raises:
        ValueError: naming the folder, if it has no ``config.json`` or it is no Qwen2-VL config.
    """
    from transformers import Qwen2VLVisionConfig

    if not opts.checkpoint:
        return Qwen2VLVisionConfig(**opts.config)
    folder = Path(opts.checkpoint).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"video_frames: {folder} has no config.json; point `checkpoint` at a Qwen2-VL vision tower or Qwen2-VL folder")
    try:
        return Qwen2VLVisionConfig.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ValueError(f"video_frames: cannot read {folder / 'config.json'} as a Qwen2-VL vision config: {exc}") from exc
