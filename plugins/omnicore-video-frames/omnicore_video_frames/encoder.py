"""The ``video_frames`` video encoder: a Qwen2-VL vision tower over 2-frame tubelets plus a Linear
projector to the foundation's hidden size.

Sources:
    * Qwen2-VL: Wang et al. 2024, "Qwen2-VL: Enhancing Vision-Language Model's Perception of the
      World at Any Resolution" (arXiv:2409.12191). The tower is transformers'
      ``Qwen2VisionTransformerPretrainedModel`` (``Qwen2VLForConditionalGeneration.model.visual``): a
      ``Conv3d`` embeds each tubelet of ``tp = 2`` frames x ``P x P`` pixels, ViT blocks with 2-D
      rotary positions attend within each tubelet step (transformers' ``cu_seqlens`` per ``t``),
      and its ``PatchMerger`` joins each ``M x M`` block of patches (an MLP on the concatenation)
      into one token of width ``hidden_size``. Time enters through the tubelets and through the
      foundation's positions (the core's mRoPE reads :meth:`VideoFramesProcessor.grid`).
    * Projector: one ``nn.Linear(hidden_size, H)`` (Qwen2-VL's merger already is a 2-layer MLP).

Data flow (``B`` clips, clip ``b`` with patch grid ``(gt_b, gh_b, gw_b)``, ``N_b = gt_b * gh_b * gw_b``
patches and ``N_b / M**2`` tokens; ``D`` = tower width ``embed_dim``; ``E`` = merger width
``hidden_size``; ``H`` = the foundation's hidden size)::

    Video --preprocess--> pixel_values_videos [N_b, 3 * tp * P * P], video_grid_thw [3]
    collate: [sum N_b, 3 * tp * P * P] + grid [B, 3] --tower--> pooler_output [sum N_b / M**2, E]
    --projector--> [sum N_b / M**2, H], rows of clip b after those of clips 0 .. b-1

Checkpoint folders (``options["checkpoint"]``) may be:
    * a folder written by :meth:`VideoFramesEncoder.save_pretrained` (tower and
      ``omnicore_extra.safetensors`` with the projector; the projector is restored);
    * a folder written by ``Qwen2VisionTransformerPretrainedModel.save_pretrained`` (tower only);
    * a full Qwen2-VL folder (``Qwen2VLForConditionalGeneration.save_pretrained``): its
      ``vision_config`` and its ``model.visual.*`` (or older ``visual.*``) tensors are taken.
    The tower is read by :func:`omnicore.api.load_hf_pretrained` (transformers' ``from_pretrained``,
    strict). Without ``omnicore_extra.safetensors`` the projector is freshly initialised.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnicore.api import item_generators, load_extra_weights, load_hf_pretrained, save_extra_weights
from omnicore_video_frames.augment import augment_clips
from omnicore_video_frames.processor import VideoEncoderOptions, VideoFramesProcessor, read_vision_config

__all__ = ["VideoEncoderOptions", "VideoFramesEncoder", "VideoFramesProcessor", "build"]

logger = logging.getLogger(__name__)

COMPONENT = "encoder/video_frames"
"""The component name recorded with the projector in ``omnicore_extra.safetensors``."""

_PREFIXES = ("model.visual.", "visual.")
"""Where a full Qwen2-VL checkpoint keeps the tower (transformers 5 / earlier layouts)."""

_WHAT_TO_PUT = (
    "point `checkpoint` at a folder written by this encoder's save_pretrained, by transformers' "
    "Qwen2VisionTransformerPretrainedModel.save_pretrained or by Qwen2VLForConditionalGeneration.save_pretrained "
    "(config.json and model.safetensors), or leave `checkpoint` unset and give `config` to build a tower from scratch"
)


def build_image(options: dict[str, Any] | VideoEncoderOptions, *, hidden_size: int) -> VideoFramesEncoder:
    """Factory of encoder ``video_frames_image``: the module of :func:`build` holding the image
    processor (:class:`~omnicore_video_frames.processor.VideoFramesImageProcessor`, each image one
    tubelet), with ``modality`` ``"image"`` and ``modalities`` ``("image", "video")``: configure
    ``model.encoders.video: {name: video_frames, share: image, options: ...}`` (the same tower
    ``config``, plus the clip options) and one tower learns from images and clips alike.

    Raises:
        as :func:`build`; also ValueError if ``image_size`` does not fit the patch sizes.
    """
    from omnicore_video_frames.processor import VideoFramesImageProcessor

    opts = options if isinstance(options, VideoEncoderOptions) else VideoEncoderOptions.model_validate(dict(options))
    enc = build(opts, hidden_size=hidden_size)
    enc.modality = "image"
    enc.modalities = ("image", "video")
    enc.processor = VideoFramesImageProcessor.for_config(enc.tower.config, opts)
    return enc


def build(options: dict[str, Any] | VideoEncoderOptions, *, hidden_size: int) -> VideoFramesEncoder:
    """Factory of encoder ``video_frames`` (``target`` of its ComponentSpec).

    Args:
        options: a dict validated by :class:`VideoEncoderOptions` (or an instance of it).
        hidden_size: ``H``, the foundation's hidden size the projector maps to.

    Returns:
        a :class:`VideoFramesEncoder` on CPU, float32, in training mode.

    Raises:
        pydantic.ValidationError (a ValueError): if the options are invalid.
        ValueError: if ``frame_size`` does not fit the patch sizes, or ``checkpoint`` is not a
            folder with a Qwen2-VL ``config.json`` and the tower's weights, or its
            ``omnicore_extra.safetensors`` holds a projector of other shapes (file and shapes named).
    """
    opts = options if isinstance(options, VideoEncoderOptions) else VideoEncoderOptions.model_validate(dict(options))
    if opts.checkpoint:
        return VideoFramesEncoder.from_checkpoint(opts, hidden_size=hidden_size)
    return VideoFramesEncoder.from_config(opts, hidden_size=hidden_size)


class VideoFramesEncoder(nn.Module):
    """Qwen2-VL vision tower + Linear projector, implementing :class:`omnicore.components.Encoder`.

    Attributes:
        modality: ``"video"``.
        tower: ``transformers``' ``Qwen2VisionTransformerPretrainedModel``.
        projector: ``nn.Linear(E, H)``.
        processor: the data side (:class:`~omnicore_video_frames.processor.VideoFramesProcessor`),
            the same one ``build_processor`` makes from the same options.
        hidden_size: ``H``; frozen: whether the tower is frozen.
    """

    modality = "video"
    modalities: tuple[str, ...] = ("video",)
    """What this module encodes: ``("image", "video")`` when built as ``video_frames_image``
    (:func:`build_image`), so that ``model.encoders.video.share: image`` sends clips here too."""

    def __init__(self, tower: Any, *, hidden_size: int, options: VideoEncoderOptions) -> None:
        """Wrap a tower and add a freshly initialised projector; ``options`` give the processor's
        sampling and size settings and ``freeze``.

        Raises:
            ValueError: if ``hidden_size`` < 1, the tower's ``in_channels`` is not 3, or
                ``frame_size`` does not fit the tower's patch sizes.
        """
        super().__init__()
        if int(hidden_size) < 1:
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        if tower.config.in_channels != 3:
            raise ValueError(f"in_channels must be 3 (frames are RGB), got {tower.config.in_channels}")
        self.hidden_size = int(hidden_size)
        self.tower = tower
        self.projector = nn.Linear(int(tower.config.hidden_size), self.hidden_size)
        self.processor = VideoFramesProcessor.for_config(tower.config, options)
        self.frozen = False
        self.augment = options.augment
        """Random shifts and reversals per clip in training mode (:mod:`omnicore_video_frames.augment`)."""
        self.image_augment = options.image_augment or options.augment
        """The same for still images (items with ``second_per_grid_ts`` 0; ``video_frames_image``)."""
        if options.freeze:
            self.freeze_tower()

    # ---- building and loading ---------------------------------------------------------------

    @classmethod
    def from_config(cls, options: VideoEncoderOptions, *, hidden_size: int) -> VideoFramesEncoder:
        """A randomly initialised tower from ``options.config`` (``Qwen2VLVisionConfig`` kwargs)."""
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

        config = copy.deepcopy(read_vision_config(options))
        return cls(Qwen2VisionTransformerPretrainedModel(config), hidden_size=hidden_size, options=options)

    @classmethod
    def from_checkpoint(cls, options: VideoEncoderOptions, *, hidden_size: int) -> VideoFramesEncoder:
        """Load the tower (and, if present, the projector) from ``options.checkpoint``.

        See the module docstring for the accepted folders. Loading is strict: a tower tensor the
        checkpoint lacks is an error naming it.

        Raises:
            ValueError: naming the folder (or file) and what to put there (see :func:`build`).
        """
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

        folder = Path(options.checkpoint).expanduser()
        read_vision_config(options)  # a clear error for a folder without a Qwen2-VL config.json
        tower = load_hf_pretrained(
            Qwen2VisionTransformerPretrainedModel, folder, prefixes=_PREFIXES, what="Qwen2-VL vision", hint=_WHAT_TO_PUT
        )
        enc = cls(tower, hidden_size=hidden_size, options=options.model_copy(update={"freeze": False}))
        meta = load_extra_weights(folder, enc.projector, component=COMPONENT, required=False)
        logger.info("video_frames: loaded tower from %s; projector %s", folder, "restored" if meta is not None else "freshly initialised")
        enc.train()  # from_pretrained leaves the tower in eval mode; build() returns training mode
        if options.freeze:
            enc.freeze_tower()
        return enc

    def freeze_tower(self) -> None:
        """Freeze the vision tower: no gradients, and :meth:`forward` runs it without autograd."""
        self.tower.requires_grad_(False)
        self.frozen = True

    # ---- the Encoder contract ---------------------------------------------------------------

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Encode a collated batch to ``[sum num_tokens, H]``, clips in order, each clip's tokens in
        the order of :meth:`VideoFramesProcessor.grid` (tubelet, then row, then column).

        The tower's ``pooler_output`` (the merger's output) is projected; inputs are moved to the
        module's device, and the tower casts the patches to its own dtype. In training mode each
        clip is first shifted and reversed at random as ``augment`` says, each still image as
        ``image_augment`` says (none by default).
        """
        device = self.projector.weight.device
        pixels = batch["pixel_values_videos"].to(device)
        grid = batch["video_grid_thw"].to(device).reshape(-1, 3)
        if self.training and (self.augment.active or self.image_augment.active):
            p = self.processor
            still = batch["second_per_grid_ts"].reshape(-1) == 0 if "second_per_grid_ts" in batch else None
            pixels = augment_clips(
                pixels,
                grid,
                self.augment,
                tp=p.temporal_patch_size,
                p=p.patch_size,
                m=p.merge_size,
                still=still,
                still_options=self.image_augment,
                generator=item_generators(batch),  # each clip draws from its own sample's stream
            )
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            merged = self.tower(pixels, grid_thw=grid).pooler_output  # [sum N_b / M**2, E]
        return self.projector(merged)

    def dummy_batch(self) -> dict[str, torch.Tensor]:
        """One all-zero clip of one tubelet and one merge block: grid ``(1, M, M)``, one token, on CPU."""
        p = self.processor
        item = {
            "pixel_values_videos": torch.zeros(p.merge_size**2, 3 * p.temporal_patch_size * p.patch_size**2),
            "video_grid_thw": torch.tensor([1, p.merge_size, p.merge_size]),
            "second_per_grid_ts": torch.tensor(p.temporal_patch_size / p.fps),
        }
        return p.collate([item])

    def save_pretrained(self, path: str | Path) -> None:
        """Write a folder that ``build({"checkpoint": path, ...}, hidden_size=H)`` loads back.

        Files: ``config.json`` + ``model.safetensors`` (the tower, as
        ``Qwen2VisionTransformerPretrainedModel.save_pretrained`` writes it) and
        ``omnicore_extra.safetensors`` (:func:`omnicore.api.save_extra_weights`: the projector's
        ``weight`` ``[H, E]`` and ``bias`` ``[H]``, with ``hidden_size`` and ``merged_width``
        recorded). The sampling options (``fps``, ``max_frames``, ``frame_size``) are data options:
        give them again with ``checkpoint``. Call it on an unsharded module.
        """
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.tower.save_pretrained(str(folder))
        save_extra_weights(
            folder, self.projector, component=COMPONENT, hidden_size=self.hidden_size, merged_width=int(self.projector.in_features)
        )
