"""Where each part of a Qwen2.5-Omni checkpoint lives, in the layouts it is found in: one
:class:`~omnicore_family_kit.keymap.KeyMap` per part of the thinker, read both ways (checkpoint ->
module names for :func:`omnicore.api.plan_checkpoint`, module -> class names for the export).

* The in-memory layout of ``Qwen2_5OmniForConditionalGeneration`` (the class names of the maps
  below): ``thinker.model.audio_tower.*``, ``thinker.model.visual.*``,
  ``thinker.model.language_model.*``, ``thinker.lm_head.*``, and the speech side, ``talker.*`` and
  ``token2wav.*``, which omnicore never builds and carries into the export unchanged.
* What its ``save_pretrained`` writes (the published ``Qwen/Qwen2.5-Omni-7B``):
  ``thinker.audio_tower.*``, ``thinker.visual.*``, ``thinker.model.*`` (the text model),
  ``thinker.lm_head.*``, ``talker.*``, ``token2wav.*``.
* A thinker alone (``Qwen2_5OmniThinkerForConditionalGeneration``): in memory ``model.audio_tower.*``,
  ``model.visual.*``, ``model.language_model.*``, ``lm_head.*``; as it saves itself
  ``audio_tower.*``, ``visual.*``, ``model.*``, ``lm_head.*`` (the modules' own names), or with
  ``thinker.`` in front after it was loaded from the whole model.
"""

from __future__ import annotations

from omnicore_family_kit.keymap import KeyMap

THINKER = "thinker."
"""Where the whole class holds the thinker."""
SPEECH = ("talker.", "token2wav.")
"""The whole class's speech side: read by no component, copied into the export as stored."""

_TEXT = ("embed_tokens.", "layers.", "norm.")
LEGACY = {
    # the whole model as saved
    "thinker.audio_tower.": "thinker.model.audio_tower.",
    "thinker.visual.": "thinker.model.visual.",
    **{f"thinker.model.{t}": f"thinker.model.language_model.{t}" for t in _TEXT},
    # a thinker alone, in memory
    "model.audio_tower.": "thinker.model.audio_tower.",
    "model.visual.": "thinker.model.visual.",
    "model.language_model.": "thinker.model.language_model.",
    "lm_head.": "thinker.lm_head.",
    # a thinker alone as saved
    "audio_tower.": "thinker.model.audio_tower.",
    "visual.": "thinker.model.visual.",
    **{f"model.{t}": f"thinker.model.language_model.{t}" for t in _TEXT},
}
"""Every other layout's prefixes -> ``Qwen2_5OmniForConditionalGeneration``'s."""
AUDIO = KeyMap(
    parts={"audio_tower.": "thinker.model.audio_tower."},
    legacy=LEGACY,
    others=("thinker.model.visual.", "thinker.model.language_model.", "thinker.lm_head.", *SPEECH),
)
"""The audio encoder (``encoder/qwen2_5_omni_audio``)."""
VISION = KeyMap(
    parts={"visual.": "thinker.model.visual."},
    legacy=LEGACY,
    others=("thinker.model.audio_tower.", "thinker.model.language_model.", "thinker.lm_head.", *SPEECH),
)
"""The vision encoder (``encoder/qwen2_5_omni_vision``): the tower with its merger."""
LM = KeyMap(
    parts={"model.": "thinker.model.language_model.", "lm_head.": "thinker.lm_head."},
    legacy=LEGACY,
    others=("thinker.model.audio_tower.", "thinker.model.visual.", *SPEECH),
)
"""The thinker's text LM under its head (``foundation/qwen2_5_omni``)."""


def in_thinker(keys: KeyMap) -> KeyMap:
    """The same part in ``Qwen2_5OmniThinkerForConditionalGeneration``: the class names without
    :data:`THINKER` (for writing a thinker-only folder; reading takes the maps above)."""
    return KeyMap(parts={ours: theirs.removeprefix(THINKER) for ours, theirs in keys.parts.items()})
