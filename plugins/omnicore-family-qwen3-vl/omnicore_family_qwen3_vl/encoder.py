"""The model side of ``encoder/qwen3_vl_encoder``: the checkpoint's vision tower (transformers'
``Qwen3VLVisionModel``: patch embedding, a learned position embedding interpolated to each grid,
the blocks, the merger and the DeepStack mergers), built with transformers' own class and read
from the checkpoint.

:meth:`Qwen3VLVisionTower.forward` is ``get_image_features`` / ``get_video_features`` of the HF
model: the merger's rows (already at the LM's width) for the placeholders, and the DeepStack rows
(the outputs of the blocks ``vision_config.deepstack_visual_indexes``, each through its own
merger) as :class:`omnicore.api.EncoderOutput` ``layer_embeds``, which the foundation adds to the
LM's hidden states at the visual positions after its first layers (Qwen3-VL technical report,
"DeepStack"; transformers' ``Qwen3VLTextModel``). One module encodes both modalities.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnicore.api import EncoderOutput, on_meta, plan_checkpoint
from omnicore_family_qwen3_vl.loading import TOWER
from omnicore_family_qwen3_vl.processor import Qwen3VLMediaProcessor, build_processor, checkpoint_folder


class Qwen3VLVisionTower(nn.Module):
    """Qwen3-VL's vision tower with its mergers: patches to LM-wide rows, plus DeepStack rows.

    Args:
        config: the checkpoint's ``Qwen3VLConfig`` (its ``vision_config`` builds the tower).
        processor: the :class:`~omnicore_family_qwen3_vl.processor.Qwen3VLMediaProcessor` of the
            same checkpoint (its modality is this module's).
        source: the checkpoint folder (its processor files go into :meth:`save_pretrained`'s folder).

    Attributes:
        visual: transformers' ``Qwen3VLVisionModel`` (``visual.patch_embed``, ``visual.pos_embed``,
            ``visual.blocks``, ``visual.merger``, ``visual.deepstack_merger_list``).
        modality: the processor's; modalities: ``("image", "video")``.
    """

    modalities = ("image", "video")

    def __init__(self, config: Any, processor: Qwen3VLMediaProcessor, source: Path) -> None:
        super().__init__()
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

        self.config = config
        self.visual = Qwen3VLVisionModel._from_config(config.vision_config)
        self.processor = processor
        self.modality = processor.modality
        self.source = Path(source)

    def forward(self, batch: dict[str, Any]) -> EncoderOutput:
        """Encode collated images or clips.

        Args:
            batch: images ``{"pixel_values": [N, 3 * tp * P * P], "image_grid_thw": [B, 3]}`` or
                clips ``{"pixel_values_videos": [N, 3 * tp * P * P], "video_grid_thw": [B, 3]}``.

        Returns:
            ``embeds`` ``[sum over items of gt * gh * gw / merge**2, out_hidden_size]`` in item order
            and ``layer_embeds``, one more such tensor per DeepStack layer, in the tower's dtype.

        Raises:
            ValueError: the batch holds neither kind of pixels.
        """
        if "pixel_values" in batch:
            pixels, grid = batch["pixel_values"], batch["image_grid_thw"]
        elif "pixel_values_videos" in batch:
            pixels, grid = batch["pixel_values_videos"], batch["video_grid_thw"]
        else:
            raise ValueError(f"qwen3_vl encoder: the batch holds neither pixel_values nor pixel_values_videos (keys {sorted(batch)})")
        weight = self.visual.patch_embed.proj.weight
        grid = torch.as_tensor(grid).reshape(-1, 3).to(weight.device)
        out = self.visual(pixels.to(weight.device, weight.dtype), grid_thw=grid)
        return EncoderOutput(out.pooler_output, list(out.deepstack_features))

    def dummy_batch(self) -> dict[str, Any]:
        """One all-zero item of one merge block (one token) of this module's modality, collated."""
        p = self.processor
        m, width = p.merge_size, 3 * p.temporal_patch_size * p.patch_size**2
        keys = ("pixel_values", "image_grid_thw") if p.modality == "image" else ("pixel_values_videos", "video_grid_thw")
        return p.collate([{keys[0]: torch.zeros(m * m, width), keys[1]: torch.tensor([1, m, m])}])

    def save_pretrained(self, path: str) -> None:
        """Write ``path`` as a Qwen3-VL folder holding only this part: the composite ``config.json``,
        ``model.safetensors`` with ``model.visual.*`` (the published names;
        :func:`omnicore_family_kit.export.save_part`) and the source's processor files; the factory
        loads it back."""
        from transformers import Qwen3VLForConditionalGeneration

        from omnicore_family_kit.export import save_part

        save_part(self, TOWER, self.config, Path(path), model_class=Qwen3VLForConditionalGeneration, source=self.source)


def build(options: dict[str, Any], *, hidden_size: int) -> Qwen3VLVisionTower:
    """The encoder factory: the tower on the meta device, with the plan that reads it from the
    checkpoint after sharding (``omnicore_pending_load``).

    Raises:
        ValueError: the folder is not a Qwen3-VL checkpoint; its mergers' width
            (``vision_config.out_hidden_size``) is not the foundation's ``hidden_size``; LoadError
            when the checkpoint's tensors do not fit.
    """
    from transformers import AutoConfig

    processor = build_processor(options)
    what = f"model.encoders.{processor.modality}.options.checkpoint"
    folder = checkpoint_folder(options["checkpoint"], what)
    config = AutoConfig.from_pretrained(str(folder))
    width = int(config.vision_config.out_hidden_size)
    if width != int(hidden_size):
        raise ValueError(
            f"{what}: {folder}'s merger feeds a hidden size of {width}, but the foundation's is {hidden_size}; "
            "use the foundation of the same checkpoint (foundation/qwen3_vl)"
        )
    with on_meta():
        module = Qwen3VLVisionTower(config, processor, folder)
    module.omnicore_pending_load = plan_checkpoint(module, folder, renames=TOWER.renames(), other_parts=TOWER.other_parts(), what=what)
    return module
