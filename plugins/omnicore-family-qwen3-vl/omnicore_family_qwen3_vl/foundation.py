"""``foundation/qwen3_vl``: a published Qwen3-VL checkpoint as one config entry.

The LM in omnicore's model is the checkpoint's text model under its LM head
(:func:`omnicore.api.build_mrope_lm`: ``Qwen3VLTextModel``, which interleaves the three mRoPE
axes' frequencies itself and takes omnicore's ``[4, B, T]`` positions as they are: row 0 the 1-D
positions that keep packed samples apart, then time, height, width). :meth:`layer_inputs` hands it
the DeepStack rows of the vision tower; the tokenizer and chat template are the checkpoint's;
:meth:`Qwen3VLFoundation.encoders` brings the vision tower (``encoder/qwen3_vl_encoder``) for images
and the same module for video; :meth:`export_pretrained` writes the published layout back, which
``Qwen3VLForConditionalGeneration.from_pretrained`` loads. What every family does alike is
:class:`omnicore_family_kit.foundation.FamilyFoundation`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnicore_family_kit.foundation import FamilyFoundation
from omnicore_family_qwen3_vl.loading import LM
from omnicore_family_qwen3_vl.plugin import MODEL_TYPES
from omnicore_family_qwen3_vl.processor import IMAGE_PAD, VIDEO_PAD, WHAT_TO_PUT, WRAP, Qwen3VLFoundationOptions

TOKEN_IDS = {"image_token_id": IMAGE_PAD, "video_token_id": VIDEO_PAD, "vision_start_token_id": WRAP[0], "vision_end_token_id": WRAP[1]}
"""The media token ids the config holds -> their token strings (written with the tokenizer's ids)."""


class Qwen3VLFoundation(FamilyFoundation):
    """The :class:`omnicore.api.Foundation` of a Qwen3-VL checkpoint (reads no weights until
    :meth:`build_model`'s plan is filled). Its LM rotates by interleaved mRoPE and takes the
    tower's DeepStack rows in its first layers (:meth:`layer_inputs`).

    Args:
        options: :class:`~omnicore_family_qwen3_vl.processor.Qwen3VLFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a Qwen3-VL one (naming the field).
    """

    family = "qwen3_vl"
    model_types = MODEL_TYPES
    what_to_put = WHAT_TO_PUT
    options_model = Qwen3VLFoundationOptions
    lm_keys = LM
    mrope = True
    encoder_entries = {
        "image": {"name": "qwen3_vl_encoder"},
        "video": {"name": "qwen3_vl_encoder", "options": {"modality": "video"}, "share": "image"},
    }
    """``image``: the tower; ``video``: its processor only, its clips go to the image module."""
    part_prefixes = {
        "visual": ["encoders.image.visual.patch_embed.", "encoders.image.visual.pos_embed.", "encoders.image.visual.blocks."],
        "merger": ["encoders.image.visual.merger.", "encoders.image.visual.deepstack_merger_list."],
        "language_model": ["lm."],
    }
    """``visual``: the tower's patch and position embeddings and blocks; ``merger``: its merger and DeepStack mergers."""

    def layer_inputs(self, mask: Any, per_layer: list[Any]) -> dict[str, Any]:
        """The DeepStack keyword arguments of ``Qwen3VLTextModel.forward``: ``visual_pos_masks``
        (bool ``[B, T]``, the image and video placeholders) and ``deepstack_visual_embeds`` (one
        ``[n, H]`` per layer: added to the hidden states at those positions after decoder layer
        ``k``, for the first ``len(per_layer)`` layers)."""
        return {"visual_pos_masks": mask, "deepstack_visual_embeds": list(per_layer)}

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors under
        ``Qwen3VLForConditionalGeneration``'s names (:data:`~omnicore_family_qwen3_vl.loading.TOWER`,
        :data:`~omnicore_family_qwen3_vl.loading.LM`), written by its own ``save_pretrained``
        (``config.json`` with the trained vocabulary size and the tokenizer's ids of the vision
        tokens, :data:`TOKEN_IDS`; the safetensors under the names it writes: ``model.visual.*``,
        ``model.language_model.*``, ``lm_head.*``, no ``lm_head`` when the embeddings are tied);
        then the source's processor files, the tokenizer with its chat template and
        ``generation_config.json`` if it has one
        (:meth:`~omnicore_family_kit.foundation.FamilyFoundation.write_export`).

        Raises:
            ValueError: not exactly one ``encoder/qwen3_vl_encoder``; RuntimeError: the tensors do not fill the class.
        """
        from transformers import Qwen3VLForConditionalGeneration

        from omnicore_family_qwen3_vl.encoder import Qwen3VLVisionTower
        from omnicore_family_qwen3_vl.loading import TOWER

        tower = self.one_module(model.encoders, Qwen3VLVisionTower, "encoder/qwen3_vl_encoder")
        config = self.export_config(model, tokenizer, TOKEN_IDS)
        parts = [(tower, TOWER), (model.lm, LM)]
        self.write_export(folder, model, Qwen3VLForConditionalGeneration, config, parts, tokenizer=tokenizer)


def build(options: dict[str, Any]) -> Qwen3VLFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/qwen3_vl``)."""
    return Qwen3VLFoundation(options)
