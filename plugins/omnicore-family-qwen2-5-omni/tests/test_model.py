"""The whole family through omnicore's run path (one foundation entry, ``use_audio_in_video: true``)
against transformers' ``Qwen2_5OmniThinkerForConditionalGeneration`` and ``Qwen2_5OmniProcessor``
on the same images, clips and sound (fp32): omnicore's family parity suite
(:class:`omnicore.testing.FamilyParitySuite`: ids, logits on text only, an image, audio, a silent
clip, a clip with its sound track, and all at once, the 3-D positions against ``get_rope_index``,
a packed row, the loss on the assistant tokens), and what only this family brings: the clip's
interleave of video and audio and greedy generation. The export (the talker carried along) is
``test_export.py``'s.

The clip with sound (6 frames at 2 fps, 3 s of sound) is written as its processor writes it with
``load_audio_from_video``: ``<|vision_bos|><|audio_bos|>``, then 2-second chunks of video tokens
(frame groups at 0, 1 and 2 s) and audio tokens (25 a second) in turn, then
``<|audio_eos|><|vision_eos|>``: two chunks each, so the interleave and the time-aligned positions
(TMRoPE) are both exercised; its audio rows come from the audio encoder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import omnicore_family_qwen2_5_omni.plugin
from omnicore.testing import FamilyParitySuite, generate_batch, read_jsonl


def _conftest():
    """This folder's ``conftest.py`` as pytest imported it (test modules cannot import it by name:
    the repository's ``conftest`` is first)."""
    path = Path(__file__).with_name("conftest.py")
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) and Path(m.__file__) == path)


