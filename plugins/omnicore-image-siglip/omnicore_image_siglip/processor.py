"""The data side of ``encoder/siglip``: options, pixel features, token counts and batching.

Imports no model code (transformers' ``SiglipImageProcessorPil`` and ``SiglipVisionConfig`` only,
lazily), so data workers build :class:`SiglipImageProcessor` with :func:`build_processor` from the
options alone: a checkpoint folder's ``config.json`` and ``preprocessor_config.json`` are read,
never its weights. :class:`omnicore_image_siglip.encoder.SiglipImageEncoder` holds the same
processor and delegates to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from omnicore_image_siglip.augment import AugmentOptions

PREPROCESSOR_FILE = "preprocessor_config.json"
"""The image processor's settings in a checkpoint folder (mean, std, resampling)."""


class SiglipEncoderOptions(BaseModel):
    """Options of encoder ``siglip`` (the ``options`` mapping in config). Exactly one of
    ``checkpoint`` and ``config`` must be set.

    Example (a tiny tower for 28 x 28 MNIST digits: 16 tokens per image)::

        encoders:
          image:
            name: siglip
            options:
              config: {image_size: 28, patch_size: 7, hidden_size: 64, num_hidden_layers: 2,
                       num_attention_heads: 4, intermediate_size: 128}
    """

    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = Field(
        default=None,
        description=(
            "Local folder to load from: one written by this encoder's save_pretrained (projector restored), "
            "by transformers' SiglipVisionModel.save_pretrained, or by SiglipModel.save_pretrained (its vision "
            "tower is taken; the projector starts fresh). Nothing is downloaded."
        ),
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "transformers.SiglipVisionConfig keyword arguments for a randomly initialised tower (used when "
            "`checkpoint` is unset): image_size (pixels, S), patch_size (pixels, P), hidden_size (tower width D), "
            "num_hidden_layers, num_attention_heads, intermediate_size, num_channels (must be 3). "
            "Each image gives (image_size // patch_size) ** 2 tokens."
        ),
    )
    freeze: bool = Field(
        default=False,
        description=("Freeze the vision tower (requires_grad=False, run without autograd); the projector always trains."),
    )
    merge: int = Field(
        default=1,
        ge=1,
        description=(
            "merge each m x m block of neighbouring patch tokens into one token before the projector (its input "
            "is m*m*D wide), as Qwen2-VL's patch merger does: (image_size // patch_size // merge) ** 2 tokens "
            "per image; image_size // patch_size must be a multiple of merge"
        ),
    )
    augment: AugmentOptions = Field(
        default_factory=AugmentOptions,
        description=(
            "random shift / rotate / scale of each image while the encoder trains (never in eval, validation "
            "or generation), e.g. {shift: 0.1, rotate: 10, scale: 0.1}; off by default"
        ),
    )

    @field_validator("config")
    @classmethod
    def _known_config_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        import difflib

        from transformers import SiglipVisionConfig

        valid = set(SiglipVisionConfig().to_dict()) - {"transformers_version", "model_type", "architectures"}
        for key in value:
            if key not in valid:
                close = difflib.get_close_matches(key, sorted(valid), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown SiglipVisionConfig key {key!r}{hint}")
        if value.get("num_channels", 3) != 3:
            raise ValueError("num_channels must be 3: the SigLIP image processor yields RGB (greyscale is converted)")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> SiglipEncoderOptions:
        if self.checkpoint and self.config:
            raise ValueError(
                "set either `checkpoint` (load a tower) or `config` (build one from scratch), not both; "
                "a checkpoint's architecture comes from its own config.json"
            )
        if not self.checkpoint and not self.config:
            raise ValueError(
                "set `checkpoint` (a local SigLIP folder) or `config` (SiglipVisionConfig kwargs such as "
                "image_size, patch_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size)"
            )
        return self


class SiglipImageProcessor:
    """The :class:`omnicore.components.Processor` of ``encoder/siglip`` (picklable, no weights).

    Attributes:
        modality: ``"image"``.
        image_processor: ``transformers.SiglipImageProcessorPil`` resizing to ``S x S``.
        image_size: ``S``, pixels; patch_size: ``P``, pixels; merge: ``m``, patch tokens merged per side.
        tokens_per_image: ``N = (S // P // m) ** 2``.

    Build it with :func:`build_processor`, or from a tower's config with :meth:`for_config`.
    """

    modality = "image"

    def __init__(self, image_size: int, patch_size: int, image_processor: Any = None, merge: int = 1) -> None:
        """Args:
            image_size: ``S`` in pixels; patch_size: ``P`` in pixels (``P <= S``).
            merge: ``m``: each ``m x m`` block of patch tokens becomes one token (``S // P`` must be
                a multiple of ``m``).
            image_processor: a ``SiglipImageProcessorPil`` to reuse (its mean, std, resampling); its
                target size is always set to ``S``. None: SigLIP's defaults (bicubic, rescale by
                1/255, mean = std = 0.5 per channel, i.e. pixels map to [-1, 1]).

        Raises:
            ValueError: if ``patch_size`` > ``image_size``, or the patch grid ``S // P`` is not a
                multiple of ``merge``.
        """
        from transformers import SiglipImageProcessorPil

        if patch_size > image_size:
            raise ValueError(f"patch_size {patch_size} is larger than image_size {image_size}")
        side = int(image_size) // int(patch_size)
        if merge < 1 or side % merge:
            raise ValueError(
                f"merge {merge}: the patch grid is {side} x {side} (image_size {image_size} // patch_size {patch_size}), "
                "not a multiple of merge; change merge, image_size or patch_size"
            )
        self.image_size = int(image_size)
        self.patch_size = int(patch_size)
        self.merge = int(merge)
        self.tokens_per_image = (side // self.merge) ** 2
        size = {"height": self.image_size, "width": self.image_size}
        if image_processor is None:
            image_processor = SiglipImageProcessorPil(size=size)
        else:
            skip = ("image_processor_type", "processor_class", "size", "do_resize", "do_convert_rgb")
            kwargs = {k: v for k, v in image_processor.to_dict().items() if k not in skip}
            image_processor = SiglipImageProcessorPil(**kwargs, size=size, do_resize=True, do_convert_rgb=True)
        self.image_processor = image_processor

    @classmethod
    def for_config(cls, config: Any, folder: Path | None = None, merge: int = 1) -> SiglipImageProcessor:
        """The processor of a tower with ``config`` (a ``SiglipVisionConfig``) and ``merge``, with the
        image processor settings of ``folder/preprocessor_config.json`` when that file exists."""
        base = None
        if folder is not None and (folder / PREPROCESSOR_FILE).is_file():
            from transformers import SiglipImageProcessorPil

            base = SiglipImageProcessorPil.from_pretrained(str(folder))
        return cls(int(config.image_size), int(config.patch_size), base, merge)

    def preprocess(self, media: Any) -> dict[str, torch.Tensor]:
        """One ``PIL.Image.Image`` (any size and mode) to ``{"pixel_values": float32 [3, S, S]}``.

        Greyscale, palette and other non-RGB modes are converted to RGB (RGBA is composited by the
        processor); the image is resized to ``S x S`` (no crop, aspect ratio not kept) with the
        processor's resampling (bicubic for SigLIP), rescaled by ``1/255`` and normalised as
        ``(x - mean) / std`` per channel (SigLIP: 0.5 and 0.5, giving values in [-1, 1]).

        Raises:
            TypeError: if ``media`` is not a PIL image.
        """
        from PIL import Image

        if not isinstance(media, Image.Image):
            raise TypeError(f"siglip encoder preprocess expects a PIL.Image.Image, got {type(media).__name__}")
        if media.mode not in ("RGB", "RGBA"):
            media = media.convert("RGB")
        out = self.image_processor(images=media, return_tensors="pt")
        return {"pixel_values": out["pixel_values"][0].to(torch.float32)}

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Tokens (and output rows) of one image: ``(image_size // patch_size // merge) ** 2``.

        This is the one formula shared by the data side (placeholder tokens) and the model (rows of
        :meth:`forward`): every image is resized to ``S x S`` and the tower's stride-``P`` patch
        convolution yields ``(S // P) ** 2`` patch tokens (SigLIP has no class token), e.g. 16 for
        ``S = 28, P = 7``; with ``merge`` ``m`` each ``m x m`` block of them is one token (16 for
        ``S = 32, P = 4, m = 2``).

        Raises:
            ValueError: if ``features["pixel_values"]`` is not ``[3, S, S]``.
        """
        pv = features.get("pixel_values") if isinstance(features, dict) else None
        if pv is None or tuple(pv.shape) != (3, self.image_size, self.image_size):
            shape = None if pv is None else tuple(pv.shape)
            raise ValueError(f"siglip features must hold pixel_values of shape (3, {self.image_size}, {self.image_size}), got {shape}")
        return self.tokens_per_image

    def grid(self, features: dict[str, Any]) -> tuple[int, int, int]:
        """The ``(t, h, w)`` layout of one image's tokens in the foundation: ``(1, S // P, S // P)``,
        the patch grid in raster order (what an mRoPE foundation's positions follow; see
        ``omnicore.data.positions``).

        Raises:
            ValueError: as :meth:`num_tokens`.
        """
        self.num_tokens(features)
        side = self.image_size // self.patch_size // self.merge
        return (1, side, side)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack per-image features (in order): ``{"pixel_values": float32 [B, 3, S, S]}``.

        Raises:
            ValueError: if ``items`` is empty or an item's pixel_values are not ``[3, S, S]``.
        """
        if not items:
            raise ValueError("siglip collate needs at least one item")
        for i, item in enumerate(items):
            try:
                self.num_tokens(item)
            except ValueError as exc:
                raise ValueError(f"item {i}: {exc}") from None
        return {"pixel_values": torch.stack([item["pixel_values"] for item in items])}


def build_processor(options: dict[str, Any]) -> SiglipImageProcessor:
    """The processor factory of ``encoder/siglip`` (``ComponentSpec.processor``): options to a
    :class:`SiglipImageProcessor`, reading at most the checkpoint's ``config.json`` and
    ``preprocessor_config.json`` (a full ``SiglipModel``'s config gives its vision config).

    Raises:
        ValueError: if the checkpoint folder has no readable SigLIP ``config.json``, or
            ``patch_size`` > ``image_size``.
        pydantic.ValidationError: if the options are invalid.
    """
    from transformers import SiglipVisionConfig

    opts = SiglipEncoderOptions.model_validate(dict(options))
    if not opts.checkpoint:
        return SiglipImageProcessor.for_config(SiglipVisionConfig(**opts.config), merge=opts.merge)
    folder = Path(opts.checkpoint).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"SigLIP: {folder} has no config.json; point `checkpoint` at a SigLIP folder (SiglipVisionModel or SiglipModel)")
    try:
        config = SiglipVisionConfig.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ValueError(f"SigLIP: cannot read {folder / 'config.json'} as a SigLIP config: {exc}") from exc
    return SiglipImageProcessor.for_config(config, folder, opts.merge)
