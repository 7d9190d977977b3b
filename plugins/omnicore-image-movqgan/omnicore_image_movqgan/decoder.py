"""The MoVQGAN image decoder: a discrete image tokenizer for generation, on diffusers' ``VQModel``.

MoVQ (Zheng et al. 2022, "MoVQ: Modulating Quantized Vectors for High-Fidelity Image Generation",
https://arxiv.org/abs/2209.09002) is a VQGAN whose decoder normalisation layers are *spatially
conditioned* on the quantised latents: each ``GroupNorm`` output is scaled and shifted per pixel by
1x1 convolutions of the (nearest-upsampled) code vectors. diffusers implements it as
``VQModel(norm_type="spatial")`` (``SpatialNorm`` in ``diffusers.models.attention_processor``), and
published MoVQ weights in diffusers format (for example the ``movq`` subfolder of
``kandinsky-community/kandinsky-2-2-decoder``) load with ``VQModel.from_pretrained(folder)``.

Data flow (S = ``image_size``, f = downsample factor, g = S / f, C = ``num_vq_embeddings``,
D = ``vq_embed_dim`` = ``latent_channels``, H = the foundation's hidden size):

* :meth:`MoVQGANDecoder.preprocess`: ``PIL.Image`` -> RGB, resized to S x S ->
  ``pixel_values`` float32 ``[3, S, S]`` in [-1, 1];
* :meth:`MoVQGANDecoder.encode`: ``[B, 3, S, S]`` -> encoder -> ``quant_conv`` -> nearest codebook
  entry (diffusers' own ``VectorQuantizer``) -> LongTensor ``[B * g * g]``, row-major per image;
* :meth:`MoVQGANDecoder.embed` / :meth:`MoVQGANDecoder.head`: the trainable LM adapter
  (``nn.Embedding(C, H)`` and ``nn.Linear(H, C)``);
* :meth:`MoVQGANDecoder.decode`: ``[g * g]`` codes -> codebook vectors ``[1, D, g, g]`` ->
  ``post_quant_conv`` -> decoder with spatial norm conditioned on the codebook vectors -> uint8 RGB
  ``PIL.Image`` of S x S.

The one formula shared by the data side and the model: ``num_tokens = (S / f) ** 2`` with
``f = 2 ** (len(block_out_channels) - 1)`` (diffusers' ``Encoder`` downsamples by 2 after every block
but the last).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnicore.api import CodebookDecoder, load_extra_weights, load_hf_pretrained
from omnicore_image_movqgan.processor import (
    COMPONENT,
    DEFAULT_CONFIG,
    DEFAULT_IMAGE_SIZE,
    LEGACY_FILES,
    VQ_CONFIG_FILE,
    MoVQGANOptions,
    MoVQGANProcessor,
    downsample_factor,
    make_vq_config,
)

__all__ = ["DEFAULT_CONFIG", "MoVQGANDecoder", "MoVQGANOptions", "MoVQGANProcessor", "build", "make_vq_config"]


class MoVQGANDecoder(CodebookDecoder):
    """omnicore :class:`~omnicore.api.Decoder` for images around a diffusers MoVQ ``VQModel``
    (a :class:`~omnicore.api.CodebookDecoder`: the LM adapter, freezing and saving are the base's).

    Args:
        vq: a ``diffusers.VQModel`` with ``norm_type="spatial"``, RGB in and out.
        hidden_size: H, the foundation's hidden size.
        image_size: S, the square side targets are resized to (a multiple of the downsample factor).
        freeze_vq: freeze the VQ autoencoder (``requires_grad=False``, kept in eval mode).

    Attributes:
        modality: ``"image"``.
        codebook_size: C, ``vq.config.num_vq_embeddings``.
        downsample_factor: f; ``grid_size`` = S / f; ``num_image_tokens`` = (S / f) ** 2.
        processor: the data side (:class:`~omnicore_image_movqgan.processor.MoVQGANProcessor`),
            the same one ``build_processor`` makes from the same options.
        vq: the wrapped ``VQModel``; ``code_embed`` (``nn.Embedding(C, H)``), ``lm_head``
            (``nn.Linear(H, C)``): the LM adapter.

    Raises:
        ValueError: if ``vq`` is not a spatial-norm RGB model or S is not a multiple of f.
    """

    modality = "image"
    component = COMPONENT

    def __init__(self, vq: Any, *, hidden_size: int, image_size: int = DEFAULT_IMAGE_SIZE, freeze_vq: bool = True) -> None:
        cfg = vq.config
        if cfg.norm_type != "spatial":
            raise ValueError(f"MoVQGAN needs a VQModel with norm_type='spatial' (MoVQ); this one has norm_type={cfg.norm_type!r}")
        if cfg.in_channels != 3 or cfg.out_channels != 3:
            raise ValueError(f"MoVQGAN needs an RGB VQModel (in/out_channels 3), got {cfg.in_channels}/{cfg.out_channels}")
        processor = MoVQGANProcessor(int(image_size), downsample_factor(cfg))
        super().__init__(
            vq,
            processor,
            hidden_size=hidden_size,
            codebook_size=int(cfg.num_vq_embeddings),
            freeze_tokenizer=freeze_vq,
            tokenizer_attr="vq",
        )
        self.image_size = processor.image_size
        self.downsample_factor = processor.downsample_factor
        self.grid_size = self.image_size // self.downsample_factor
        self.num_image_tokens = self.grid_size**2
        self.code_dim = int(vq.quantize.vq_embed_dim)

    @property
    def freeze_vq(self) -> bool:
        """Whether the VQ autoencoder is frozen (the base class's ``freeze_tokenizer``)."""
        return self.freeze_tokenizer

    # ---- tokenizer ---------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, batch: dict[str, Any]) -> torch.Tensor:
        """Pixels to codes: LongTensor ``[B * (h/f) * (w/f)]``, item by item, row-major within an item.

        encoder -> ``quant_conv`` -> diffusers' ``VectorQuantizer`` (nearest codebook entry by
        Euclidean distance); no gradients. ``pixel_values`` may be ``[B, 3, h, w]`` or ``[3, h, w]``.
        """
        x = batch["pixel_values"]
        if x.dim() == 3:
            x = x.unsqueeze(0)
        p = next(self.vq.parameters())
        x = x.to(device=p.device, dtype=p.dtype)
        latents = self.vq.encode(x).latents
        _, _, (_, _, indices) = self.vq.quantize(latents)
        return indices.reshape(-1).long()

    def codes_to_latents(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, g*g]`` (or ``[B, g, g]``) -> codebook vectors ``[B, D, g, g]`` (the quantised latents).

        Raises:
            ValueError: if the number of codes per item is not ``g * g`` or a code is outside [0, C).
        """
        codes = torch.as_tensor(codes, device=self.vq.quantize.embedding.weight.device).long()
        b = codes.shape[0]
        codes = codes.reshape(b, -1)
        if codes.shape[1] != self.num_image_tokens:
            raise ValueError(
                f"MoVQGAN decode needs {self.num_image_tokens} codes per image ({self.grid_size}x{self.grid_size}), got {codes.shape[1]}"
            )
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size}); got [{int(codes.min())}, {int(codes.max())}]")
        g = self.grid_size
        return self.vq.quantize.get_codebook_entry(codes.reshape(-1), (b, g, g, self.code_dim))

    @torch.no_grad()
    def decode_pixels(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, g*g]`` -> images float ``[B, 3, S, S]`` (about [-1, 1], unclamped).

        codebook vectors -> ``post_quant_conv`` -> ``vq.decoder(.., latent_embeds=codebook vectors)``:
        exactly what ``VQModel.decode`` does after quantising, with MoVQ's spatial conditioning.
        """
        quant = self.codes_to_latents(codes)
        return self.vq.decoder(self.vq.post_quant_conv(quant), quant)

    def decode(self, codes: torch.Tensor) -> Any:
        """Codes of one image ``[g*g]`` (or ``[g, g]``) -> ``PIL.Image`` RGB of S x S, uint8.

        Raises:
            ValueError: if there are not ``g * g`` codes or a code is outside [0, C).
        """
        from PIL import Image

        codes = torch.as_tensor(codes).reshape(1, -1)
        pixels = self.decode_pixels(codes)[0]
        return Image.fromarray(to_uint8(pixels), mode="RGB")

    def dummy_codes(self) -> torch.Tensor:
        """``g * g`` zeros (LongTensor on the module's device) for the dummy pass."""
        return torch.zeros(self.num_image_tokens, dtype=torch.long, device=self.device)

    def saved_settings(self) -> dict[str, Any]:
        """``image_size``, recorded by ``save_pretrained`` beside the LM adapter (``config.json`` +
        ``diffusion_pytorch_model.safetensors`` from ``VQModel.save_pretrained``, so
        ``VQModel.from_pretrained(path)`` loads the folder too)."""
        return {"image_size": self.image_size}


def to_uint8(pixels: torch.Tensor) -> np.ndarray:
    """``[3, S, S]`` in [-1, 1] -> uint8 ``[S, S, 3]`` (clamped, rounded)."""
    x = ((pixels.detach().float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(1, 2, 0).cpu().numpy()


def load_vq(folder: str | Path) -> Any:
    """Load a diffusers MoVQ ``VQModel`` from a local folder (no download), strictly, with
    :func:`omnicore.api.load_hf_pretrained` (``VQModel.from_pretrained``).

    Raises:
        ValueError: naming the folder and what it must hold, if it is missing, has no ``config.json``
            of a ``VQModel`` or no weights, lacks a tensor of the model (named), or the model is not
            a spatial-norm (MoVQ) one.
    """
    from diffusers import VQModel

    folder = Path(folder).expanduser()
    what = (
        "options.checkpoint must be a diffusers VQModel folder (config.json + diffusion_pytorch_model.safetensors, "
        "e.g. the 'movq' subfolder of kandinsky-2-2-decoder, or a folder written by MoVQGANDecoder.save_pretrained / "
        "`python -m omnicore_image_movqgan.fit`)"
    )
    if (folder / "movq" / VQ_CONFIG_FILE).is_file() and not (folder / VQ_CONFIG_FILE).is_file():
        what += f"; did you mean {folder / 'movq'}?"
    vq = load_hf_pretrained(VQModel, folder, what="MoVQGAN", hint=what)
    if vq.config.norm_type != "spatial":
        raise ValueError(f"{folder} holds a VQModel with norm_type={vq.config.norm_type!r}; MoVQGAN needs norm_type='spatial' (MoVQ)")
    return vq


def build(options: dict[str, Any] | MoVQGANOptions, *, hidden_size: int) -> MoVQGANDecoder:
    """Factory of ``decoder/movqgan``: ``build(options, hidden_size=H) -> MoVQGANDecoder``.

    With ``checkpoint``: loads the VQModel from that local folder (:func:`load_vq`); when the folder
    was written by :meth:`MoVQGANDecoder.save_pretrained` (it has ``omnicore_extra.safetensors``) the
    LM adapter and image size are restored, otherwise the adapter is freshly initialised and the
    image size defaults to the VQModel's ``sample_size`` (which :mod:`omnicore_image_movqgan.fit`
    sets to the size it fitted at). Without: a from-scratch MoVQ from :func:`make_vq_config`
    (``options.config``), initialised by torch's current RNG.

    Raises:
        ValueError: on a bad checkpoint folder or config (see :func:`load_vq`, :func:`make_vq_config`),
            an adapter saved for another hidden or codebook size (file and shapes named), or a folder
            holding only the old ``lm_adapter.safetensors`` / ``omnicore_decoder.json``.
        pydantic.ValidationError: on invalid options.
    """
    opts = options if isinstance(options, MoVQGANOptions) else MoVQGANOptions.model_validate(dict(options or {}))
    image_size = opts.image_size
    meta = None
    if opts.checkpoint is not None:
        folder = Path(opts.checkpoint).expanduser()
        vq = load_vq(folder)
        meta = load_extra_weights(folder, None, component=COMPONENT, required=False, legacy_files=LEGACY_FILES)
        if image_size is None:
            sample_size = vq.config.sample_size
            image_size = (meta or {}).get("image_size") or (sample_size if isinstance(sample_size, int) else None)
    else:
        from diffusers import VQModel

        vq = VQModel(**make_vq_config(opts.config))
    dec = MoVQGANDecoder(vq, hidden_size=hidden_size, image_size=image_size or DEFAULT_IMAGE_SIZE, freeze_vq=opts.freeze_vq)
    if meta is not None:
        dec.load_adapter(folder)
    return dec.train()  # from_pretrained leaves the VQModel in eval mode; a frozen one stays so
