"""``foundation/qwen2_vl``: a published Qwen2-VL or Qwen2.5-VL checkpoint as one config entry.

The LM in omnicore's model is the checkpoint's mRoPE text model under its LM head
(:func:`omnicore.api.build_mrope_lm`: ``Qwen2VLTextModel`` / ``Qwen2_5_VLTextModel``, keys
``model.*`` and ``lm_head.*``), read from the checkpoint's language-model tensors in either layout;
the tokenizer and chat template are the checkpoint's, unchanged; :meth:`Qwen2VLFoundation.encoders`
brings the vision tower with its merger (``encoder/qwen2_vl_encoder``) for images, and the same
module for video; :meth:`export_pretrained` writes the published layout back, which
``Qwen2VLForConditionalGeneration.from_pretrained`` (``Qwen2_5_VL...``) loads. The model type is
read from the checkpoint's ``config.json``. What every family does alike is
:class:`omnicore_family_kit.foundation.FamilyFoundation`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnicore_family_kit.foundation import FamilyFoundation
from omnicore_family_qwen2_vl.loading import LM
from omnicore_family_qwen2_vl.plugin import MODEL_TYPES
from omnicore_family_qwen2_vl.processor import IMAGE_PAD, VIDEO_PAD, WHAT_TO_PUT, WRAP, Qwen2VLFoundationOptions

TOKEN_IDS = {"image_token_id": IMAGE_PAD, "video_token_id": VIDEO_PAD, "vision_start_token_id": WRAP[0], "vision_end_token_id": WRAP[1]}
"""The media token ids the config holds -> their token strings (written with the tokenizer's ids)."""


class Qwen2VLFoundation(FamilyFoundation):
    """The :class:`omnicore.api.Foundation` of a Qwen2-VL / Qwen2.5-VL checkpoint (reads no weights
    until :meth:`build_model`'s plan is filled). Its LM rotates by mRoPE; building it logs the
    checkpoint's model type (``qwen2_vl`` or ``qwen2_5_vl``) and class.

    Args:
        options: :class:`~omnicore_family_qwen2_vl.processor.Qwen2VLFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a Qwen2-VL / Qwen2.5-VL one (naming the field).
    """

    family = "qwen2_vl"
    model_types = MODEL_TYPES
    what_to_put = WHAT_TO_PUT
    options_model = Qwen2VLFoundationOptions
    lm_keys = LM
    mrope = True
    encoder_entries = {
        "image": {"name": "qwen2_vl_encoder"},
        "video": {"name": "qwen2_vl_encoder", "options": {"modality": "video"}, "share": "image"},
    }
    """``image``: the tower with its merger; ``video``: its processor only, its clips go to the image module."""
    part_prefixes = {
        "visual": ["encoders.image.visual.patch_embed.", "encoders.image.visual.blocks."],
        "merger": ["encoders.image.visual.merger."],
        "language_model": ["lm."],
    }
    """``visual``: the tower's patch embedding and blocks; ``merger``: its patch merger."""

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors under the class's names
        (:data:`~omnicore_family_qwen2_vl.loading.TOWER`, :data:`~omnicore_family_qwen2_vl.loading.LM`),
        written by ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration``'s own
        ``save_pretrained`` (``config.json`` with the trained vocabulary size and the tokenizer's
        ids of the vision tokens, :data:`TOKEN_IDS`; the safetensors under the names it writes:
        ``visual.*``, ``model.*``, ``lm_head.*``, no ``lm_head`` when the embeddings are tied); then
        the source's processor files, the tokenizer with its chat template and
        ``generation_config.json`` if it has one
        (:meth:`~omnicore_family_kit.foundation.FamilyFoundation.write_export`).

        Raises:
            ValueError: not exactly one ``encoder/qwen2_vl_encoder``; RuntimeError: the tensors do not fill the class.
        """
        from omnicore_family_qwen2_vl.encoder import Qwen2VLVisionTower, composite_class
        from omnicore_family_qwen2_vl.loading import TOWER

        tower = self.one_module(model.encoders, Qwen2VLVisionTower, "encoder/qwen2_vl_encoder")
        config = self.export_config(model, tokenizer, TOKEN_IDS)
        parts = [(tower, TOWER), (model.lm, LM)]
        self.write_export(folder, model, composite_class(config.model_type), config, parts, tokenizer=tokenizer)


def build(options: dict[str, Any]) -> Qwen2VLFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/qwen2_vl``)."""
    return Qwen2VLFoundation(options)
