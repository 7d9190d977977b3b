"""Where each part of a Qwen2-Audio checkpoint lives, in both layouts it is found in.

* The published layout (``Qwen/Qwen2-Audio-7B-Instruct``; also what transformers 5's
  ``save_pretrained`` writes, its conversion mapping reversed): ``audio_tower.*``,
  ``multi_modal_projector.*``, ``language_model.model.*``, ``language_model.lm_head.*``.
* The in-memory layout of transformers 5's ``Qwen2AudioForConditionalGeneration``
  (``model.audio_tower.*``, ``model.multi_modal_projector.*``, ``model.language_model.*``,
  ``lm_head.*``), which its ``from_pretrained`` also loads.

The components pass these to :func:`omnicore.api.plan_checkpoint` (``renames`` for their own
part, ``other_parts`` for the rest): the core's strict, sharded load plan, filled after sharding;
:func:`omnicore.api.fill_now` fills one at once on this process (tests and tools).
"""

from __future__ import annotations

TOWER_RENAMES = {"model.audio_tower.": "audio_tower.", "model.multi_modal_projector.": "multi_modal_projector."}
"""Checkpoint prefix -> the encoder module's parameter prefix (the published names are the module's own)."""
LM_RENAMES = {"model.language_model.": "model.", "language_model.model.": "model.", "language_model.lm_head.": "lm_head."}
"""Checkpoint prefix -> the text LM's (``Qwen2ForCausalLM``) parameter prefix; ``lm_head.*`` is its own."""
TOWER_PARTS = ("model.audio_tower", "model.multi_modal_projector", "audio_tower", "multi_modal_projector")
LM_PARTS = ("model.language_model", "language_model", "lm_head")
