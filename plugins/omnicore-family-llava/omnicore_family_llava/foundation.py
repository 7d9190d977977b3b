"""``foundation/llava``: a published LLaVA checkpoint as one config entry.

The LM in omnicore's model is the checkpoint's text model under its LM head
(``AutoModelForCausalLM`` of ``text_config``: Llama for llava-1.5, Qwen2 for llava-interleave),
read from the checkpoint's language-model tensors in any layout of
:data:`omnicore_family_llava.loading.LM`; the tokenizer and chat template are the checkpoint's,
unchanged; :meth:`LlavaFoundation.encoders` brings the vision tower and projector
(``encoder/llava_encoder``); :meth:`LlavaFoundation.export_pretrained` writes the published layout
back, with ``LlavaForConditionalGeneration.save_pretrained`` itself, so
``LlavaForConditionalGeneration.from_pretrained`` loads it. What every family does alike is
:class:`omnicore_family_kit.foundation.FamilyFoundation`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnicore_family_kit.foundation import FamilyFoundation
from omnicore_family_llava.loading import LM
from omnicore_family_llava.plugin import MODEL_TYPES
from omnicore_family_llava.processor import WHAT_TO_PUT, LlavaFoundationOptions


class LlavaFoundation(FamilyFoundation):
    """The :class:`omnicore.api.Foundation` of a LLaVA checkpoint (reads no weights until
    :meth:`build_model`'s plan is filled).

    Args:
        options: :class:`~omnicore_family_llava.processor.LlavaFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a LLaVA one (naming the field).
    """

    family = "llava"
    model_types = MODEL_TYPES
    what_to_put = WHAT_TO_PUT
    options_model = LlavaFoundationOptions
    lm_keys = LM
    encoder_entries = {"image": {"name": "llava_encoder"}}
    part_prefixes = {
        "vision_tower": ["encoders.image.vision_tower."],
        "multi_modal_projector": ["encoders.image.multi_modal_projector."],
        "language_model": ["lm."],
    }

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors under
        ``LlavaForConditionalGeneration``'s names (:data:`~omnicore_family_llava.loading.TOWER`,
        :data:`~omnicore_family_llava.loading.LM`), written by its own ``save_pretrained``
        (``config.json`` with the trained vocabulary size and ``<image>`` id, the safetensors under
        the names it writes: ``vision_tower.*``, ``multi_modal_projector.*``,
        ``language_model.model.*``, ``language_model.lm_head.*``); then the tokenizer,
        ``LlavaProcessor``'s files and the source's ``generation_config.json`` if it has one
        (:meth:`~omnicore_family_kit.foundation.FamilyFoundation.write_export`).

        Raises:
            ValueError: not exactly one ``encoder/llava_encoder``; RuntimeError: the tensors do not fill the class.
        """
        from transformers import LlavaForConditionalGeneration, LlavaProcessor

        from omnicore_family_llava.encoder import LlavaVisionTower
        from omnicore_family_llava.loading import TOWER

        tower = self.one_module(model.encoders, LlavaVisionTower, "encoder/llava_encoder")
        p = tower.processor
        config = self.export_config(model, tokenizer, {"image_token_index": p.placeholder})
        processor = LlavaProcessor(
            image_processor=p.image_processor,
            tokenizer=tokenizer,
            patch_size=p.patch_size,
            vision_feature_select_strategy=p.vision_feature_select_strategy,
            num_additional_image_tokens=p.num_additional_image_tokens,
            image_token=p.placeholder,
            chat_template=tokenizer.chat_template,
        )
        parts = [(tower, TOWER), (model.lm, LM)]
        self.write_export(folder, model, LlavaForConditionalGeneration, config, parts, tokenizer=tokenizer, processor=processor)


def build(options: dict[str, Any]) -> LlavaFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/llava``)."""
    return LlavaFoundation(options)
