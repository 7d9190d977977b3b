"""Where each part of a Qwen2-VL / Qwen2.5-VL checkpoint lives, in both layouts it is found in:
one :class:`~omnicore_family_kit.keymap.KeyMap` per part, read both ways (checkpoint -> module
names for :func:`omnicore.api.plan_checkpoint`, module -> class names for the export).

* The in-memory layout of transformers 5's ``...ForConditionalGeneration`` (its ``state_dict``,
  which its ``from_pretrained`` loads too): ``model.visual.*``, ``model.language_model.*``,
  ``lm_head.*``.
* The published layout (``Qwen/Qwen2-VL-2B-Instruct``, ``Qwen/Qwen2.5-VL-3B-Instruct``; also what
  transformers 5's ``save_pretrained`` writes, its conversion mapping reversed): ``visual.*`` (the
  tower and its ``visual.merger.*``), ``model.embed_tokens.*``, ``model.layers.*``,
  ``model.norm.*``, ``lm_head.*``: the modules' own names.
"""

from __future__ import annotations

from omnicore_family_kit.keymap import KeyMap

LEGACY = {
    "visual.": "model.visual.",
    "model.embed_tokens.": "model.language_model.embed_tokens.",
    "model.layers.": "model.language_model.layers.",
    "model.norm.": "model.language_model.norm.",
}
"""The published layout's prefixes -> the class's."""
TOWER = KeyMap(parts={"visual.": "model.visual."}, legacy=LEGACY, others=("model.language_model.", "lm_head."))
"""The vision encoder (``encoder/qwen2_vl_encoder``): the tower with its merger."""
LM = KeyMap(parts={"model.": "model.language_model.", "lm_head.": "lm_head."}, legacy=LEGACY, others=("model.visual.",))
"""The mRoPE text LM under its head (``foundation/qwen2_vl``)."""
