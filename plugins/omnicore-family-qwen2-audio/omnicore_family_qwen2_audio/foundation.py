"""``foundation/qwen2_audio``: a published Qwen2-Audio checkpoint as one config entry.

The LM in omnicore's model is the checkpoint's Qwen2 text model under its LM head
(``AutoModelForCausalLM`` of ``text_config``), read from the checkpoint's language-model tensors;
the tokenizer and chat template are the checkpoint's, unchanged; :meth:`Qwen2AudioFoundation.encoders`
brings the audio tower and projector (``encoder/qwen2_audio_encoder``); :meth:`export_pretrained`
writes the published layout back, which ``Qwen2AudioForConditionalGeneration.from_pretrained`` loads.
What every family does alike is :class:`omnicore_family_kit.foundation.FamilyFoundation`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnicore_family_kit.foundation import FamilyFoundation
from omnicore_family_qwen2_audio.loading import LM
from omnicore_family_qwen2_audio.plugin import MODEL_TYPES
from omnicore_family_qwen2_audio.processor import WHAT_TO_PUT, Qwen2AudioFoundationOptions


class Qwen2AudioFoundation(FamilyFoundation):
    """The :class:`omnicore.api.Foundation` of a Qwen2-Audio checkpoint (reads no weights until
    :meth:`build_model`'s plan is filled).

    Args:
        options: :class:`~omnicore_family_qwen2_audio.processor.Qwen2AudioFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a Qwen2-Audio one (naming the field).
    """

    family = "qwen2_audio"
    model_types = MODEL_TYPES
    what_to_put = WHAT_TO_PUT
    options_model = Qwen2AudioFoundationOptions
    lm_keys = LM
    encoder_entries = {"audio": {"name": "qwen2_audio_encoder", "options": {"long_audio": ...}}}
    """``audio``: the tower and projector, with the foundation's ``long_audio``."""
    part_prefixes = {
        "audio_tower": ["encoders.audio.audio_tower."],
        "multi_modal_projector": ["encoders.audio.multi_modal_projector."],
        "language_model": ["lm."],
    }

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors under
        ``Qwen2AudioForConditionalGeneration``'s names (:data:`~omnicore_family_qwen2_audio.loading.TOWER`,
        :data:`~omnicore_family_qwen2_audio.loading.LM`), written by its own ``save_pretrained``
        (``config.json`` with the trained vocabulary size and ``<|AUDIO|>`` id, the safetensors
        under the names it writes: ``audio_tower.*``, ``multi_modal_projector.*``,
        ``language_model.model.*``, ``language_model.lm_head.*``); then the tokenizer,
        ``Qwen2AudioProcessor``'s files and ``generation_config.json`` if the source has one
        (:meth:`~omnicore_family_kit.foundation.FamilyFoundation.write_export`).

        Raises:
            ValueError: not exactly one ``encoder/qwen2_audio_encoder``; RuntimeError: the tensors do not fill the class.
        """
        from transformers import Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor

        from omnicore_family_qwen2_audio.encoder import Qwen2AudioTower
        from omnicore_family_qwen2_audio.loading import TOWER

        tower = self.one_module(model.encoders, Qwen2AudioTower, "encoder/qwen2_audio_encoder")
        config = self.export_config(model, tokenizer, {"audio_token_index": tower.processor.placeholder})
        processor = Qwen2AudioProcessor(
            feature_extractor=tower.processor.feature_extractor, tokenizer=tokenizer, chat_template=tokenizer.chat_template
        )
        parts = [(tower, TOWER), (model.lm, LM)]
        self.write_export(folder, model, Qwen2AudioForConditionalGeneration, config, parts, tokenizer=tokenizer, processor=processor)


def build(options: dict[str, Any]) -> Qwen2AudioFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/qwen2_audio``)."""
    return Qwen2AudioFoundation(options)
