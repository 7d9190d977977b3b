"""``foundation/qwen2_vl``: a published Qwen2-VL or Qwen2.5-VL checkpoint as one config entry.

The LM in omnicore's model is the checkpoint's mRoPE text model under its LM head
(:func:`omnicore.api.build_mrope_lm`: ``Qwen2VLTextModel`` / ``Qwen2_5_VLTextModel``, keys
``model.*`` and ``lm_head.*``), read from the checkpoint's language-model tensors in either layout;
the tokenizer and chat template are the checkpoint's, unchanged; :meth:`Qwen2VLFoundation.encoders`
brings the vision tower with its merger (``encoder/qwen2_vl_encoder``) for images, and the same
module for video; :meth:`export_pretrained` writes the published layout back, which
``Qwen2VLForConditionalGeneration.from_pretrained`` (``Qwen2_5_VL...``) loads. The model type is
read from the checkpoint's ``config.json``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from omnicore.api import build_mrope_lm, embedding_names, on_meta, plan_checkpoint
from omnicore_family_qwen2_vl.loading import LM
from omnicore_family_qwen2_vl.processor import IMAGE_PAD, VIDEO_PAD, WRAP, Qwen2VLFoundationOptions, checkpoint_folder

WHAT = "model.foundation.options.checkpoint"

logger = logging.getLogger(__name__)


class Qwen2VLFoundation:
    """The :class:`omnicore.api.Foundation` of a Qwen2-VL / Qwen2.5-VL checkpoint (reads no weights
    until :meth:`build_model`'s plan is filled).

    Args:
        options: :class:`~omnicore_family_qwen2_vl.processor.Qwen2VLFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a Qwen2-VL / Qwen2.5-VL one (naming the field).
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = Qwen2VLFoundationOptions.model_validate(dict(options or {}))
        self.folder = checkpoint_folder(self.options.checkpoint, WHAT)

    def config(self) -> Any:
        """The checkpoint's ``Qwen2VLConfig`` or ``Qwen2_5_VLConfig``."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(self.folder))

    def build_tokenizer(self) -> Any:
        """The checkpoint's tokenizer with its chat template (``AutoTokenizer.from_pretrained``)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.folder))

    def build_model(self, vocab_size: int, dtype: Any = None) -> Any:
        """The mRoPE text LM under its head, on the meta device with the plan that reads the
        checkpoint's language-model tensors (either layout) after sharding. Logs the checkpoint's
        model type (``qwen2_vl`` or ``qwen2_5_vl``) and class.

        Args:
            vocab_size: input embeddings needed; the model has ``max(text_config.vocab_size,
                vocab_size)`` rows (rows beyond the checkpoint's get the mean of its rows).
            dtype: floating-point dtype of the parameters (default float32).

        Raises:
            ValueError: the text config's ``mrope_section`` does not fit its head dim.
            LoadError: (``ValueError``) the checkpoint's language-model tensors do not fit.
        """
        config = self.config()
        arch = ", ".join(getattr(config, "architectures", None) or []) or "no architectures in config.json"
        logger.info("foundation qwen2_vl: %s is a %s checkpoint (%s)", self.folder, config.model_type, arch)
        with on_meta():
            model = build_mrope_lm(config, vocab_size=vocab_size, dtype=dtype)
        model.tie_weights()
        model.omnicore_pending_load = plan_checkpoint(
            model, self.folder, renames=LM.renames(), other_parts=LM.other_parts(), what=WHAT, grow=embedding_names(model)
        )
        return model

    def encoders(self) -> dict[str, dict[str, Any]]:
        """The entries the checkpoint brings: ``image`` (``encoder/qwen2_vl_encoder``, the tower with
        its merger) and ``video`` (its processor only; its clips go to the image module:
        ``share: image``)."""
        folder = str(self.folder)
        return {
            "image": {"name": "qwen2_vl_encoder", "options": {"checkpoint": folder}},
            "video": {"name": "qwen2_vl_encoder", "options": {"checkpoint": folder, "modality": "video"}, "share": "image"},
        }

    def part_names(self) -> dict[str, list[str]]:
        """Family part names for ``train.freeze`` / ``train.lr_multipliers``: ``visual`` (the tower's
        patch embedding and blocks), ``merger`` (its patch merger) and ``language_model``, with the
        tower under the key ``image`` as :meth:`encoders` brings it."""
        return {
            "visual": ["encoders.image.visual.patch_embed.", "encoders.image.visual.blocks."],
            "merger": ["encoders.image.visual.merger."],
            "language_model": ["lm."],
        }

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors under the class's names
        (:data:`~omnicore_family_qwen2_vl.loading.TOWER`, :data:`~omnicore_family_qwen2_vl.loading.LM`),
        written by ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration``'s own
        ``save_pretrained`` (:func:`omnicore_family_kit.export.save_through_class`: ``config.json``
        with the trained vocabulary size and the tokenizer's ids of the vision tokens, the
        safetensors under the names it writes: ``visual.*``, ``model.*``, ``lm_head.*``, no
        ``lm_head`` when the embeddings are tied); then the tokenizer with its chat template, the
        source's processor files and ``generation_config.json`` if it has one.

        Args:
            model: an unsharded CPU OmniModel (LoRA merged) whose vision encoder is this family's.

        Raises:
            ValueError: the model has not exactly one Qwen2-VL vision encoder; RuntimeError: its
                tensors do not fill the class (strict, both ways).
        """
        from omnicore_family_kit.export import class_state, copy_extra_files, save_through_class
        from omnicore_family_qwen2_vl.encoder import Qwen2VLVisionTower, composite_class
        from omnicore_family_qwen2_vl.loading import TOWER

        towers = [m for m in model.encoders.values() if isinstance(m, Qwen2VLVisionTower)]
        if len(towers) != 1:
            raise ValueError(f"qwen2_vl export: the model needs exactly one encoder/qwen2_vl_encoder module, found {len(towers)}")
        tower, lm = towers[0], model.lm
        folder = Path(folder)
        config = self.config()
        config.text_config.vocab_size = int(lm.get_input_embeddings().weight.shape[0])
        token_ids = {
            "image_token_id": IMAGE_PAD,
            "video_token_id": VIDEO_PAD,
            "vision_start_token_id": WRAP[0],
            "vision_end_token_id": WRAP[1],
        }
        for key, token in token_ids.items():
            setattr(config, key, int(tokenizer.convert_tokens_to_ids(token)))
        state = class_state([(tower, TOWER), (lm, LM)])
        save_through_class(composite_class(config.model_type), config, state, folder, dtype=lm.get_input_embeddings().weight.dtype)
        copy_extra_files(self.folder, folder)
        tokenizer.save_pretrained(folder)
        if (self.folder / "generation_config.json").is_file() and self.folder.resolve() != folder.resolve():
            shutil.copyfile(self.folder / "generation_config.json", folder / "generation_config.json")


def build(options: dict[str, Any]) -> Qwen2VLFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/qwen2_vl``)."""
    return Qwen2VLFoundation(options)
