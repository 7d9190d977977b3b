"""The model side of ``encoder/llava_encoder``: the checkpoint's ``vision_tower`` (transformers'
``CLIPVisionModel`` or ``SiglipVisionModel``, as ``LlavaModel`` builds it from ``vision_config``) and
its ``multi_modal_projector`` (``LlavaMultiModalProjector``), built with transformers' own classes
and read from the checkpoint.

:meth:`LlavaVisionTower.forward` is ``LlavaModel.get_image_features`` (transformers 5.24): the
tower's hidden states of ``vision_feature_layer`` (one index, or a list whose states are
concatenated along the width), the class token dropped from each under
``vision_feature_select_strategy: "default"`` (kept under ``"full"``), then the projector; the rows
of the images follow one another, as the model scatters them into the ``<image>`` positions.

Parameters that cannot reach the output are frozen (``requires_grad=False``) and exported
unchanged: the tower's layers after the deepest selected one (``-2``, as published, leaves the
last layer out), its ``post_layernorm`` and SigLIP's pooling ``head`` (neither is in the hidden
states). They would never get a gradient, which stalls sharded training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnicore.api import on_meta, plan_checkpoint
from omnicore_family_llava.loading import TOWER
from omnicore_family_llava.processor import (
    CLASS_TOKENS,
    LlavaImageProcessor,
    build_processor,
    checkpoint_folder,
    image_rows,
    read_config,
)


def feature_layers(config: Any) -> list[int]:
    """``vision_feature_layer`` as a list of indices into the tower's ``num_hidden_layers + 1``
    hidden states (0: the embeddings), negatives resolved.

    Raises:
        ValueError: an index outside the hidden states (naming ``config.json``'s field).
    """
    raw = config.vision_feature_layer
    layers = [raw] if isinstance(raw, int) else list(raw)
    count = int(config.vision_config.num_hidden_layers) + 1
    out = []
    for i in layers:
        if not -count <= int(i) < count:
            raise ValueError(f"config.json: vision_feature_layer {raw!r} names hidden state {i}; the tower has {count} (0 to {count - 1})")
        out.append(int(i) % count)
    return out


class LlavaVisionTower(nn.Module):
    """LLaVA's vision tower plus projector: images to LM-wide rows.

    Args:
        config: the checkpoint's ``LlavaConfig`` (its ``vision_config`` builds the tower,
            ``vision_feature_layer`` / ``vision_feature_select_strategy`` pick the features,
            ``text_config.hidden_size`` is the projector's width).
        processor: the :class:`~omnicore_family_llava.processor.LlavaImageProcessor` of the same
            checkpoint.

    Attributes:
        vision_tower: ``AutoModel.from_config(vision_config)`` (``CLIPVisionModel`` or
            ``SiglipVisionModel``); multi_modal_projector: ``LlavaMultiModalProjector`` (names as in
            ``LlavaModel``).
        modality: ``"image"``; modalities: ``("image",)``.
        image_size: ``S``, the side of the tower's input in pixels.
        rows_per_image: output rows per image (:func:`~omnicore_family_llava.processor.image_rows`).

    Raises:
        ValueError: the tower is neither CLIP nor SigLIP, or ``vision_feature_layer`` is out of range.
    """

    modality = "image"
    modalities = ("image",)

    def __init__(self, config: Any, processor: LlavaImageProcessor) -> None:
        super().__init__()
        from transformers import AutoModel
        from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

        self.rows_per_image = image_rows(config)  # refuses other towers first
        self.config = config
        self.layers = feature_layers(config)
        self.drop_class_token = config.vision_feature_select_strategy == "default"
        self.image_size = int(config.vision_config.image_size)
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = LlavaMultiModalProjector(config)
        self.processor = processor
        for p in self.unused_parameters():
            p.requires_grad_(False)

    def unused_parameters(self) -> list[nn.Parameter]:
        """The tower's parameters that cannot reach the output (see the module docstring)."""
        tower = self.vision_tower
        blocks = tower.encoder.layers
        out: list[nn.Parameter] = []
        for block in list(blocks)[max(self.layers) :]:
            out += list(block.parameters())
        for name in ("post_layernorm", "head"):
            part = getattr(tower, name, None)
            if isinstance(part, nn.Module):
                out += list(part.parameters())
        return out

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Encode collated images.

        Args:
            batch: ``{"pixel_values": [B, 3, S, S]}`` (:meth:`LlavaImageProcessor.collate`).

        Returns:
            ``[B * rows_per_image, hidden_size]`` rows, image after image, in the projector's dtype.

        Raises:
            ValueError: the pixel values are not ``S x S`` (the tower's ``image_size``).
        """
        weight = self.multi_modal_projector.linear_1.weight
        pixels = batch["pixel_values"].to(weight.device)
        if pixels.ndim != 4 or tuple(pixels.shape[1:]) != (3, self.image_size, self.image_size):
            raise ValueError(
                f"llava encoder: pixel_values of shape {tuple(pixels.shape)}; the tower takes [B, 3, {self.image_size}, "
                f"{self.image_size}] (the checkpoint's image processor gives that size)"
            )
        hidden = self.vision_tower(pixels, output_hidden_states=True, return_dict=True).hidden_states
        picked = [hidden[i][:, 1:] if self.drop_class_token else hidden[i] for i in self.layers]
        features = picked[0] if len(picked) == 1 else torch.cat(picked, dim=-1)
        projected = self.multi_modal_projector(features)  # [B, rows_per_image, hidden_size]
        return projected.reshape(-1, projected.shape[-1])

    def dummy_batch(self) -> dict[str, Any]:
        """One black ``S x S`` image, through the processor."""
        from PIL import Image

        return self.processor.collate([self.processor.preprocess(Image.new("RGB", (self.image_size, self.image_size)))])

    def save_pretrained(self, path: str) -> None:
        """Write ``path`` as a LLaVA folder holding only this part: the composite ``config.json``,
        ``model.safetensors`` with ``vision_tower.*`` and ``multi_modal_projector.*`` (the names
        transformers 5's ``save_pretrained`` writes; :func:`omnicore_family_kit.export.save_part`),
        the image processor and ``processor_config.json`` (``LlavaProcessor``'s settings); the
        factory loads it back."""
        import json

        from transformers import LlavaForConditionalGeneration

        from omnicore_family_kit.export import save_part

        out = Path(path)
        save_part(self, TOWER, self.config, out, model_class=LlavaForConditionalGeneration)
        self.processor.image_processor.save_pretrained(out)
        settings = {
            "image_token": self.processor.placeholder,
            "num_additional_image_tokens": self.processor.num_additional_image_tokens,
            "patch_size": self.processor.patch_size,
            "processor_class": "LlavaProcessor",
            "vision_feature_select_strategy": self.processor.vision_feature_select_strategy,
        }
        (out / "processor_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def build(options: dict[str, Any], *, hidden_size: int) -> LlavaVisionTower:
    """The encoder factory: the tower and projector on the meta device, with the plan that reads
    them from the checkpoint after sharding (``omnicore_pending_load``).

    Raises:
        ValueError: the folder is not a LLaVA checkpoint or its processor disagrees with the model
            (:func:`~omnicore_family_llava.processor.build_processor`); its text hidden size is not
            the foundation's ``hidden_size`` (the projector feeds that LM); LoadError when the
            checkpoint's tensors do not fit.
    """
    what = "model.encoders.image.options.checkpoint"
    processor = build_processor(options)
    folder = checkpoint_folder(options["checkpoint"], what)
    config = read_config(folder)
    width = int(config.text_config.hidden_size)
    if width != int(hidden_size):
        raise ValueError(
            f"{what}: {folder}'s projector feeds a hidden size of {width}, but the foundation's is {hidden_size}; "
            "use the foundation of the same checkpoint (foundation/llava)"
        )
    with on_meta():
        module = LlavaVisionTower(config, processor)
    module.omnicore_pending_load = plan_checkpoint(module, folder, renames=TOWER.renames(), other_parts=TOWER.other_parts(), what=what)
    return module


__all__ = ["CLASS_TOKENS", "LlavaVisionTower", "build", "feature_layers"]
