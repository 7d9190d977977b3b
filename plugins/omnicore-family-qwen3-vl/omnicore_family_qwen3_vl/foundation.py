"""``foundation/qwen3_vl``: a published Qwen3-VL checkpoint as one config entry.

The LM in omnicore's model is the checkpoint's text model under its LM head
(:func:`omnicore.api.build_mrope_lm`: ``Qwen3VLTextModel``, which interleaves the three mRoPE
axes' frequencies itself and takes omnicore's ``[4, B, T]`` positions as they are: row 0 the 1-D
positions that keep packed samples apart, then time, height, width). :meth:`layer_inputs` hands it
the DeepStack rows of the vision tower; the tokenizer and chat template are the checkpoint's;
:meth:`Qwen3VLFoundation.encoders` brings the vision tower (``encoder/qwen3_vl_encoder``) for images
and the same module for video; :meth:`export_pretrained` writes the published layout back, which
``Qwen3VLForConditionalGeneration.from_pretrained`` loads.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from omnicore.api import build_mrope_lm, embedding_names, on_meta, plan_checkpoint
from omnicore_family_qwen3_vl.loading import LM
from omnicore_family_qwen3_vl.processor import IMAGE_PAD, VIDEO_PAD, WRAP, Qwen3VLFoundationOptions, checkpoint_folder

WHAT = "model.foundation.options.checkpoint"

logger = logging.getLogger(__name__)


class Qwen3VLFoundation:
    """The :class:`omnicore.api.Foundation` of a Qwen3-VL checkpoint (reads no weights until
    :meth:`build_model`'s plan is filled).

    Args:
        options: :class:`~omnicore_family_qwen3_vl.processor.Qwen3VLFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a Qwen3-VL one (naming the field).
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = Qwen3VLFoundationOptions.model_validate(dict(options or {}))
        self.folder = checkpoint_folder(self.options.checkpoint, WHAT)

    def config(self) -> Any:
        """The checkpoint's ``Qwen3VLConfig``."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(self.folder))

    def build_tokenizer(self) -> Any:
        """The checkpoint's tokenizer with its chat template (``AutoTokenizer.from_pretrained``)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.folder))

    def build_model(self, vocab_size: int, dtype: Any = None) -> Any:
        """The text LM under its head, on the meta device with the plan that reads the checkpoint's
        language-model tensors after sharding. Logs the checkpoint's model type and class.

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
        logger.info("foundation qwen3_vl: %s is a %s checkpoint (%s)", self.folder, config.model_type, arch)
        with on_meta():
            model = build_mrope_lm(config, vocab_size=vocab_size, dtype=dtype)
        model.tie_weights()
        model.omnicore_pending_load = plan_checkpoint(
            model, self.folder, renames=LM.renames(), other_parts=LM.other_parts(), what=WHAT, grow=embedding_names(model)
        )
        return model

    def layer_inputs(self, mask: Any, per_layer: list[Any]) -> dict[str, Any]:
        """The DeepStack keyword arguments of ``Qwen3VLTextModel.forward``: ``visual_pos_masks``
        (bool ``[B, T]``, the image and video placeholders) and ``deepstack_visual_embeds`` (one
        ``[n, H]`` per layer: added to the hidden states at those positions after decoder layer
        ``k``, for the first ``len(per_layer)`` layers)."""
        return {"visual_pos_masks": mask, "deepstack_visual_embeds": list(per_layer)}

    def encoders(self) -> dict[str, dict[str, Any]]:
        """The entries the checkpoint brings: ``image`` (``encoder/qwen3_vl_encoder``) and ``video``
        (its processor only; its clips go to the image module: ``share: image``)."""
        folder = str(self.folder)
        return {
            "image": {"name": "qwen3_vl_encoder", "options": {"checkpoint": folder}},
            "video": {"name": "qwen3_vl_encoder", "options": {"checkpoint": folder, "modality": "video"}, "share": "image"},
        }

    def part_names(self) -> dict[str, list[str]]:
        """Family part names for ``train.freeze`` / ``train.lr_multipliers``: ``visual`` (the tower's
        patch and position embeddings and blocks), ``merger`` (its merger and DeepStack mergers) and
        ``language_model``, with the tower under the key ``image`` as :meth:`encoders` brings it."""
        tower = "encoders.image.visual."
        return {
            "visual": [tower + "patch_embed.", tower + "pos_embed.", tower + "blocks."],
            "merger": [tower + "merger.", tower + "deepstack_merger_list."],
            "language_model": ["lm."],
        }

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` in the published layout: the trained tensors under
        ``Qwen3VLForConditionalGeneration``'s names (:data:`~omnicore_family_qwen3_vl.loading.TOWER`,
        :data:`~omnicore_family_qwen3_vl.loading.LM`), written by its own ``save_pretrained``
        (:func:`omnicore_family_kit.export.save_through_class`: ``config.json`` with the trained
        vocabulary size and the tokenizer's ids of the vision tokens, the safetensors under the
        names it writes: ``model.visual.*``, ``model.language_model.*``, ``lm_head.*``, no
        ``lm_head`` when the embeddings are tied); then the tokenizer with its chat template, the
        source's processor files and ``generation_config.json`` if it has one.

        Args:
            model: an unsharded CPU OmniModel (LoRA merged) whose vision encoder is this family's.

        Raises:
            ValueError: the model has not exactly one Qwen3-VL vision encoder; RuntimeError: its
                tensors do not fill the class (strict, both ways).
        """
        from transformers import Qwen3VLForConditionalGeneration

        from omnicore_family_kit.export import class_state, copy_extra_files, save_through_class
        from omnicore_family_qwen3_vl.encoder import Qwen3VLVisionTower
        from omnicore_family_qwen3_vl.loading import TOWER

        towers = [m for m in model.encoders.values() if isinstance(m, Qwen3VLVisionTower)]
        if len(towers) != 1:
            raise ValueError(f"qwen3_vl export: the model needs exactly one encoder/qwen3_vl_encoder module, found {len(towers)}")
        tower, lm = towers[0], model.lm
        folder = Path(folder)
        config = self.config()
        config.text_config.vocab_size = int(lm.get_input_embeddings().weight.shape[0])
        tokens = {
            "image_token_id": IMAGE_PAD,
            "video_token_id": VIDEO_PAD,
            "vision_start_token_id": WRAP[0],
            "vision_end_token_id": WRAP[1],
        }
        for key, token in tokens.items():
            setattr(config, key, int(tokenizer.convert_tokens_to_ids(token)))
        state = class_state([(tower, TOWER), (lm, LM)])
        save_through_class(Qwen3VLForConditionalGeneration, config, state, folder, dtype=lm.get_input_embeddings().weight.dtype)
        copy_extra_files(self.folder, folder)
        tokenizer.save_pretrained(folder)
        if (self.folder / "generation_config.json").is_file() and self.folder.resolve() != folder.resolve():
            shutil.copyfile(self.folder / "generation_config.json", folder / "generation_config.json")


def build(options: dict[str, Any]) -> Qwen3VLFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/qwen3_vl``)."""
    return Qwen3VLFoundation(options)
