"""``foundation/llava``: a published LLaVA checkpoint as one config entry.

The LM in omnicore's model is the checkpoint's text model under its LM head
(``AutoModelForCausalLM`` of ``text_config``: Llama for llava-1.5, Qwen2 for llava-interleave),
read from the checkpoint's language-model tensors; the tokenizer and chat template are the
checkpoint's, unchanged; :meth:`LlavaFoundation.encoders` brings the vision tower and projector
(``encoder/llava_encoder``); :meth:`LlavaFoundation.export_pretrained` writes the published layout
back, with ``LlavaForConditionalGeneration.save_pretrained`` itself, so
``LlavaForConditionalGeneration.from_pretrained`` loads it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from omnicore.api import embedding_names, on_meta, plan_checkpoint
from omnicore_family_llava.loading import LM
from omnicore_family_llava.processor import LlavaFoundationOptions, checkpoint_folder

WHAT = "model.foundation.options.checkpoint"


class LlavaFoundation:
    """The :class:`omnicore.api.Foundation` of a LLaVA checkpoint (reads no weights until
    :meth:`build_model`'s plan is filled).

    Args:
        options: :class:`~omnicore_family_llava.processor.LlavaFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a LLaVA one (naming the field).
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = LlavaFoundationOptions.model_validate(dict(options or {}))
        self.folder = checkpoint_folder(self.options.checkpoint, WHAT)

    def config(self) -> Any:
        """The checkpoint's ``LlavaConfig``."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(self.folder))

    def build_tokenizer(self) -> Any:
        """The checkpoint's tokenizer with its chat template (``AutoTokenizer.from_pretrained``)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.folder))

    def build_model(self, vocab_size: int, dtype: Any = None) -> Any:
        """The text LM under its head, on the meta device with the plan that reads the
        checkpoint's language-model tensors (any layout of :data:`omnicore_family_llava.loading.LM`)
        after sharding.

        Args:
            vocab_size: input embeddings needed; the model has ``max(text_config.vocab_size,
                vocab_size)`` rows (rows beyond the checkpoint's get the mean of its rows).
            dtype: floating-point dtype of the parameters (default float32).

        Returns:
            a transformers causal LM (``[B, T] -> [B, T, V]`` logits), parameters on meta, with
            ``omnicore_pending_load``.

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
        """The image entry the checkpoint brings: ``{"image": encoder/llava_encoder of this checkpoint}``."""
        return {"image": {"name": "llava_encoder", "options": {"checkpoint": str(self.folder)}}}

    def part_names(self) -> dict[str, list[str]]:
        """Family part names for ``train.freeze`` / ``train.lr_multipliers`` (the image encoder under
        the key ``image``, as :meth:`encoders` brings it)."""
        return {
            "vision_tower": ["encoders.image.vision_tower."],
            "multi_modal_projector": ["encoders.image.multi_modal_projector."],
            "language_model": ["lm."],
        }

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors under
        ``LlavaForConditionalGeneration``'s names (:data:`~omnicore_family_llava.loading.TOWER`,
        :data:`~omnicore_family_llava.loading.LM`), written by its own ``save_pretrained``
        (:func:`omnicore_family_kit.export.save_through_class`: ``config.json`` with the trained
        vocabulary size and ``<image>`` id, the safetensors under the names it writes:
        ``vision_tower.*``, ``multi_modal_projector.*``, ``language_model.model.*``,
        ``language_model.lm_head.*``); then the tokenizer, ``LlavaProcessor``'s files and the
        source's ``generation_config.json`` if it has one.

        Args:
            model: an unsharded CPU OmniModel (LoRA merged) whose image encoder is this family's.
            tokenizer: the run's tokenizer (the checkpoint's, plus any token the core added).
            folder: the export folder (created).

        Raises:
            ValueError: the model has not exactly one LLaVA image encoder; RuntimeError: its
                tensors do not fill ``LlavaForConditionalGeneration`` (strict, both ways).
        """
        from transformers import LlavaForConditionalGeneration, LlavaProcessor

        from omnicore_family_kit.export import class_state, save_through_class
        from omnicore_family_llava.encoder import LlavaVisionTower
        from omnicore_family_llava.loading import TOWER

        towers = [m for m in model.encoders.values() if isinstance(m, LlavaVisionTower)]
        if len(towers) != 1:
            raise ValueError(f"llava export: the model needs exactly one encoder/llava_encoder, found {len(towers)}")
        tower, lm = towers[0], model.lm
        folder = Path(folder)
        config = self.config()
        config.text_config.vocab_size = int(lm.get_input_embeddings().weight.shape[0])
        config.image_token_index = int(tokenizer.convert_tokens_to_ids(tower.processor.placeholder))
        state = class_state([(tower, TOWER), (lm, LM)])
        save_through_class(LlavaForConditionalGeneration, config, state, folder, dtype=lm.get_input_embeddings().weight.dtype)
        tokenizer.save_pretrained(folder)
        p = tower.processor
        LlavaProcessor(
            image_processor=p.image_processor,
            tokenizer=tokenizer,
            patch_size=p.patch_size,
            vision_feature_select_strategy=p.vision_feature_select_strategy,
            num_additional_image_tokens=p.num_additional_image_tokens,
            image_token=p.placeholder,
            chat_template=tokenizer.chat_template,
        ).save_pretrained(folder)
        if (self.folder / "generation_config.json").is_file() and self.folder.resolve() != folder.resolve():
            shutil.copyfile(self.folder / "generation_config.json", folder / "generation_config.json")


def build(options: dict[str, Any]) -> LlavaFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/llava``)."""
    return LlavaFoundation(options)
