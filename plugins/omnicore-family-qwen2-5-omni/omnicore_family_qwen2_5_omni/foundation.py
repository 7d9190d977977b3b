"""``foundation/qwen2_5_omni``: a published Qwen2.5-Omni checkpoint as one config entry.

The LM in omnicore's model is the thinker's mRoPE text model under its LM head
(:func:`omnicore.api.build_mrope_lm`: ``Qwen2_5OmniThinkerTextModel``, keys ``model.*`` and
``lm_head.*``), read from the checkpoint's thinker tensors in any of its layouts; the tokenizer
and chat template are the checkpoint's, unchanged; :meth:`Qwen2_5OmniFoundation.encoders` brings
the thinker's vision tower (images, and clips through the same module) and audio tower. The
talker and token2wav (the speech side) are never built: they are not trained, and
:meth:`~Qwen2_5OmniFoundation.export_pretrained` copies their tensors from the checkpoint into the
export unchanged, next to the trained thinker, so that
``Qwen2_5OmniForConditionalGeneration.from_pretrained`` loads the whole model back (a thinker-only
checkpoint exports a thinker-only folder).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnicore_family_kit.foundation import FamilyFoundation
from omnicore_family_qwen2_5_omni.loading import LM, SPEECH
from omnicore_family_qwen2_5_omni.plugin import MODEL_TYPES
from omnicore_family_qwen2_5_omni.processor import (
    AUDIO_PAD,
    AUDIO_WRAP,
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_WRAP,
    WHAT_TO_PUT,
    Qwen2_5OmniFoundationOptions,
)

WHAT = "model.foundation.options.checkpoint"
TOKEN_IDS = {
    "audio_token_index": AUDIO_PAD,
    "image_token_index": IMAGE_PAD,
    "video_token_index": VIDEO_PAD,
    "audio_start_token_id": AUDIO_WRAP[0],
    "audio_end_token_id": AUDIO_WRAP[1],
    "vision_start_token_id": VISION_WRAP[0],
    "vision_end_token_id": VISION_WRAP[1],
}
"""The media token ids the thinker (and talker) configs hold -> their token strings."""
SPEECH_FILES = ("spk_dict.pt", "generation_config.json")
"""Files of a published folder the export copies as they are (the speakers the talker reads;
``from_pretrained`` of the whole model requires ``spk_dict.pt``)."""


class Qwen2_5OmniFoundation(FamilyFoundation):
    """The :class:`omnicore.api.Foundation` of a Qwen2.5-Omni checkpoint (reads no weights until
    :meth:`build_model`'s plan is filled). Its LM is the thinker's (:meth:`lm_config`), rotating by
    mRoPE; building it logs whether the checkpoint carries the speech side.

    Args:
        options: :class:`~omnicore_family_qwen2_5_omni.processor.Qwen2_5OmniFoundationOptions`.

    Raises:
        ValueError: the checkpoint folder is not a Qwen2.5-Omni one (naming the field).
    """

    family = "qwen2_5_omni"
    model_types = MODEL_TYPES
    what_to_put = WHAT_TO_PUT
    options_model = Qwen2_5OmniFoundationOptions
    lm_keys = LM
    mrope = True
    encoder_entries = {
        "image": {"name": "qwen2_5_omni_vision"},
        "video": {
            "name": "qwen2_5_omni_vision",
            "options": {"modality": "video", "use_audio_in_video": ..., "long_audio": ..., "video_fps": ...},
            "share": "image",
        },
        "audio": {"name": "qwen2_5_omni_audio", "options": {"long_audio": ...}},
    }
    """``image``: the vision tower with its merger; ``video``: its processor only, its clips go to
    the image module; ``audio``: the audio tower. The foundation's options pass through."""
    part_prefixes = {
        "audio_tower": ["encoders.audio.audio_tower."],
        "visual": ["encoders.image.visual.patch_embed.", "encoders.image.visual.blocks."],
        "merger": ["encoders.image.visual.merger."],
        "language_model": ["lm."],
    }
    """``visual``: the vision tower's patch embedding and blocks; ``merger``: its patch merger. The
    talker and token2wav are no part of the model (never trained)."""

    def thinker_config(self, config: Any = None) -> Any:
        """The thinker's config of ``config`` (default: the checkpoint's)."""
        config = self.config() if config is None else config
        return config.thinker_config if config.model_type == "qwen2_5_omni" else config

    def lm_config(self, config: Any) -> Any:
        """The thinker's config: its text model is the LM."""
        return self.thinker_config(config)

    def describe(self, config: Any) -> str:
        """Whether the checkpoint carries the talker and token2wav into the export, or is a thinker alone."""
        return "with its talker and token2wav, carried into the export unchanged" if config.model_type == "qwen2_5_omni" else "thinker only"

    def thinker_parts(self, model: Any) -> list[tuple[Any, Any]]:
        """``(module, key map)`` of each trained part of the thinker: the audio and vision encoder
        modules and the LM (:mod:`omnicore_family_qwen2_5_omni.loading`).

        Raises:
            ValueError: the model has not exactly one audio and one vision encoder of this family.
        """
        from omnicore_family_qwen2_5_omni.encoder import Qwen2_5OmniAudioTower, Qwen2_5OmniVisionTower

        audio = self.one_module(model.encoders, Qwen2_5OmniAudioTower, "encoder/qwen2_5_omni_audio")
        vision = self.one_module(model.encoders, Qwen2_5OmniVisionTower, "encoder/qwen2_5_omni_vision")
        return [(audio, audio.keys), (vision, vision.keys), (model.lm, LM)]

    def speech_tensors(self) -> dict[str, Any]:
        """The checkpoint's ``talker.*`` and ``token2wav.*`` tensors as stored (dtype and values
        unchanged; their saved names are the class's), read file by file; empty for a thinker-only
        checkpoint.

        Raises:
            ValueError: a whole-model checkpoint with audio output holds none of them.
        """
        from safetensors import safe_open

        index = self.folder / "model.safetensors.index.json"
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
        out: dict[str, Any] = {}
        for name in files:
            with safe_open(str(self.folder / name), "pt") as f:
                out.update({key: f.get_tensor(key) for key in f.keys() if key.startswith(SPEECH)})
        config = self.config()
        if not out and config.model_type == "qwen2_5_omni" and config.enable_audio_output:
            raise ValueError(
                f"qwen2_5_omni export: {self.folder} is a whole Qwen2.5-Omni checkpoint without talker.* or token2wav.* tensors"
            )
        return out

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` as the checkpoint's class writes itself: ``Qwen2_5OmniForConditionalGeneration``
        (or, for a thinker alone, ``Qwen2_5OmniThinkerForConditionalGeneration``) built on the meta
        device, given the trained thinker (its parts' key maps) and, for a whole model, the
        checkpoint's ``talker.*`` and ``token2wav.*`` tensors unchanged (:meth:`speech_tensors`), and
        written by its own ``save_pretrained`` (``config.json`` with the trained vocabulary size and
        the tokenizer's ids of the media tokens, the safetensors under the names it writes:
        ``thinker.audio_tower.*``, ``thinker.visual.*``, ``thinker.model.*``, ``thinker.lm_head.*``,
        ``talker.*``, ``token2wav.*``; without ``thinker.`` and the speech side for a thinker alone).
        Then the source's processor files, the tokenizer with its chat template, ``spk_dict.pt`` and
        ``generation_config.json``
        (:meth:`~omnicore_family_kit.foundation.FamilyFoundation.write_export`).

        Raises:
            ValueError: not exactly one audio and one vision encoder of this family, or see
                :meth:`speech_tensors`; RuntimeError: the tensors do not fill the class.
        """
        from transformers import Qwen2_5OmniForConditionalGeneration, Qwen2_5OmniThinkerForConditionalGeneration

        from omnicore_family_qwen2_5_omni.loading import in_thinker

        config = self.config()
        whole = config.model_type == "qwen2_5_omni"
        parts = self.thinker_parts(model)
        thinker_cfg = self.thinker_config(config)
        thinker_cfg.text_config.vocab_size = int(model.lm.get_input_embeddings().weight.shape[0])
        for key, token in TOKEN_IDS.items():
            value = int(tokenizer.convert_tokens_to_ids(token))
            setattr(thinker_cfg, key, value)
            if whole and hasattr(config.talker_config, key):
                setattr(config.talker_config, key, value)
        if whole:
            cls, speech = Qwen2_5OmniForConditionalGeneration, self.speech_tensors()
        else:
            cls, speech, parts = Qwen2_5OmniThinkerForConditionalGeneration, None, [(m, in_thinker(keys)) for m, keys in parts]
        self.write_export(folder, model, cls, config, parts, tokenizer=tokenizer, state=speech, copied=SPEECH_FILES)

    def speak(
        self, prompt: Any, processors: dict[str, Any], *, max_new_tokens: int, seed: int, stop_id: int | None = None
    ) -> dict[str, Any]:
        """The answer to one encoded prompt, written by the thinker and spoken by the talker and
        token2wav: transformers' ``Qwen2_5OmniForConditionalGeneration.generate`` on this
        checkpoint folder (an export holds the trained thinker next to the talker), the thinker
        greedy, the talker sampling as transformers' defaults do (seeded by ``seed``). Pixels go to
        the thinker alone (``thinker_pixel_values``: transformers 5.25 hands unprefixed inputs to
        the talker's ``generate`` too, which refuses them); the grids go to both.

        Args:
            prompt: ``ChatProcessor.encode(sample, prompt_only=True)``: ``input_ids`` and ``media``
                (their features under the thinker's input names, as the processors collate them).
            processors: modality -> the encoders' processors (``OmniModel.encoder_processors()``).
            max_new_tokens: text tokens at most; stop_id: the end-of-turn id (the thinker's eos).

        Returns:
            ``{"text": str, "token_ids": [int], "audio": omnicore.api.Audio}`` (mono float32 at
            24 kHz, token2wav's rate; ``token_ids`` as ``omnicore generate`` gives them).

        Raises:
            ValueError: the folder holds a thinker alone, or the speaker is not in its ``spk_dict.pt``.
        """
        import torch

        from omnicore.api import Audio

        config = self.config()
        if config.model_type != "qwen2_5_omni" or not config.enable_audio_output:
            raise ValueError(
                f"{WHAT}: {self.folder} holds no talker (a thinker alone, or enable_audio_output: false); speak with a whole "
                "Qwen2_5OmniForConditionalGeneration folder or its export"
            )
        model = self._speech_model()
        if self.options.speaker not in model.speaker_map:
            have = ", ".join(sorted(model.speaker_map)) or "none"
            raise ValueError(
                f"model.foundation.options.speaker: {self.options.speaker!r} is not in {self.folder}/spk_dict.pt (speakers: {have})"
            )
        ids = torch.tensor([list(prompt.input_ids)])
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        groups: dict[str, list[Any]] = {}
        for side, m, features in prompt.media:
            if side == "encoder":
                groups.setdefault(m, []).append(features)
        for m, items in groups.items():
            inputs.update(processors[m].collate(items))
        if "video_second_per_grid" in inputs:  # float32, as transformers' processor hands it over
            inputs["video_second_per_grid"] = inputs["video_second_per_grid"].float()
        for key in ("pixel_values", "pixel_values_videos"):  # the thinker's alone: generate hands other inputs to the talker too
            if key in inputs:
                inputs["thinker_" + key] = inputs.pop(key)
        thinker = self.thinker_config(config)
        pairs = zip(prompt.input_ids, prompt.input_ids[1:])
        with_sound = any(a == thinker.vision_start_token_id and b == thinker.audio_start_token_id for a, b in pairs)
        talker = config.talker_config
        extra = {} if stop_id is None else {"thinker_eos_token_id": stop_id}
        torch.manual_seed(seed)
        with torch.no_grad():
            sequences, wav = model.generate(
                **inputs,
                speaker=self.options.speaker,
                use_audio_in_video=with_sound,
                thinker_max_new_tokens=max_new_tokens,
                thinker_do_sample=False,
                talker_eos_token_id=[talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id],
                **extra,
            )
        new = sequences[0, ids.shape[1] :].tolist()
        tok = self._speech_tokenizer()
        text = tok.decode([t for t in new if t != stop_id], skip_special_tokens=True)
        return {"text": text, "token_ids": new, "audio": Audio(samples=wav.reshape(-1).float().cpu().numpy(), sample_rate=24000)}

    def _speech_model(self) -> Any:
        """transformers' whole model of this folder (read once, kept), in eval mode."""
        if getattr(self, "_speech", None) is None:
            from transformers import Qwen2_5OmniForConditionalGeneration

            self._speech = Qwen2_5OmniForConditionalGeneration.from_pretrained(str(self.folder), dtype="auto").eval()
        return self._speech

    def _speech_tokenizer(self) -> Any:
        if getattr(self, "_tokenizer", None) is None:
            self._tokenizer = self.build_tokenizer()
        return self._tokenizer


def build(options: dict[str, Any]) -> Qwen2_5OmniFoundation:
    """The foundation factory (``ComponentSpec.target`` of ``foundation/qwen2_5_omni``)."""
    return Qwen2_5OmniFoundation(options)
