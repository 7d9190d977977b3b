"""Where each part of a Qwen2-VL / Qwen2.5-VL checkpoint lives, in both layouts it is found in.

* The published layout (``Qwen/Qwen2-VL-2B-Instruct``, ``Qwen/Qwen2.5-VL-3B-Instruct``; also what
  transformers 5's ``save_pretrained`` writes, its conversion mapping reversed): ``visual.*`` (the
  tower and its ``visual.merger.*``), ``model.embed_tokens.*``, ``model.layers.*``,
  ``model.norm.*``, ``lm_head.*``.
* The in-memory layout of transformers 5's ``...ForConditionalGeneration`` (``model.visual.*``,
  ``model.language_model.*``, ``lm_head.*``), which its ``from_pretrained`` also loads.

The components pass these to :func:`omnicore.api.plan_checkpoint` (``renames`` for their own
part, ``other_parts`` for the rest): the core's strict, sharded load plan, filled after sharding;
:func:`omnicore.api.fill_now` fills one at once on this process (tests and tools).
"""

from __future__ import annotations

TOWER_RENAMES = {"model.visual.": "visual."}
"""Checkpoint prefix -> the encoder module's parameter prefix (the published ``visual.*`` is its own)."""
LM_RENAMES = {"model.language_model.": "model."}
"""Checkpoint prefix -> the text LM's parameter prefix (the published ``model.*`` and ``lm_head.*`` are its own)."""
TOWER_PARTS = ("visual", "model.visual")
LM_PARTS = ("model.language_model", "model.embed_tokens", "model.layers", "model.norm", "lm_head")
