"""Where each part of a Qwen2-Audio checkpoint lives, in both layouts it is found in: one
:class:`~omnicore_family_kit.keymap.KeyMap` per part, read both ways (checkpoint -> module names
for :func:`omnicore.api.plan_checkpoint`, module -> class names for the export).

* The in-memory layout of transformers 5's ``Qwen2AudioForConditionalGeneration`` (its
  ``state_dict``, which its ``from_pretrained`` loads too): ``model.audio_tower.*``,
  ``model.multi_modal_projector.*``, ``model.language_model.*``, ``lm_head.*``.
* The published layout (``Qwen/Qwen2-Audio-7B-Instruct``; also what transformers 5's
  ``save_pretrained`` writes, its conversion mapping reversed): ``audio_tower.*``,
  ``multi_modal_projector.*`` (the encoder module's own names), ``language_model.model.*``,
  ``language_model.lm_head.*``.
"""

from __future__ import annotations

from omnicore_family_kit.keymap import KeyMap

LEGACY = {
    "audio_tower.": "model.audio_tower.",
    "multi_modal_projector.": "model.multi_modal_projector.",
    "language_model.model.": "model.language_model.",
    "language_model.lm_head.": "lm_head.",
}
"""The published layout's prefixes -> ``Qwen2AudioForConditionalGeneration``'s."""
TOWER = KeyMap(
    parts={"audio_tower.": "model.audio_tower.", "multi_modal_projector.": "model.multi_modal_projector."},
    legacy=LEGACY,
    others=("model.language_model.", "lm_head."),
)
"""The audio encoder (``encoder/qwen2_audio_encoder``): the tower and the projector."""
LM = KeyMap(
    parts={"model.": "model.language_model.", "lm_head.": "lm_head."},
    legacy=LEGACY,
    others=("model.audio_tower.", "model.multi_modal_projector."),
)
"""The Qwen2 text LM under its head (``foundation/qwen2_audio``)."""