class TestQwen2_5OmniParity(FamilyParitySuite):
    foundation = "qwen2_5_omni"
    foundation_options = {"use_audio_in_video": True}
    plugins = [(omnicore_family_qwen2_5_omni.plugin, "omnicore-family-qwen2-5-omni")]
    hf_class = "Qwen2_5OmniThinkerForConditionalGeneration"
    samples = [
        ([{"type": "text", "text": "Say hi"}], "hi there"),
        ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "What is it?"}], "noise"),
        ([{"type": "audio", "path": "s.wav"}, {"type": "text", "text": "What is said?"}], "a tone"),
        pytest.param([{"type": "video", "path": "c.mkv"}, {"type": "text", "text": "What happens?"}], "it flickers", id="silent_video"),
        pytest.param([{"type": "video", "path": "d.mkv"}, {"type": "text", "text": "What happens?"}], "it hums", id="video_with_audio"),
        (
            [
                {"type": "audio", "path": "t.wav"},
                {"type": "text", "text": "then"},
                {"type": "image", "path": "b.png"},
                {"type": "video", "path": "d.mkv"},
                {"type": "text", "text": "."},
            ],
            "all of it",
        ),
    ]
    media = {
        "a.png": (45, 60),
        "b.png": (120, 100),
        "s.wav": 20800,  # 1.3 s at 16 kHz
        "t.wav": 11200,  # 0.7 s
        "c.mkv": (4, 80, 50, 2),
        "d.mkv": (6, 56, 56, 2, 48000),  # 3 s of sound
    }
    mrope = True
    end_of_turn = "<|im_end|>"
    test_export_is_read_back_by_from_pretrained_with_the_same_logits = None  # test_export.py: the whole model and the thinker alone

    def load_hf_processor(self, folder):
        """The conftest's ``load_hf_processor`` (transformers' processor class, also without torchvision)."""
        return _conftest().load_hf_processor(folder)

    def media_counts(self, user):
        """The suite's, and each clip with a sound track once more as audio (``use_audio_in_video``)."""
        counts = super().media_counts(user)
        counts["audio"] += sum(1 for p in user if p["type"] == "video" and len(self.media[p["path"]]) == 5)
        return counts

    def hf_media(self, data, user):
        """Images, clips and sound in order; each clip's sound track is taken from its file (as
        ``load_audio_from_video`` takes it) and marked by ``audio_from_video_indices``."""
        from omnicore.api import load_audio, load_image, load_video

        images, clips, sound, slots = [], [], [], []
        for p in user:
            if p["type"] == "image":
                images.append(load_image(data / p["path"]))
            elif p["type"] == "audio":
                sound.append(load_audio(data / p["path"]).samples)
                slots.append(None)
            elif p["type"] == "video":
                clip = load_video(data / p["path"], audio=True)
                if clip.audio is not None:
                    sound.append(clip.audio.samples)
                    slots.append(len(clips))
                clips.append(clip.frames)
        out = {"images": images or None, "videos": clips or None, "audio": sound or None}
        if any(s is not None for s in slots):
            out.update(load_audio_from_video=True, audio_from_video_indices=slots)
        return out

    def hf_inputs(self, processor, data, user, answer, *, prompt_only=False):
        """The suite's, plus the thinker's ``use_audio_in_video`` (whether a clip carries sound)."""
        messages = self.hf_messages(user, answer)
        messages = messages[:-1] if prompt_only else messages
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt_only)
        media = self.hf_media(data, user)
        inputs = processor(text=text, return_tensors="pt", **media)
        inputs["use_audio_in_video"] = media.get("load_audio_from_video", False)
        return inputs

    def hf_positions(self, hf_model, inputs):
        """The thinker's ``get_rope_index`` with each clip's sound and each clip's seconds per frame group."""
        lengths = inputs["feature_attention_mask"].sum(-1) if "feature_attention_mask" in inputs else None
        positions, _ = hf_model.model.get_rope_index(
            inputs["input_ids"],
            inputs.get("image_grid_thw"),
            inputs.get("video_grid_thw"),
            inputs["attention_mask"],
            inputs["use_audio_in_video"],
            lengths,
            inputs.get("video_second_per_grid"),
        )
        return positions[:, 0]

    def test_one_entry_brings_both_towers(self, family_run, standin):
        from transformers import AutoTokenizer

        model, tok = family_run.model, family_run.tokenizer
        assert list(model.encoders) == ["image", "audio"]
        assert type(model.encoders["image"]).__name__ == "Qwen2_5OmniVisionTower"
        assert type(model.encoders["audio"]).__name__ == "Qwen2_5OmniAudioTower"
        assert model.shared["video"][0] == "image" and model.shared["video"][1].placeholder == "<|VIDEO|>"
        assert tok.get_vocab() == AutoTokenizer.from_pretrained(standin).get_vocab()
        assert sorted(model.part_names) == ["audio_tower", "language_model", "merger", "visual"]
        assert type(model.lm.model).__name__ == "Qwen2_5OmniThinkerTextModel"

    def test_the_clip_with_sound_is_interleaved_in_two_second_chunks(self, family_run):
        """Sample 4's clip: 3 frame groups of 4 tokens (at 0, 1, 2 s) and 75 audio tokens (3 s),
        written as video 0-1 s, audio 0-2 s, video 2 s, audio 2-3 s."""
        tok = family_run.tokenizer
        names = {tok.convert_tokens_to_ids(t): t for t in ("<|VIDEO|>", "<|AUDIO|>", "<|audio_bos|>", "<|vision_bos|>")}
        runs: list[list] = []
        for i in family_run.encoded[4].input_ids:
            name = names.get(i)
            if name in ("<|VIDEO|>", "<|AUDIO|>") and runs and runs[-1][0] == name:
                runs[-1][1] += 1
            elif name:
                runs.append([name, 1])
        assert runs == [
            ["<|vision_bos|>", 1],
            ["<|audio_bos|>", 1],
            ["<|VIDEO|>", 8],
            ["<|AUDIO|>", 50],
            ["<|VIDEO|>", 4],
            ["<|AUDIO|>", 25],
        ]

    def test_greedy_generation_equals_transformers_generate(self, family_run, hf_reference):
        """Greedy continuation of prompts with an image and with a clip and its sound: omnicore's
        batched generation (two prompts of other lengths, left-padded together) gives each prompt the
        tokens ``Qwen2_5OmniThinkerForConditionalGeneration.generate`` gives it alone."""
        model, tok = family_run.model, family_run.tokenizer
        rows = read_jsonl(family_run.data / "train.jsonl")
        stop = tok.convert_tokens_to_ids("<|im_end|>")
        prompts = [family_run.chat.encode(rows[k], prompt_only=True) for k in (1, 4)]
        got = generate_batch(model, tok, prompts, max_new_tokens=10, stop_id=stop)
        for k, prompt, out in zip((1, 4), prompts, got):
            user, answer, _, _ = self.sample_list()[k]
            inputs = self.hf_inputs(hf_reference.processor, family_run.data, user, answer, prompt_only=True)
            assert prompt.input_ids == inputs["input_ids"][0].tolist()
            with torch.no_grad():
                ids = hf_reference.model.generate(
                    **inputs, max_new_tokens=10, do_sample=False, eos_token_id=stop, pad_token_id=tok.pad_token_id
                )
            want = ids[0, inputs["input_ids"].shape[1] :].tolist()
            assert out["token_ids"] == want, k
            assert len(want) >= 4  # enough tokens to pass the prefill and several cached steps
