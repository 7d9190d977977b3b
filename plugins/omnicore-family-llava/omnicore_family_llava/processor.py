"""The data side of the LLaVA family: options, the checkpoint's own pixel features and the number of
``<image>`` tokens per image.

Imports no model code: :func:`build_processor` reads the checkpoint folder's ``config.json``,
``processor_config.json`` and image processor (``AutoImageProcessor``: ``CLIPImageProcessor``,
``SiglipImageProcessor``, ``LlavaImageProcessor``, whichever the checkpoint names), never its
weights, so data workers build it from the options alone.

Token rule (transformers' ``LlavaProcessor``): an image whose pixel values are ``h x w`` becomes
``(h // patch_size) * (w // patch_size) + num_additional_image_tokens`` placeholders, one fewer
under ``vision_feature_select_strategy: "default"`` (which drops the tower's class token);
``patch_size``, ``num_additional_image_tokens`` (1 for a CLIP tower's class token, 0 for SigLIP) and
the strategy are the processor's own settings (``processor_config.json``). The model gives as many
rows: the tower's ``(S // P) ** 2`` patches plus its class token, less the one dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from omnicore_family_kit.checkpoint import checkpoint_folder as kit_checkpoint_folder
from omnicore_family_kit.options import CheckpointOptions
from omnicore_family_llava.plugin import MODEL_TYPES

IMAGE_TOKEN = "<image>"
WHAT_TO_PUT = (
    "point options.checkpoint at a LLaVA folder as published (llava-hf/llava-1.5-7b-hf, or what "
    "LlavaForConditionalGeneration.save_pretrained and LlavaProcessor.save_pretrained write: config.json, "
    "model.safetensors, tokenizer and processor files)"
)
CLASS_TOKENS = {"clip_vision_model": 1, "siglip_vision_model": 0}
"""Tokens a tower puts before its patches (CLIP's class token; SigLIP has none), per
``vision_config.model_type``: the towers this family takes."""


class LlavaEncoderOptions(CheckpointOptions):
    """Options of ``encoder/llava_encoder``."""

    checkpoint: str = Field(
        description="A published LLaVA folder (config.json of LlavaForConditionalGeneration, its safetensors and processor "
        "files), or a Hub name in the local cache; its vision_tower and multi_modal_projector are loaded"
    )


class LlavaFoundationOptions(CheckpointOptions):
    """Options of ``foundation/llava``: the checkpoint, whose LM, tokenizer and image encoder it brings."""

    checkpoint: str = Field(
        description="A published LLaVA folder (LlavaForConditionalGeneration config.json, safetensors, tokenizer and "
        "processor files), or a Hub name in the local cache (e.g. llava-hf/llava-1.5-7b-hf)"
    )


def checkpoint_folder(checkpoint: str, what: str) -> Path:
    """``checkpoint`` as a LLaVA folder: :func:`omnicore_family_kit.checkpoint.checkpoint_folder` of
    :data:`MODEL_TYPES` (ValueError naming ``what``, ending with :data:`WHAT_TO_PUT`)."""
    return kit_checkpoint_folder(checkpoint, what, MODEL_TYPES, WHAT_TO_PUT)


def image_rows(config: Any) -> int:
    """Rows the model gives per image: the tower's ``(image_size // patch_size) ** 2`` patches, plus
    its class token (CLIP), less one under ``vision_feature_select_strategy: "default"``.

    Args:
        config: the checkpoint's ``LlavaConfig``.

    Raises:
        ValueError: the tower is neither CLIP nor SigLIP (``vision_config.model_type`` named).
    """
    vision = config.vision_config
    kind = getattr(vision, "model_type", None)
    if kind not in CLASS_TOKENS:
        raise ValueError(
            f"config.json: vision_config.model_type {kind!r} is not a LLaVA tower this plugin takes ({', '.join(CLASS_TOKENS)})"
        )
    rows = (int(vision.image_size) // int(vision.patch_size)) ** 2 + CLASS_TOKENS[kind]
    return rows - (1 if config.vision_feature_select_strategy == "default" else 0)


class LlavaImageProcessor:
    """The :class:`omnicore.api.Processor` of the LLaVA encoder (picklable, no weights).

    Args:
        image_processor: the checkpoint's own transformers image processor (unchanged).
        patch_size, num_additional_image_tokens, vision_feature_select_strategy, image_token: the
            checkpoint's ``LlavaProcessor`` settings.

    Attributes:
        modality: ``"image"``; placeholder: the checkpoint's image token (``<image>``); no ``wrap``.
        image_processor, patch_size, num_additional_image_tokens, vision_feature_select_strategy:
            as given.
    """

    modality = "image"
    wrap = None

    def __init__(
        self,
        image_processor: Any,
        *,
        patch_size: int,
        num_additional_image_tokens: int = 0,
        vision_feature_select_strategy: str | None = None,
        image_token: str = IMAGE_TOKEN,
    ) -> None:
        self.image_processor = image_processor
        self.patch_size = int(patch_size)
        self.num_additional_image_tokens = int(num_additional_image_tokens)
        self.vision_feature_select_strategy = vision_feature_select_strategy
        self.placeholder = image_token

    def preprocess(self, media: Any) -> dict[str, torch.Tensor]:
        """One image to the checkpoint's pixel values, as ``LlavaProcessor`` computes them.

        Args:
            media: a ``PIL.Image.Image`` (omnicore's loader gives RGB).

        Returns:
            ``{"pixel_values": float32 [3, h, w]}`` (``h x w``: the image processor's output size,
            the tower's ``image_size`` square for published checkpoints).

        Raises:
            TypeError: ``media`` is not a PIL image.
        """
        from PIL import Image

        if not isinstance(media, Image.Image):
            raise TypeError(f"llava encoder preprocess expects a PIL.Image.Image, got {type(media).__name__}")
        if media.mode != "RGB" and not getattr(self.image_processor, "do_convert_rgb", True):
            media = media.convert("RGB")  # the tower takes 3 channels; a processor set not to convert would give 1
        out = self.image_processor(images=media, return_tensors="pt")
        return {"pixel_values": out["pixel_values"][0].to(torch.float32).contiguous()}

    def num_tokens(self, features: dict[str, Any]) -> int:
        """``<image>`` tokens of one image: ``(h // patch_size) * (w // patch_size) +
        num_additional_image_tokens``, less one under ``"default"`` (``LlavaProcessor``'s rule).

        Raises:
            ValueError: ``features`` holds no ``pixel_values`` of shape ``[3, h, w]``.
        """
        pv = features.get("pixel_values") if isinstance(features, dict) else None
        if pv is None or pv.ndim != 3:
            raise ValueError(f"llava features must hold pixel_values of shape [3, h, w], got {None if pv is None else tuple(pv.shape)}")
        h, w = int(pv.shape[-2]), int(pv.shape[-1])
        n = (h // self.patch_size) * (w // self.patch_size) + self.num_additional_image_tokens
        return n - 1 if self.vision_feature_select_strategy == "default" else n

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack images in order: ``{"pixel_values": float32 [B, 3, h, w]}`` (the model's input name).

        Raises:
            ValueError: ``items`` is empty, or the images' pixel values differ in shape.
        """
        if not items:
            raise ValueError("llava encoder: collate() needs at least one item")
        shapes = {tuple(it["pixel_values"].shape) for it in items}
        if len(shapes) > 1:
            raise ValueError(
                f"llava encoder: images of different pixel shapes {sorted(shapes)} in one batch; the image processor must give one size"
            )
        return {"pixel_values": torch.stack([torch.as_tensor(it["pixel_values"]) for it in items])}


def processor_settings(folder: Path, what: str) -> dict[str, Any]:
    """``LlavaProcessor``'s settings of the checkpoint (``processor_config.json``): ``patch_size``,
    ``num_additional_image_tokens`` (default 0), ``vision_feature_select_strategy`` (default None)
    and ``image_token`` (default ``<image>``), with ``LlavaProcessor``'s defaults.

    Raises:
        ValueError: naming ``what`` when the file is missing or has no ``patch_size`` (which
            ``LlavaProcessor`` needs to count tokens).
    """
    path = folder / "processor_config.json"
    if not path.is_file():
        raise ValueError(f"{what}: {str(folder)!r} has no processor_config.json (LlavaProcessor's settings); {WHAT_TO_PUT}")
    raw = json.loads(path.read_text())
    if raw.get("patch_size") is None:
        raise ValueError(
            f"{what}: {path} has no patch_size, which LlavaProcessor needs to count image tokens; add the tower's "
            '(config.json vision_config.patch_size), e.g. "patch_size": 14, and "vision_feature_select_strategy"'
        )
    return {
        "patch_size": int(raw["patch_size"]),
        "num_additional_image_tokens": int(raw.get("num_additional_image_tokens") or 0),
        "vision_feature_select_strategy": raw.get("vision_feature_select_strategy"),
        "image_token": raw.get("image_token") or IMAGE_TOKEN,
    }


def read_config(folder: Path) -> Any:
    """The checkpoint's ``LlavaConfig`` (``config.json`` only)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder))


def check_agreement(processor: LlavaImageProcessor, config: Any, folder: Path, what: str) -> None:
    """Refuse a processor whose token count for the tower's ``image_size`` square differs from the
    model's rows (:func:`image_rows`): transformers' model would refuse every image too.

    Raises:
        ValueError: naming ``processor_config.json``'s fields and ``config.json``'s values.
    """
    side = int(config.vision_config.image_size)
    want = image_rows(config)
    got = processor.num_tokens({"pixel_values": torch.empty(3, side, side)})
    if got != want:
        raise ValueError(
            f"{what}: {folder / 'processor_config.json'} counts {got} <image> tokens for a {side}x{side} image "
            f"(patch_size {processor.patch_size}, num_additional_image_tokens {processor.num_additional_image_tokens}, "
            f"vision_feature_select_strategy {processor.vision_feature_select_strategy!r}), but the model gives {want} rows "
            f"(config.json: {config.vision_config.model_type} patch_size {config.vision_config.patch_size}, "
            f"vision_feature_select_strategy {config.vision_feature_select_strategy!r}); set num_additional_image_tokens to "
            f"{CLASS_TOKENS[config.vision_config.model_type]} and the strategy to config.json's"
        )


def build_processor(options: dict[str, Any]) -> LlavaImageProcessor:
    """The processor factory of ``encoder/llava_encoder``: reads the checkpoint's ``config.json``,
    ``processor_config.json`` and image processor only.

    Raises:
        ValueError: the folder is not a LLaVA checkpoint, lacks its processor files, or its
            processor counts other tokens than the model gives (:func:`check_agreement`).
        pydantic.ValidationError: unknown option keys or bad values.
    """
    from transformers import AutoImageProcessor

    opts = LlavaEncoderOptions.model_validate(dict(options or {}))
    what = "model.encoders.image.options.checkpoint"
    folder = checkpoint_folder(opts.checkpoint, what)
    settings = processor_settings(folder, what)
    try:
        image_processor = AutoImageProcessor.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what}: cannot read the image processor of {str(folder)!r}: {exc}; {WHAT_TO_PUT}") from exc
    processor = LlavaImageProcessor(image_processor, **settings)
    check_agreement(processor, read_config(folder), folder, what)
    return processor
