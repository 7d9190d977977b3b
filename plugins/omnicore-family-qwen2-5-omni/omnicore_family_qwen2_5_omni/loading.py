"""Where each part of a Qwen2.5-Omni checkpoint lives, in the layouts it is found in.

* The published layout of the whole model (``Qwen/Qwen2.5-Omni-7B``; also what transformers 5's
  ``Qwen2_5OmniForConditionalGeneration.save_pretrained`` writes): ``thinker.audio_tower.*``,
  ``thinker.visual.*``, ``thinker.model.*`` (the text model), ``thinker.lm_head.*``, and the
  speech side, ``talker.*`` and ``token2wav.*``, which omnicore leaves in the folder and carries
  into the export unchanged.
* A thinker alone (``Qwen2_5OmniThinkerForConditionalGeneration.save_pretrained``):
  ``audio_tower.*``, ``visual.*``, ``model.*``, ``lm_head.*``.
* The in-memory layouts of those classes (``thinker.model.audio_tower.*``,
  ``thinker.model.visual.*``, ``thinker.model.language_model.*``; without ``thinker.`` for the
  thinker alone), which their ``from_pretrained`` also loads.

The components pass these to :func:`omnicore.api.plan_checkpoint` (``renames`` for their own
part, ``other_parts`` for the rest): the core's strict, sharded load plan, filled after sharding;
:func:`omnicore.api.fill_now` fills one at once on this process (tests and tools).
"""

from __future__ import annotations

AUDIO_RENAMES = {"thinker.audio_tower.": "audio_tower.", "thinker.model.audio_tower.": "audio_tower.", "model.audio_tower.": "audio_tower."}
"""Checkpoint prefix -> the audio encoder module's parameter prefix (a thinker's ``audio_tower.*`` is its own)."""
VISION_RENAMES = {"thinker.visual.": "visual.", "thinker.model.visual.": "visual.", "model.visual.": "visual."}
"""Checkpoint prefix -> the vision encoder module's parameter prefix (a thinker's ``visual.*`` is its own)."""
LM_RENAMES = {
    "thinker.model.language_model.": "model.",
    "thinker.model.": "model.",
    "thinker.lm_head.": "lm_head.",
    "model.language_model.": "model.",
}
"""Checkpoint prefix -> the text LM's parameter prefix (a thinker's ``model.*`` and ``lm_head.*`` are its own)."""
AUDIO_PARTS = ("thinker.audio_tower", "thinker.model.audio_tower", "audio_tower", "model.audio_tower")
VISION_PARTS = ("thinker.visual", "thinker.model.visual", "visual", "model.visual")
LM_PARTS = ("thinker.model", "thinker.lm_head", "model", "lm_head")
SPEECH_PARTS = ("talker", "token2wav")
"""The speech side of the whole model: read by no component, copied into the export byte for byte."""
