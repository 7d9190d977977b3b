"""Where each part of a LLaVA checkpoint lives, in every layout it is found in: one
:class:`~omnicore_family_kit.keymap.KeyMap` per part, read both ways (checkpoint -> module names
for :func:`omnicore.api.plan_checkpoint`, module -> class names for the export).

* The in-memory layout of ``LlavaForConditionalGeneration`` (its ``state_dict``, which its
  ``from_pretrained`` loads too): ``model.vision_tower.*``, ``model.multi_modal_projector.*``,
  ``model.language_model.*``, ``lm_head.*``.
* What transformers 5's ``save_pretrained`` writes (its conversion mapping reversed; its CLIP and
  SigLIP towers have no ``vision_model`` level any more): ``vision_tower.*``,
  ``multi_modal_projector.*``, ``language_model.model.*``, ``language_model.lm_head.*``.
* The published layout (``llava-hf/llava-1.5-7b-hf``, written by transformers 4): as above with
  ``vision_tower.vision_model.*``; transformers 4.5x held ``model.vision_tower.vision_model.*``.

The encoder module's names are the saved ones (``vision_tower.*``, ``multi_modal_projector.*``),
the text LM's those of ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (``model.*``, ``lm_head.*``).
"""

from __future__ import annotations

from omnicore_family_kit.keymap import KeyMap

LEGACY = {
    "vision_tower.": "model.vision_tower.",
    "vision_tower.vision_model.": "model.vision_tower.",
    "model.vision_tower.vision_model.": "model.vision_tower.",
    "multi_modal_projector.": "model.multi_modal_projector.",
    "language_model.model.": "model.language_model.",
    "language_model.lm_head.": "lm_head.",
}
"""Checkpoint prefix -> ``LlavaForConditionalGeneration``'s, for the layouts other than its own."""
TOWER = KeyMap(
    parts={"vision_tower.": "model.vision_tower.", "multi_modal_projector.": "model.multi_modal_projector."},
    legacy=LEGACY,
    others=("model.language_model.", "lm_head."),
)
"""The image encoder (``encoder/llava_encoder``): the tower and the projector."""
LM = KeyMap(
    parts={"model.": "model.language_model.", "lm_head.": "lm_head."},
    legacy=LEGACY,
    others=("model.vision_tower.", "model.multi_modal_projector."),
)
"""The text LM under its head (``foundation/llava``)."""
