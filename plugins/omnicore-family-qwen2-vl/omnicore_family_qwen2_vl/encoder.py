"""The model side of ``encoder/qwen2_vl_encoder``: the checkpoint's vision tower with its merger
(transformers' ``Qwen2VisionTransformerPretrainedModel`` or, for Qwen2.5-VL,
``Qwen2_5_VisionTransformerPretrainedModel`` with its window attention), built with transformers'
own class and read from the checkpoint.

:meth:`Qwen2VLVisionTower.forward` is ``get_image_features`` / ``get_video_features`` of the HF
model: the patches go through the tower, whose ``pooler_output`` (the merger's rows, already at the
LM's width) is concatenated in item order, as the rows are scattered into the ``<|image_pad|>`` /
``<|video_pad|>`` positions. One module encodes both modalities (``modalities``): the video entry
the foundation brings shares it (``model.encoders.video.share: image``), as the published model
has one tower.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnicore.api import on_meta, plan_checkpoint
from omnicore_family_qwen2_vl.loading import TOWER
from omnicore_family_qwen2_vl.processor import Qwen2VLMediaProcessor, build_processor, checkpoint_folder


def tower_class(model_type: str) -> type:
    """transformers' vision tower class of ``qwen2_vl`` or ``qwen2_5_vl``."""
    if model_type == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

        return Qwen2_5_VisionTransformerPretrainedModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    return Qwen2VisionTransformerPretrainedModel


def composite_class(model_type: str) -> type:
    """transformers' whole-model class of ``qwen2_vl`` or ``qwen2_5_vl`` (what the export and a
    saved part are written as)."""
    import transformers

    return transformers.Qwen2_5_VLForConditionalGeneration if model_type == "qwen2_5_vl" else transformers.Qwen2VLForConditionalGeneration


def merged_width(config: Any) -> int:
    """The width of the merger's rows: ``vision_config.hidden_size`` (Qwen2-VL) or
    ``vision_config.out_hidden_size`` (Qwen2.5-VL), the LM's hidden size as published."""
    vision = config.vision_config
    return int(vision.out_hidden_size if config.model_type == "qwen2_5_vl" else vision.hidden_size)


class Qwen2VLVisionTower(nn.Module):
    """Qwen2-VL's (or Qwen2.5-VL's) vision tower with its merger: patches to LM-wide rows.

    Args:
        config: the checkpoint's ``Qwen2VLConfig`` / ``Qwen2_5_VLConfig`` (its ``vision_config``
            builds the tower).
        processor: the :class:`~omnicore_family_qwen2_vl.processor.Qwen2VLMediaProcessor` of the
            same checkpoint (its modality is this module's).
        source: the checkpoint folder (its processor files go into :meth:`save_pretrained`'s folder).

    Attributes:
        visual: transformers' tower (``visual.patch_embed``, ``visual.blocks``, ``visual.merger``:
            the names of the published checkpoint).
        modality: the processor's (``"image"`` by default); modalities: ``("image", "video")``.
    """

    modalities = ("image", "video")

    def __init__(self, config: Any, processor: Qwen2VLMediaProcessor, source: Path) -> None:
        super().__init__()
        self.config = config
        self.visual = tower_class(config.model_type)._from_config(config.vision_config)
        self.processor = processor
        self.modality = processor.modality
        self.source = Path(source)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Encode collated images or clips.

        Args:
            batch: images ``{"pixel_values": [N, 3 * tp * P * P], "image_grid_thw": [B, 3]}`` or
                clips ``{"pixel_values_videos": [N, 3 * tp * P * P], "video_grid_thw": [B, 3], ...}``
                (:meth:`Qwen2VLMediaProcessor.collate`).

        Returns:
            ``[sum over items of gt * gh * gw / merge**2, hidden_size]`` rows in item order, in the
            tower's dtype.

        Raises:
            ValueError: the batch holds neither kind of pixels.
        """
        if "pixel_values" in batch:
            pixels, grid = batch["pixel_values"], batch["image_grid_thw"]
        elif "pixel_values_videos" in batch:
            pixels, grid = batch["pixel_values_videos"], batch["video_grid_thw"]
        else:
            raise ValueError(f"qwen2_vl encoder: the batch holds neither pixel_values nor pixel_values_videos (keys {sorted(batch)})")
        weight = self.visual.patch_embed.proj.weight
        grid = torch.as_tensor(grid).reshape(-1, 3).to(weight.device)
        return self.visual(pixels.to(weight.device, weight.dtype), grid_thw=grid).pooler_output

    def dummy_batch(self) -> dict[str, Any]:
        """One all-zero item of one merge block (one token) of this module's modality, collated."""
        p = self.processor
        m, width = p.merge_size, 3 * p.temporal_patch_size * p.patch_size**2
        if p.modality == "image":
            item = {"pixel_values": torch.zeros(m * m, width), "image_grid_thw": torch.tensor([1, m, m])}
        else:
            item = {
                "pixel_values_videos": torch.zeros(m * m, width),
                "video_grid_thw": torch.tensor([1, m, m]),
                "second_per_grid_ts": torch.tensor(1.0),
            }
        return p.collate([item])

    def save_pretrained(self, path: str) -> None:
        """Write ``path`` as a Qwen2-VL folder holding only this part: the composite
        ``config.json``, ``model.safetensors`` with ``visual.*`` (the published names;
        :func:`omnicore_family_kit.export.save_part`) and the source's processor files; the factory
        loads it back."""
        from omnicore_family_kit.export import save_part

        save_part(self, TOWER, self.config, Path(path), model_class=composite_class(self.config.model_type), source=self.source)


def read_config(folder: Path) -> Any:
    """The checkpoint's ``Qwen2VLConfig`` / ``Qwen2_5_VLConfig`` (``config.json`` only)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder))


def build(options: dict[str, Any], *, hidden_size: int) -> Qwen2VLVisionTower:
    """The encoder factory: the tower with its merger on the meta device, with the plan that reads
    it from the checkpoint after sharding (``omnicore_pending_load``).

    Raises:
        ValueError: the folder is not a Qwen2-VL / Qwen2.5-VL checkpoint; its merger's width is not
            the foundation's ``hidden_size`` (the merger feeds that LM); LoadError when the
            checkpoint's tensors do not fit.
    """
    processor = build_processor(options)
    what = f"model.encoders.{processor.modality}.options.checkpoint"
    folder = checkpoint_folder(options["checkpoint"], what)
    config = read_config(folder)
    width = merged_width(config)
    if width != int(hidden_size):
        raise ValueError(
            f"{what}: {folder}'s merger feeds a hidden size of {width}, but the foundation's is {hidden_size}; "
            "use the foundation of the same checkpoint (foundation/qwen2_vl)"
        )
    with on_meta():
        module = Qwen2VLVisionTower(config, processor, folder)
    module.omnicore_pending_load = plan_checkpoint(module, folder, renames=TOWER.renames(), other_parts=TOWER.other_parts(), what=what)
    return module
