"""The ``siglip`` image encoder: a SigLIP vision tower plus a LLaVA-style MLP projector.

Sources:
    * SigLIP: Zhai, Mustafa, Kolesnikov, Beyer, "Sigmoid Loss for Language Image Pre-Training",
      ICCV 2023 (arXiv:2303.15343). The tower is transformers' ``SiglipVisionModel``: a ViT whose
      ``S x S`` input is cut into non-overlapping ``P x P`` patches (a stride-``P`` convolution), so
      an image becomes ``(S // P) ** 2`` tokens, with no class token.
    * Projector: Liu, Li, Wu, Lee, "Visual Instruction Tuning" (LLaVA), NeurIPS 2023, and its
      LLaVA-1.5 follow-up (Liu et al. 2023, "Improved Baselines with Visual Instruction Tuning"),
      whose ``mlp2x_gelu`` projector is ``Linear(D, H) -> GELU -> Linear(H, H)``. LLaVA feeds every
      patch token of the vision tower (no pooling) to the language model; so does this encoder.

Data flow (shapes; ``B`` images in a batch, ``C = 3`` channels, ``S`` = ``image_size`` pixels,
``P`` = ``patch_size`` pixels, ``N = (S // P) ** 2`` tokens per image, ``D`` = tower width,
``H`` = the foundation's hidden size)::

    PIL image (any size, any mode) --preprocess--> pixel_values [C, S, S] float32
    collate: [B, C, S, S] --tower--> last_hidden_state [B, N, D] --projector--> [B, N, H]
    --flatten in item order--> [B * N, H]

Checkpoint folders (``options["checkpoint"]``) may be:
    * a folder written by :meth:`SiglipImageEncoder.save_pretrained` (tower, image processor config
      and ``omnicore_extra.safetensors`` with the projector; the projector is restored);
    * a folder written by ``SiglipVisionModel.save_pretrained`` (tower only);
    * a folder written by ``SiglipModel.save_pretrained`` (a full SigLIP with text and vision towers:
      its vision tower is taken, weights named ``vision_model.*``; the text tower is never loaded).
    The tower is read by :func:`omnicore.api.load_hf_pretrained` (transformers' own
    ``SiglipVisionModel.from_pretrained``, strict). Without ``omnicore_extra.safetensors`` the
    projector is freshly initialised (PyTorch's default ``nn.Linear`` initialisation, as LLaVA's
    stage-1 pre-training starts from).

The tower is always built without SigLIP's attention-pooling head (``vision_use_head=False``): the
encoder uses every patch token, and an unused head would hold parameters that never get a gradient
(a problem for DDP and for "every parameter takes part" checks). Head weights in a checkpoint are
ignored.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch
from einops import rearrange
from torch import nn

from omnicore.api import item_generators, load_extra_weights, load_hf_pretrained, save_extra_weights
from omnicore_image_siglip.augment import AugmentOptions, random_affine
from omnicore_image_siglip.processor import PREPROCESSOR_FILE, SiglipEncoderOptions, SiglipImageProcessor

__all__ = ["SiglipEncoderOptions", "SiglipImageEncoder", "SiglipImageProcessor", "build"]

logger = logging.getLogger(__name__)

COMPONENT = "encoder/siglip"
"""The component name recorded with the projector in ``omnicore_extra.safetensors``."""
LEGACY_PROJECTOR_FILE = "projector.safetensors"
"""Where versions before the shared extra-weights format kept the projector (no longer read)."""

_WHAT_TO_PUT = (
    "point `checkpoint` at a folder written by this encoder's save_pretrained, by "
    "transformers' SiglipVisionModel.save_pretrained or by SiglipModel.save_pretrained "
    "(it must hold config.json of model_type 'siglip' or 'siglip_vision_model' and "
    "model.safetensors), or leave `checkpoint` unset and give `config` to build a tower from scratch"
)


# ---------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------


def build(options: dict[str, Any] | SiglipEncoderOptions, *, hidden_size: int) -> SiglipImageEncoder:
    """Factory of encoder ``siglip`` (``target`` of its ComponentSpec).

    Args:
        options: a dict validated by :class:`SiglipEncoderOptions` (or an instance of it).
        hidden_size: ``H``, the foundation's hidden size the projector maps to.

    Returns:
        a :class:`SiglipImageEncoder` on CPU, float32, in training mode.

    Raises:
        pydantic.ValidationError (a ValueError): if the options are invalid.
        ValueError: if ``checkpoint`` is not a folder, lacks a SigLIP ``config.json`` or weights, its
            weights lack tensors of the tower (named), or its ``omnicore_extra.safetensors`` holds a
            projector of other shapes than ``hidden_size`` needs (file and shapes named), or it holds
            only an old ``projector.safetensors``. The message says what to do.
    """
    opts = options if isinstance(options, SiglipEncoderOptions) else SiglipEncoderOptions.model_validate(dict(options))
    if opts.checkpoint:
        enc = SiglipImageEncoder.from_checkpoint(opts.checkpoint, hidden_size=hidden_size, freeze=opts.freeze, merge=opts.merge)
    else:
        enc = SiglipImageEncoder.from_config(opts.config, hidden_size=hidden_size, freeze=opts.freeze, merge=opts.merge)
    enc.augment = opts.augment
    return enc


def merge_patches(hidden: torch.Tensor, side: int, merge: int) -> torch.Tensor:
    """Concatenate each ``merge x merge`` block of neighbouring patch tokens into one token.

    Args:
        hidden: ``[B, side * side, D]``, patch tokens in raster order (row by row).
        side: patches per image side (a multiple of ``merge``).
        merge: ``m``.

    Returns:
        ``[B, (side // m) ** 2, m * m * D]`` in raster order of the blocks; block ``(i, j)`` holds the
        patches ``(m*i + a, m*j + b)`` for ``a`` then ``b`` in ``range(m)``, each ``D`` wide.
    """
    g = side // merge
    return rearrange(hidden, "b (gh mh gw mw) d -> b (gh gw) (mh mw d)", gh=g, mh=merge, gw=g, mw=merge)


# ---------------------------------------------------------------------------------------------
# The encoder
# ---------------------------------------------------------------------------------------------


class SiglipImageEncoder(nn.Module):
    """SigLIP vision tower + LLaVA MLP projector, implementing :class:`omnicore.components.Encoder`.

    Attributes:
        modality: ``"image"``.
        tower: ``transformers.SiglipVisionModel`` (without attention-pooling head).
        projector: ``nn.Sequential(Linear(m * m * D, H), GELU(), Linear(H, H))`` (``m`` = ``merge``).
        processor: the data side (:class:`~omnicore_image_siglip.processor.SiglipImageProcessor`),
            the same one ``build_processor`` makes from the same options.
        image_processor: its ``transformers.SiglipImageProcessorPil`` resizing to ``S x S``.
        image_size: ``S``, pixels; patch_size: ``P``, pixels; hidden_size: ``H``.
        merge: ``m``: each ``m x m`` block of neighbouring patch tokens is concatenated into one
            token before the projector (Qwen2-VL's patch merger: Wang et al., "Qwen2-VL", 2024,
            arXiv:2409.12191; 1: no merging).
        tokens_per_image: ``N = (S // P // m) ** 2``.
        frozen: whether the tower is frozen.
        augment: the random affine changes drawn per image in training mode
            (:class:`~omnicore_image_siglip.augment.AugmentOptions`; none by default).
    """

    modality = "image"

    def __init__(self, tower: Any, *, hidden_size: int, image_processor: Any = None, freeze: bool = False, merge: int = 1) -> None:
        """Wrap a SigLIP vision tower and add a freshly initialised projector.

        Args:
            tower: a ``transformers.SiglipVisionModel`` built without its pooling head
                (``config.vision_use_head=False``); see :meth:`from_config` and :meth:`from_checkpoint`.
            hidden_size: ``H`` (> 0).
            image_processor: a ``SiglipImageProcessorPil`` to reuse (its mean, std, resampling); its
                target size is always set to ``image_size``. None: SigLIP's defaults (bicubic,
                rescale by 1/255, mean = std = 0.5 per channel, i.e. pixels map to [-1, 1]).
            freeze: freeze the tower.
            merge: ``m`` (see the class attributes).

        Raises:
            ValueError: if ``hidden_size`` < 1, the tower has a pooling head, ``num_channels`` != 3,
                ``patch_size`` > ``image_size``, or the patch grid is not a multiple of ``merge``.
        """
        super().__init__()
        if int(hidden_size) < 1:
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        config = tower.config
        if config.vision_use_head:
            raise ValueError("the SigLIP tower must be built with vision_use_head=False (the encoder uses every patch token)")
        if config.num_channels != 3:
            raise ValueError(f"num_channels must be 3 (the SigLIP image processor yields RGB), got {config.num_channels}")
        self.image_size = int(config.image_size)
        self.patch_size = int(config.patch_size)
        self.hidden_size = int(hidden_size)
        self.processor = SiglipImageProcessor(self.image_size, self.patch_size, image_processor, merge)
        self.merge = int(merge)
        self.tokens_per_image = self.processor.tokens_per_image
        self.tower = tower
        width = config.hidden_size * self.merge**2
        self.projector = nn.Sequential(nn.Linear(width, self.hidden_size), nn.GELU(), nn.Linear(self.hidden_size, self.hidden_size))
        self.image_processor = self.processor.image_processor
        self.frozen = False
        self.augment = AugmentOptions()
        if freeze:
            self.freeze_tower()

    # ---- building and loading ---------------------------------------------------------------

    @classmethod
    def from_config(cls, vision_config: Any, *, hidden_size: int, freeze: bool = False, merge: int = 1) -> SiglipImageEncoder:
        """A randomly initialised tower from ``vision_config`` (a ``SiglipVisionConfig`` or its kwargs).

        The config is copied and ``vision_use_head`` forced to False. Raises ValueError as :meth:`__init__`.
        """
        from transformers import SiglipVisionConfig, SiglipVisionModel

        config = SiglipVisionConfig(**vision_config) if isinstance(vision_config, dict) else copy.deepcopy(vision_config)
        config.vision_use_head = False
        return cls(SiglipVisionModel(config), hidden_size=hidden_size, freeze=freeze, merge=merge)

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, hidden_size: int, freeze: bool = False, merge: int = 1) -> SiglipImageEncoder:
        """Load the tower (and, if present, the projector and image processor config) from a folder.

        See the module docstring for the three accepted folder layouts. The tower comes from
        :func:`omnicore.api.load_hf_pretrained` (``SiglipVisionModel.from_pretrained``, which takes the
        ``vision_model.*`` tensors of a full ``SiglipModel`` by itself), strictly: a tower tensor the
        checkpoint lacks is an error naming it. The projector comes from ``omnicore_extra.safetensors``
        (:func:`omnicore.api.load_extra_weights`) if the folder has it, and starts fresh otherwise.

        Raises:
            ValueError: naming the folder (or file) and what to put there (see :func:`build`).
        """
        from transformers import SiglipImageProcessorPil, SiglipVisionModel

        folder = Path(path).expanduser()
        tower = load_hf_pretrained(SiglipVisionModel, folder, config_overrides={"vision_use_head": False}, what="SigLIP", hint=_WHAT_TO_PUT)
        processor = None
        if (folder / PREPROCESSOR_FILE).is_file():
            processor = SiglipImageProcessorPil.from_pretrained(str(folder))
        enc = cls(tower, hidden_size=hidden_size, image_processor=processor, freeze=False, merge=merge)
        meta = load_extra_weights(folder, enc.projector, component=COMPONENT, required=False, legacy_files=(LEGACY_PROJECTOR_FILE,))
        logger.info("siglip: loaded tower from %s; projector %s", folder, "restored" if meta is not None else "freshly initialised")
        enc.train()  # from_pretrained leaves the tower in eval mode; build() returns training mode
        if freeze:
            enc.freeze_tower()
        return enc

    def freeze_tower(self) -> None:
        """Freeze the vision tower: no gradients, and :meth:`forward` runs it without autograd."""
        self.tower.requires_grad_(False)
        self.frozen = True

    # ---- the Encoder contract ---------------------------------------------------------------

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Encode a collated batch: ``[B, 3, S, S]`` -> ``[B * N, H]``, rows in item order.

        In training mode, each image first gets the random shift, rotation and zoom of
        :attr:`augment` (:func:`~omnicore_image_siglip.augment.random_affine`; none by default).
        Every patch token of the tower's ``last_hidden_state`` (after its final LayerNorm) goes
        through the projector; image ``b``'s tokens are rows ``b * N`` to ``(b + 1) * N - 1``. Pixel
        values are moved to the module's device; the tower casts them to its own dtype.
        """
        pixel_values = batch["pixel_values"]
        if pixel_values.dim() == 3:
            pixel_values = pixel_values.unsqueeze(0)
        pixel_values = pixel_values.to(self.projector[0].weight.device)
        if self.training:  # each image draws from its own sample's stream (a training batch holds the seeds)
            pixel_values = random_affine(pixel_values, self.augment, item_generators(batch))
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            hidden = self.tower(pixel_values=pixel_values).last_hidden_state  # [B, (S // P) ** 2, D]
        if self.merge > 1:
            hidden = merge_patches(hidden, self.image_size // self.patch_size, self.merge)  # [B, N, m * m * D]
        # flatten before projecting, so the output is a fresh tensor rather than a view (FSDP2 warns
        # that in-place ops on a module's view output can corrupt gradients)
        return self.projector(hidden.reshape(-1, hidden.shape[-1]))  # [B * N, H]

    def dummy_batch(self) -> dict[str, torch.Tensor]:
        """One all-zero image (mid-grey after normalisation), ``{"pixel_values": [1, 3, S, S]}`` on CPU."""
        return {"pixel_values": torch.zeros(1, 3, self.image_size, self.image_size)}

    def save_pretrained(self, path: str | Path) -> None:
        """Write a folder that ``build({"checkpoint": path}, hidden_size=H)`` loads back.

        Files: ``config.json`` + ``model.safetensors`` (the tower, as ``SiglipVisionModel.save_pretrained``
        writes it, so transformers loads it directly), ``preprocessor_config.json`` (the image
        processor) and ``omnicore_extra.safetensors`` (:func:`omnicore.api.save_extra_weights`: the
        projector's ``0.weight`` ``[H, D]``, ``0.bias`` ``[H]``, ``2.weight`` ``[H, H]``, ``2.bias``
        ``[H]``, with ``hidden_size``, ``tower_width`` (the projector input, ``m * m * D``) and ``merge`` recorded). Call it on an unsharded module
        (e.g. gathered on rank 0).
        """
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.tower.save_pretrained(str(folder))
        self.image_processor.save_pretrained(str(folder))
        save_extra_weights(
            folder,
            self.projector,
            component=COMPONENT,
            hidden_size=self.hidden_size,
            tower_width=int(self.projector[0].in_features),
            merge=self.merge,
        )
