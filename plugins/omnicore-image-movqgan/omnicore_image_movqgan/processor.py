"""The data side of ``decoder/movqgan``: options, target pixels, code counts and batching.

Imports no model code (no diffusers), so data workers build :class:`MoVQGANProcessor` with
:func:`build_processor` from the options alone: a checkpoint folder's ``config.json`` and the
metadata of its ``omnicore_extra.safetensors`` are read, never its weights.
:class:`omnicore_image_movqgan.decoder.MoVQGANDecoder` holds the same processor and delegates to it.
The code count is ``(S / f) ** 2`` (see the decoder module).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from omnicore.api import load_extra_weights

COMPONENT = "decoder/movqgan"
"""The component name recorded with the LM adapter in ``omnicore_extra.safetensors``."""
LEGACY_FILES = ("lm_adapter.safetensors", "omnicore_decoder.json")
"""What versions before the shared extra-weights format wrote instead (no longer read)."""

VQ_CONFIG_FILE = "config.json"
DEFAULT_IMAGE_SIZE = 32

DEFAULT_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "block_out_channels": (32, 32, 32),
    "down_block_types": ("DownEncoderBlock2D",) * 3,
    "up_block_types": ("UpDecoderBlock2D",) * 3,
    "layers_per_block": 1,
    "latent_channels": 4,
    "num_vq_embeddings": 256,
    "norm_num_groups": 32,
    "sample_size": 32,
    "mid_block_add_attention": True,
}
"""The tiny from-scratch MoVQ used when ``options.config`` leaves a key out (0.30 M parameters):
32x32 RGB -> 8x8 = 64 codes from a 256-entry codebook of 4-d vectors. Recommended for MNIST-sized
digits: 150 steps of :func:`omnicore_image_movqgan.fit.fit_vq` (batch 32) on 3,000 MNIST digits gave
a held-out reconstruction MSE of 0.020 in [-1, 1] units in 72 s on one busy CPU core (README)."""


class MoVQGANOptions(BaseModel):
    """Options of ``decoder/movqgan`` (validated by the registry before :func:`build` is called).

    Raises:
        pydantic.ValidationError: on unknown keys, or when both ``checkpoint`` and ``config`` are given.
    """

    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = Field(
        None,
        description=(
            "Local folder holding a diffusers VQModel (config.json + diffusion_pytorch_model.safetensors), "
            "e.g. the 'movq' subfolder of Kandinsky 2.2, or a folder written by MoVQGANDecoder.save_pretrained "
            "(then the LM adapter is restored too). None: build a tiny model from 'config'."
        ),
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "VQModel keyword arguments for a from-scratch model; missing keys come from DEFAULT_CONFIG, "
            "down/up_block_types follow len(block_out_channels) when not given, norm_type is forced to 'spatial'."
        ),
    )
    image_size: int | None = Field(
        None,
        ge=1,
        description=(
            "Side S in pixels of the square RGB image targets are resized to; must be a multiple of the "
            "downsample factor. None: the value saved with the checkpoint's LM adapter (omnicore_extra.safetensors), "
            "else the checkpoint VQModel's sample_size, else 32."
        ),
    )
    freeze_vq: bool = Field(
        True,
        description=("Keep the VQ autoencoder frozen (a fixed tokenizer during LM training); only the code embedding and the head train."),
    )

    @model_validator(mode="after")
    def _one_source(self) -> MoVQGANOptions:
        if self.checkpoint is not None and self.config:
            raise ValueError("give either 'checkpoint' (a folder to load) or 'config' (a model to build), not both")
        return self


def make_vq_config(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Complete user ``config`` into ``VQModel`` kwargs for a MoVQ (``norm_type="spatial"``).

    Missing keys come from :data:`DEFAULT_CONFIG`; when ``block_out_channels`` is given without block
    types, plain ``DownEncoderBlock2D``/``UpDecoderBlock2D`` are used, one per level.

    Raises:
        ValueError: if ``norm_type`` is set to something other than ``"spatial"``; if the block lists
            differ in length; if a channel count is not a multiple of 32 (diffusers' ``SpatialNorm``
            uses 32 groups) or of ``norm_num_groups``; if ``vq_embed_dim`` differs from
            ``latent_channels`` (the spatial norm is conditioned on the codebook vectors with
            ``latent_channels`` inputs); if ``in_channels``/``out_channels`` are not 3 (RGB).
    """
    user = dict(config or {})
    if user.get("norm_type", "spatial") != "spatial":
        raise ValueError(f"MoVQGAN needs norm_type='spatial' (MoVQ's spatially conditioned norm); got {user['norm_type']!r}")
    cfg = dict(DEFAULT_CONFIG)
    if "block_out_channels" in user:
        n = len(user["block_out_channels"])
        cfg["down_block_types"] = ("DownEncoderBlock2D",) * n
        cfg["up_block_types"] = ("UpDecoderBlock2D",) * n
    cfg.update(user)
    cfg["norm_type"] = "spatial"
    boc = tuple(int(c) for c in cfg["block_out_channels"])
    cfg["block_out_channels"] = boc
    cfg["down_block_types"] = tuple(cfg["down_block_types"])
    cfg["up_block_types"] = tuple(cfg["up_block_types"])
    if not (len(boc) == len(cfg["down_block_types"]) == len(cfg["up_block_types"])) or not boc:
        raise ValueError(
            f"block_out_channels {boc}, down_block_types {cfg['down_block_types']} and up_block_types "
            f"{cfg['up_block_types']} must be non-empty and of equal length"
        )
    groups = int(cfg["norm_num_groups"])
    for c in boc:
        if c % 32 or c % groups:
            raise ValueError(f"block_out_channels {boc}: every entry must be a multiple of 32 and of norm_num_groups={groups}")
    if cfg.get("vq_embed_dim") not in (None, cfg["latent_channels"]):
        raise ValueError(f"vq_embed_dim={cfg['vq_embed_dim']} must equal latent_channels={cfg['latent_channels']} with norm_type='spatial'")
    if cfg["in_channels"] != 3 or cfg["out_channels"] != 3:
        raise ValueError(f"MoVQGAN works on RGB: in_channels and out_channels must be 3, got {cfg['in_channels']}, {cfg['out_channels']}")
    return cfg


