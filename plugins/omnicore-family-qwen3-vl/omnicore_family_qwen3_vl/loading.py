"""Where each part of a Qwen3-VL checkpoint lives: one
:class:`~omnicore_family_kit.keymap.KeyMap` per part, read both ways (checkpoint -> module names
for :func:`omnicore.api.plan_checkpoint`, module -> class names for the export).

The published layout (``Qwen/Qwen3-VL-2B-Instruct``, and what transformers 5's ``save_pretrained``
of ``Qwen3VLForConditionalGeneration`` writes) is the in-memory one: ``model.visual.*`` (the tower,
its ``merger`` and ``deepstack_merger_list``), ``model.language_model.*`` and ``lm_head.*``. The
older top-level names (``visual.*``, ``model.embed_tokens.*``, ``model.layers.*``), which are the
modules' own, load too.
"""

from __future__ import annotations

from omnicore_family_kit.keymap import KeyMap

LEGACY = {
    "visual.": "model.visual.",
    "model.embed_tokens.": "model.language_model.embed_tokens.",
    "model.layers.": "model.language_model.layers.",
    "model.norm.": "model.language_model.norm.",
}
"""The older top-level prefixes -> ``Qwen3VLForConditionalGeneration``'s."""
TOWER = KeyMap(parts={"visual.": "model.visual."}, legacy=LEGACY, others=("model.language_model.", "lm_head."))
"""The vision encoder (``encoder/qwen3_vl_encoder``): the tower with its mergers."""
LM = KeyMap(parts={"model.": "model.language_model.", "lm_head.": "lm_head."}, legacy=LEGACY, others=("model.visual.",))
"""The text LM under its head (``foundation/qwen3_vl``)."""
