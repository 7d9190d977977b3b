"""Where each part of a Qwen3-VL checkpoint lives.

The published layout (``Qwen/Qwen3-VL-2B-Instruct``, and what transformers 5's ``save_pretrained``
of ``Qwen3VLForConditionalGeneration`` writes) is the in-memory one: ``model.visual.*`` (the tower,
its ``merger`` and ``deepstack_merger_list``), ``model.language_model.*`` and ``lm_head.*``. The
older top-level names (``visual.*``, ``model.embed_tokens.*``, ``model.layers.*``) load too.

The components pass these to :func:`omnicore.api.plan_checkpoint` (``renames`` for their own
part, ``other_parts`` for the rest): the core's strict, sharded load plan, filled after sharding;
:func:`omnicore.api.fill_now` fills one at once on this process (tests and tools).
"""

from __future__ import annotations

TOWER_RENAMES = {"model.visual.": "visual."}
"""Checkpoint prefix -> the encoder module's parameter prefix."""
LM_RENAMES = {"model.language_model.": "model."}
"""Checkpoint prefix -> the text LM's parameter prefix (``lm_head.*`` is its own)."""
TOWER_PARTS = ("visual", "model.visual")
LM_PARTS = ("model.language_model", "model.embed_tokens", "model.layers", "model.norm", "lm_head")
