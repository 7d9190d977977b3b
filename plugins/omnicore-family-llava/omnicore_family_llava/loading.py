"""Where each part of a LLaVA checkpoint lives, in every layout it is found in.

* The published layout (``llava-hf/llava-1.5-7b-hf``, written by transformers 4):
  ``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``language_model.model.*``,
  ``language_model.lm_head.*``.
* What transformers 5's ``save_pretrained`` writes (its conversion mapping reversed; its CLIP and
  SigLIP towers have no ``vision_model`` level any more): ``vision_tower.*``,
  ``multi_modal_projector.*``, ``language_model.model.*``, ``language_model.lm_head.*``.
* The in-memory layout of ``LlavaForConditionalGeneration`` (``model.vision_tower.*``, with
  ``vision_model.`` under transformers 4.5x, ``model.multi_modal_projector.*``,
  ``model.language_model.*``, ``lm_head.*``), which its ``from_pretrained`` also loads.

The components pass these to :func:`omnicore.api.plan_checkpoint` (``renames`` for their own
part, ``other_parts`` for the rest): the core's strict, sharded load plan, filled after sharding;
:func:`omnicore.api.fill_now` fills one at once on this process (tests and tools).
"""

from __future__ import annotations

TOWER_RENAMES = {
    "vision_tower.vision_model.": "vision_tower.",
    "model.vision_tower.vision_model.": "vision_tower.",
    "model.vision_tower.": "vision_tower.",
    "model.multi_modal_projector.": "multi_modal_projector.",
}
"""Checkpoint prefix -> the encoder module's parameter prefix (transformers 5's saved names,
``vision_tower.*`` and ``multi_modal_projector.*``, are the module's own)."""
LM_RENAMES = {"model.language_model.": "model.", "language_model.model.": "model.", "language_model.lm_head.": "lm_head."}
"""Checkpoint prefix -> the text LM's (``LlamaForCausalLM``, ``Qwen2ForCausalLM``) parameter prefix;
``lm_head.*`` is its own."""
TOWER_PARTS = ("model.vision_tower", "model.multi_modal_projector", "vision_tower", "multi_modal_projector")
LM_PARTS = ("model.language_model", "language_model", "lm_head")
