"""``foundation/qwen2_audio``: a published Qwen2-Audio checkpoint as one config entry.

The LM in omnicore's model is the checkpoint's Qwen2 text model under its LM head
(``AutoModelForCausalLM`` of ``text_config``), read from the checkpoint's language-model tensors;
the tokenizer and chat template are the checkpoint's, unchanged; :meth:`Qwen2AudioFoundation.encoders`
brings the audio tower and projector (``encoder/qwen2_audio_encoder``); :meth:`export_pretrained`
writes the published layout back, which ``Qwen2AudioForConditionalGeneration.from_pretrained`` loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from omnicore.api import embedding_names, on_meta, plan_checkpoint
from omnicore_family_qwen2_audio.loading import LM
from omnicore_family_qwen2_audio.processor import Qwen2AudioFoundationOptions, checkpoint_folder

WHAT = "model.foundation.options.checkpoint"


class Qwen2AudioFoundation:
    """The :class:`omnicore.api.Foundation` of a Qwen2-Audio checkpoint (reads no weights until
    :meth:`build_model`'s plan is filled).

    Args:
        options: :class:`~omnicore_family_qwen2_audio.processor.Qwen2AudioFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a Qwen2-Audio one (naming the field).
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = Qwen2AudioFoundationOptions.model_validate(dict(options or {}))
        self.folder = checkpoint_folder(self.options.checkpoint, WHAT)

    def config(self) -> Any:
        """The checkpoint's ``Qwen2AudioConfig``."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(self.folder))

    def build_tokenizer(self) -> Any:
        """The checkpoint's tokenizer with its chat template (``AutoTokenizer.from_pretrained``)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.folder))

    def build_model(self, vocab_size: int, dtype: Any = None) -> Any:
        """The Qwen2 text LM under its head, on the meta device with the plan that reads the
        checkpoint's language-model tensors (either layout) after sharding.

        Args:
            vocab_size: input embeddings needed; the model has ``max(text_config.vocab_size,
                vocab_size)`` rows (rows beyond the checkpoint's get the mean of its rows).
            dtype: floating-point dtype of the parameters (default float32).

        Raises:
            LoadError: (``ValueError``) the checkpoint's language-model tensors do not fit.
        """
        import torch
        from transformers import AutoModelForCausalLM

        text = self.config().text_config
        rows = int(text.vocab_size)
        text.vocab_size = max(rows, int(vocab_size))
        with on_meta():
            model = AutoModelForCausalLM.from_config(text, dtype=dtype or torch.float32)
        model.tie_weights()
        model.omnicore_pending_load = plan_checkpoint(
            model, self.folder, renames=LM.renames(), other_parts=LM.other_parts(), what=WHAT, grow=embedding_names(model)
        )
        return model

    def encoders(self) -> dict[str, dict[str, Any]]:
        """The audio entry the checkpoint brings: ``{"audio": encoder/qwen2_audio_encoder of this checkpoint}``."""
        return {
            "audio": {"name": "qwen2_audio_encoder", "options": {"checkpoint": str(self.folder), "long_audio": self.options.long_audio}}
        }

    def part_names(self) -> dict[str, list[str]]:
        """Family part names for ``train.freeze`` / ``train.lr_multipliers`` (the audio encoder under
        the key ``audio``, as :meth:`encoders` brings it)."""
        return {
            "audio_tower": ["encoders.audio.audio_tower."],
            "multi_modal_projector": ["encoders.audio.multi_modal_projector."],
            "language_model": ["lm."],
        }

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors under
        ``Qwen2AudioForConditionalGeneration``'s names (:data:`~omnicore_family_qwen2_audio.loading.TOWER`,
        :data:`~omnicore_family_qwen2_audio.loading.LM`), written by its own ``save_pretrained``
        (:func:`omnicore_family_kit.export.save_through_class`: ``config.json`` with the trained
        vocabulary size and ``<|AUDIO|>`` id, the safetensors under the names it writes:
        ``audio_tower.*``, ``multi_modal_projector.*``, ``language_model.model.*``,
        ``language_model.lm_head.*``); then the tokenizer, ``Qwen2AudioProcessor``'s files and
        ``generation_config.json`` if the source has one.

        Args:
            model: an unsharded CPU OmniModel (LoRA merged) whose audio encoder is this family's.

        Raises:
            ValueError: the model has no Qwen2-Audio audio encoder; RuntimeError: its tensors do
                not fill the class (strict, both ways).
        """
        from transformers import Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor

        from omnicore_family_kit.export import class_state, save_through_class
        from omnicore_family_qwen2_audio.encoder import Qwen2AudioTower
        from omnicore_family_qwen2_audio.loading import TOWER

        towers = [m for m in model.encoders.values() if isinstance(m, Qwen2AudioTower)]
        if len(towers) != 1:
            raise ValueError(f"qwen2_audio export: the model needs exactly one encoder/qwen2_audio_encoder, found {len(towers)}")
        tower, lm = towers[0], model.lm
        folder = Path(folder)
        config = self.config()
        config.text_config.vocab_size = int(lm.get_input_embeddings().weight.shape[0])
        config.audio_token_index = int(tokenizer.convert_tokens_to_ids(tower.processor.placeholder))
        state = class_state([(tower, TOWER), (lm, LM)])
        save_through_class(Qwen2AudioForConditionalGeneration, config, state, folder, dtype=lm.get_input_embeddings().weight.dtype)
        tokenizer.save_pretrained(folder)
        Qwen2AudioProcessor(
            feature_extractor=tower.processor.feature_extractor, tokenizer=tokenizer, chat_template=tokenizer.chat_template
        ).save_pretrained(folder)
        if (self.folder / "generation_config.json").is_file() and self.folder.resolve() != folder.resolve():
            shutil.copyfile(self.folder / "generation_config.json", folder / "generation_config.json")


def build(options: dict[str, Any]) -> Qwen2AudioFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/qwen2_audio``)."""
    return Qwen2AudioFoundation(options)
