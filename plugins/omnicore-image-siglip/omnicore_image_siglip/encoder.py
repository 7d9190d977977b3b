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
      and ``projector.safetensors``; the projector is restored);
    * a folder written by ``SiglipVisionModel.save_pretrained`` (tower only);
    * a folder written by ``SiglipModel.save_pretrained`` (a full SigLIP with text and vision towers:
      its vision tower is taken, weights named ``vision_model.*``; the text tower is never loaded).
    Without ``projector.safetensors`` the projector is freshly initialised (PyTorch's default
    ``nn.Linear`` initialisation, as LLaVA's stage-1 pre-training starts from).

The tower is always built without SigLIP's attention-pooling head (``vision_use_head=False``): the
encoder uses every patch token, and an unused head would hold parameters that never get a gradient
(a problem for DDP and for "every parameter takes part" checks). Head weights in a checkpoint are
ignored.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import nn

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
TORCH_WEIGHTS_FILE = "pytorch_model.bin"
PREPROCESSOR_FILE = "preprocessor_config.json"
PROJECTOR_FILE = "projector.safetensors"

_WHAT_TO_PUT = (
    "point `checkpoint` at a folder written by this encoder's save_pretrained, by "
    "transformers' SiglipVisionModel.save_pretrained or by SiglipModel.save_pretrained "
    f"(it must hold {CONFIG_FILE} of model_type 'siglip' or 'siglip_vision_model' and "
    f"{WEIGHTS_FILE}), or leave `checkpoint` unset and give `config` to build a tower from scratch"
)


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------


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
        description=(
            "Freeze the vision tower (requires_grad=False, run without autograd); the projector always trains."
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
    def _one_source(self) -> "SiglipEncoderOptions":
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


# ---------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------


def build(options: dict[str, Any] | SiglipEncoderOptions, *, hidden_size: int) -> "SiglipImageEncoder":
    """Factory of encoder ``siglip`` (``target`` of its ComponentSpec).

    Args:
        options: a dict validated by :class:`SiglipEncoderOptions` (or an instance of it).
        hidden_size: ``H``, the foundation's hidden size the projector maps to.

    Returns:
        a :class:`SiglipImageEncoder` on CPU, float32, in training mode.

    Raises:
        pydantic.ValidationError (a ValueError): if the options are invalid.
        ValueError: if ``checkpoint`` is not a folder, lacks a SigLIP ``config.json`` or weights, its
            weights lack tensors of the tower, or its ``projector.safetensors`` does not map to
            ``hidden_size``. The message names the folder and what to put there.
    """
    opts = options if isinstance(options, SiglipEncoderOptions) else SiglipEncoderOptions.model_validate(dict(options))
    if opts.checkpoint:
        return SiglipImageEncoder.from_checkpoint(opts.checkpoint, hidden_size=hidden_size, freeze=opts.freeze)
    from transformers import SiglipVisionConfig

    return SiglipImageEncoder(SiglipVisionConfig(**opts.config), hidden_size=hidden_size, freeze=opts.freeze)


# ---------------------------------------------------------------------------------------------
# The encoder
# ---------------------------------------------------------------------------------------------


class SiglipImageEncoder(nn.Module):
    """SigLIP vision tower + LLaVA MLP projector, implementing :class:`omnicore.components.Encoder`.

    Attributes:
        modality: ``"image"``.
        tower: ``transformers.SiglipVisionModel`` (without attention-pooling head).
        projector: ``nn.Sequential(Linear(D, H), GELU(), Linear(H, H))``.
        image_processor: ``transformers.SiglipImageProcessorPil`` resizing to ``S x S``.
        image_size: ``S``, pixels; patch_size: ``P``, pixels; hidden_size: ``H``.
        tokens_per_image: ``N = (S // P) ** 2``.
        frozen: whether the tower is frozen.
    """

    modality = "image"

    def __init__(self, vision_config: Any, *, hidden_size: int, image_processor: Any = None, freeze: bool = False) -> None:
        """Build a randomly initialised tower from ``vision_config`` (a ``SiglipVisionConfig``).

        Args:
            vision_config: copied, with ``vision_use_head`` forced to False.
            hidden_size: ``H`` (> 0).
            image_processor: a ``SiglipImageProcessorPil`` to reuse (its mean, std, resampling); its
                target size is always set to ``image_size``. None: SigLIP's defaults (bicubic,
                rescale by 1/255, mean = std = 0.5 per channel, i.e. pixels map to [-1, 1]).
            freeze: freeze the tower.

        Raises:
            ValueError: if ``hidden_size`` < 1, ``num_channels`` != 3 or ``patch_size`` > ``image_size``.
        """
        super().__init__()
        from transformers import SiglipImageProcessorPil, SiglipVisionModel

        if int(hidden_size) < 1:
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        config = copy.deepcopy(vision_config)
        config.vision_use_head = False
        if config.num_channels != 3:
            raise ValueError(f"num_channels must be 3 (the SigLIP image processor yields RGB), got {config.num_channels}")
        if config.patch_size > config.image_size:
            raise ValueError(f"patch_size {config.patch_size} is larger than image_size {config.image_size}")
        self.image_size = int(config.image_size)
        self.patch_size = int(config.patch_size)
        self.hidden_size = int(hidden_size)
        self.tokens_per_image = (self.image_size // self.patch_size) ** 2
        self.tower = SiglipVisionModel(config)
        width = config.hidden_size
        self.projector = nn.Sequential(nn.Linear(width, self.hidden_size), nn.GELU(), nn.Linear(self.hidden_size, self.hidden_size))
        size = {"height": self.image_size, "width": self.image_size}
        if image_processor is None:
            image_processor = SiglipImageProcessorPil(size=size)
        else:
            kwargs = image_processor.to_dict()
            kwargs = {k: v for k, v in kwargs.items() if k not in ("image_processor_type", "processor_class", "size", "do_resize", "do_convert_rgb")}
            image_processor = SiglipImageProcessorPil(**kwargs, size=size, do_resize=True, do_convert_rgb=True)
        self.image_processor = image_processor
        self.frozen = False
        if freeze:
            self.freeze_tower()

    # ---- loading ----------------------------------------------------------------------------

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, hidden_size: int, freeze: bool = False) -> "SiglipImageEncoder":
        """Load the tower (and, if present, the projector and image processor config) from a folder.

        See the module docstring for the three accepted folder layouts. Tower weights may be named
        as in ``SiglipVisionModel`` (``embeddings.*``), or carry a ``vision_model.`` prefix (as in
        ``SiglipModel`` and transformers 4.x ``SiglipVisionModel``) or any prefix ending in
        ``vision_model.``; every tensor of the tower must be found, or ValueError is raised.

        Raises:
            ValueError: naming the folder and what to put there (see :func:`build`).
        """
        folder = Path(path)
        if not folder.is_dir():
            raise ValueError(f"SigLIP checkpoint folder {str(folder)!r} does not exist or is not a folder; {_WHAT_TO_PUT}")
        vision_config = _read_vision_config(folder)
        processor = None
        if (folder / PREPROCESSOR_FILE).is_file():
            from transformers import SiglipImageProcessorPil

            processor = SiglipImageProcessorPil.from_pretrained(str(folder))
        enc = cls(vision_config, hidden_size=hidden_size, image_processor=processor, freeze=False)
        expected = set(enc.tower.state_dict())
        tensors = _read_tower_tensors(folder, expected)
        try:
            enc.tower.load_state_dict(tensors, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"SigLIP checkpoint {str(folder)!r}: tower weights do not fit its config.json: {exc}") from exc
        projector_file = folder / PROJECTOR_FILE
        if projector_file.is_file():
            from safetensors.torch import load_file

            state = load_file(str(projector_file))
            want = {k: tuple(v.shape) for k, v in enc.projector.state_dict().items()}
            got = {k: tuple(v.shape) for k, v in state.items()}
            if want != got:
                raise ValueError(
                    f"{projector_file} holds a projector of shapes {got}, but this encoder needs {want} "
                    f"(tower width {vision_config.hidden_size} -> hidden_size {hidden_size}); pass the hidden_size it was "
                    f"saved with, or delete {PROJECTOR_FILE} to start the projector afresh"
                )
            enc.projector.load_state_dict(state, strict=True)
            logger.info("siglip: loaded tower (%d tensors) and projector from %s", len(tensors), folder)
        else:
            logger.info("siglip: loaded tower (%d tensors) from %s; projector freshly initialised", len(tensors), folder)
        if freeze:
            enc.freeze_tower()
        return enc

    def freeze_tower(self) -> None:
        """Freeze the vision tower: no gradients, and :meth:`forward` runs it without autograd."""
        self.tower.requires_grad_(False)
        self.frozen = True

    # ---- the Encoder contract ---------------------------------------------------------------

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
        """Tokens (and output rows) of one image: ``(image_size // patch_size) ** 2``.

        This is the one formula shared by the data side (placeholder tokens) and the model (rows of
        :meth:`forward`): every image is resized to ``S x S`` and the tower's stride-``P`` patch
        convolution yields ``(S // P) ** 2`` patch tokens (SigLIP has no class token), e.g. 16 for
        ``S = 28, P = 7``.

        Raises:
            ValueError: if ``features["pixel_values"]`` is not ``[3, S, S]``.
        """
        pv = features.get("pixel_values") if isinstance(features, dict) else None
        if pv is None or tuple(pv.shape) != (3, self.image_size, self.image_size):
            shape = None if pv is None else tuple(pv.shape)
            raise ValueError(f"siglip features must hold pixel_values of shape (3, {self.image_size}, {self.image_size}), got {shape}")
        return self.tokens_per_image

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

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Encode a collated batch: ``[B, 3, S, S]`` -> ``[B * N, H]``, rows in item order.

        Every patch token of the tower's ``last_hidden_state`` (after its final LayerNorm) goes
        through the projector; image ``b``'s tokens are rows ``b * N`` to ``(b + 1) * N - 1``. Pixel
        values are moved to the module's device; the tower casts them to its own dtype.
        """
        pixel_values = batch["pixel_values"]
        if pixel_values.dim() == 3:
            pixel_values = pixel_values.unsqueeze(0)
        pixel_values = pixel_values.to(self.projector[0].weight.device)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            hidden = self.tower(pixel_values=pixel_values).last_hidden_state  # [B, N, D]
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
        processor) and ``projector.safetensors`` (keys ``0.weight``, ``0.bias``, ``2.weight``,
        ``2.bias`` of the projector). Call it on an unsharded module (e.g. gathered on rank 0).
        """
        from safetensors.torch import save_file

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.tower.save_pretrained(str(folder))
        self.image_processor.save_pretrained(str(folder))
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.projector.state_dict().items()}
        save_file(
            state,
            str(folder / PROJECTOR_FILE),
            metadata={"format": "pt", "omnicore_encoder": "siglip", "in_features": str(self.projector[0].in_features), "hidden_size": str(self.hidden_size)},
        )


# ---------------------------------------------------------------------------------------------
# Checkpoint reading helpers
# ---------------------------------------------------------------------------------------------


def _read_vision_config(folder: Path) -> Any:
    """The ``SiglipVisionConfig`` of a checkpoint folder (a vision config, or the ``vision_config``
    of a full SigLIP or of any model whose vision_config is a SigLIP vision model)."""
    from transformers import SiglipVisionConfig

    cfg_file = folder / CONFIG_FILE
    if not cfg_file.is_file():
        raise ValueError(f"SigLIP checkpoint folder {str(folder)!r} has no {CONFIG_FILE}; {_WHAT_TO_PUT}")
    try:
        data = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {cfg_file}: {exc}; {_WHAT_TO_PUT}") from exc
    model_type = data.get("model_type") if isinstance(data, dict) else None
    vision = None
    if model_type == "siglip_vision_model":
        vision = data
    elif isinstance(data, dict) and isinstance(data.get("vision_config"), dict):
        default = "siglip_vision_model" if model_type == "siglip" else None
        if data["vision_config"].get("model_type", default) == "siglip_vision_model":
            vision = data["vision_config"]
    if vision is None:
        raise ValueError(
            f"{cfg_file} is not a SigLIP config (model_type {model_type!r}, expected 'siglip' or "
            f"'siglip_vision_model'); {_WHAT_TO_PUT}"
        )
    vision = {k: v for k, v in vision.items() if k not in ("architectures", "transformers_version", "model_type", "_name_or_path")}
    return SiglipVisionConfig(**vision)


def _tower_key(key: str, expected: set[str]) -> str | None:
    """Map a checkpoint tensor name to the tower's, or None if it is not a tower tensor."""
    if key in expected:
        return key
    marker = "vision_model."
    if marker in key:
        rest = key.split(marker, 1)[1]
        if rest in expected:
            return rest
    return None


def _read_tower_tensors(folder: Path, expected: set[str]) -> dict[str, torch.Tensor]:
    """Read exactly the tower's tensors from a folder's weights, renamed to the tower's names."""
    single, index, legacy = folder / WEIGHTS_FILE, folder / WEIGHTS_INDEX_FILE, folder / TORCH_WEIGHTS_FILE
    out: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}

    def take(name: str, get: Any) -> None:
        target = _tower_key(name, expected)
        if target is None:
            return
        if target in out:
            raise ValueError(f"SigLIP checkpoint {str(folder)!r}: tensors {source[target]!r} and {name!r} both map to tower tensor {target!r}")
        out[target] = get()
        source[target] = name

    if single.is_file() or index.is_file():
        from safetensors import safe_open

        if single.is_file():
            files = [single]
        else:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            files = [folder / f for f in sorted(set(weight_map.values()))]
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    take(name, lambda f=f, name=name: f.get_tensor(name))
    elif legacy.is_file():
        state = torch.load(str(legacy), map_location="cpu", weights_only=True)
        for name, tensor in state.items():
            take(name, lambda tensor=tensor: tensor)
    else:
        raise ValueError(f"SigLIP checkpoint folder {str(folder)!r} has no {WEIGHTS_FILE} (or {WEIGHTS_INDEX_FILE}, {TORCH_WEIGHTS_FILE}); {_WHAT_TO_PUT}")
    missing = sorted(expected - set(out))
    if missing:
        raise ValueError(
            f"SigLIP checkpoint {str(folder)!r} lacks {len(missing)} of the vision tower's {len(expected)} tensors "
            f"(e.g. {missing[:3]}); expected names like 'embeddings.patch_embedding.weight' or "
            f"'vision_model.embeddings.patch_embedding.weight'; {_WHAT_TO_PUT}"
        )
    return out