def downsample_factor(vq_config: Any) -> int:
    """``2 ** (len(block_out_channels) - 1)``: pixels per code along each side."""
    return 2 ** (len(vq_config["block_out_channels"] if isinstance(vq_config, dict) else vq_config.block_out_channels) - 1)


class MoVQGANProcessor:
    """The :class:`omnicore.components.Processor` of ``decoder/movqgan`` (picklable, no weights).

    Attributes:
        modality: ``"image"``.
        image_size: S, the square side targets are resized to.
        downsample_factor: f, pixels per code along each side (S is a multiple of f).

    Raises:
        ValueError: if S is not a multiple of f.
    """

    modality = "image"

    def __init__(self, image_size: int, downsample_factor: int) -> None:
        self.image_size = int(image_size)
        self.downsample_factor = int(downsample_factor)
        if self.image_size % self.downsample_factor:
            raise ValueError(f"image_size {self.image_size} must be a multiple of the downsample factor {self.downsample_factor}")

    def preprocess(self, media: Any) -> dict[str, torch.Tensor]:
        """One ``PIL.Image`` -> ``{"pixel_values": float32 [3, S, S] in [-1, 1]}``.

        The image is converted to RGB and resized (bicubic, aspect ratio not kept) to S x S.

        Raises:
            TypeError: if ``media`` is not a ``PIL.Image.Image``.
        """
        from PIL import Image

        if not isinstance(media, Image.Image):
            raise TypeError(f"MoVQGAN preprocess expects a PIL.Image.Image, got {type(media).__name__}")
        img = media.convert("RGB")
        if img.size != (self.image_size, self.image_size):
            img = img.resize((self.image_size, self.image_size), Image.BICUBIC)
        arr = np.asarray(img, dtype=np.float32) / 127.5 - 1.0
        return {"pixel_values": torch.from_numpy(arr).permute(2, 0, 1).contiguous()}

    def num_tokens(self, features: dict[str, Any]) -> int:
        """``(h / f) * (w / f)`` for ``pixel_values`` of ``[3, h, w]`` (``(S / f) ** 2`` after preprocess).

        Raises:
            ValueError: if h or w is not a multiple of f.
        """
        h, w = features["pixel_values"].shape[-2:]
        f = self.downsample_factor
        if h % f or w % f:
            raise ValueError(f"image of {h}x{w} pixels is not a multiple of the downsample factor {f}")
        return (h // f) * (w // f)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack per-item features: ``{"pixel_values": [B, 3, S, S]}``.

        Raises:
            ValueError: on an empty list.
        """
        if not items:
            raise ValueError("MoVQGAN collate got no items")
        return {"pixel_values": torch.stack([it["pixel_values"] for it in items])}


def build_processor(options: dict[str, Any]) -> MoVQGANProcessor:
    """The processor factory of ``decoder/movqgan`` (``ComponentSpec.processor``): options to a
    :class:`MoVQGANProcessor`. The image size is resolved as the decoder's factory does:
    ``options.image_size``, else the one saved with the checkpoint's LM adapter, else the
    checkpoint VQModel's ``sample_size``, else :data:`DEFAULT_IMAGE_SIZE`.

    Raises:
        ValueError: if the checkpoint folder has no readable ``config.json``, its adapter file is
            not omnicore's, the config is invalid (:func:`make_vq_config`), or the image size is not
            a multiple of the downsample factor.
        pydantic.ValidationError: on invalid options.
    """
    opts = MoVQGANOptions.model_validate(dict(options or {}))
    if opts.checkpoint is None:
        return MoVQGANProcessor(opts.image_size or DEFAULT_IMAGE_SIZE, downsample_factor(make_vq_config(opts.config)))
    folder = Path(opts.checkpoint).expanduser()
    file = folder / VQ_CONFIG_FILE
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"MoVQGAN: cannot read {file} (options.checkpoint must be a diffusers VQModel folder): {exc}") from exc
    image_size = opts.image_size
    if image_size is None:
        meta = load_extra_weights(folder, None, component=COMPONENT, required=False, legacy_files=LEGACY_FILES)
        sample_size = config.get("sample_size")
        image_size = (meta or {}).get("image_size") or (sample_size if isinstance(sample_size, int) else None)
    return MoVQGANProcessor(image_size or DEFAULT_IMAGE_SIZE, downsample_factor(config))
