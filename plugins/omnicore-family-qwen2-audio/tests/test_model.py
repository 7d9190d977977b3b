"""The whole family through omnicore's run path (one foundation entry) against transformers'
``Qwen2AudioForConditionalGeneration`` and ``Qwen2AudioProcessor`` on the same clips (fp32):
omnicore's family parity suite (:class:`omnicore.testing.FamilyParitySuite`: ids, logits on text
only, one clip and two clips, a packed row, the loss on the assistant tokens, the export read back
by ``from_pretrained``), and what only this family brings.

Samples write the published template's ``Audio N: `` prefix and the newline after each clip as
text parts (omnicore renders the text around media itself; see README.md). Two FSDP2 processes
against one: ``tests/test_families_fsdp2.py``.
"""

from __future__ import annotations

import omnicore_family_qwen2_audio.plugin
from omnicore.testing import FamilyParitySuite


class TestQwen2AudioParity(FamilyParitySuite):
    foundation = "qwen2_audio"
    plugins = [(omnicore_family_qwen2_audio.plugin, "omnicore-family-qwen2-audio")]
    hf_class = "Qwen2AudioForConditionalGeneration"
    samples = [
        ([{"type": "text", "text": "Say hi"}], "hi there"),
        ([{"type": "text", "text": "Audio 1: "}, {"type": "audio", "path": "a.wav"}, {"type": "text", "text": "\nWhat is it?"}], "noise"),
        (
            [
                {"type": "text", "text": "Audio 1: "},
                {"type": "audio", "path": "b.wav"},
                {"type": "text", "text": "\nAudio 2: "},
                {"type": "audio", "path": "a.wav"},
                {"type": "text", "text": "\nWhich is longer?"},
            ],
            "the first",
        ),
    ]
    media = {"a.wav": 5600, "b.wav": 30001}  # 0.35 s and 1.9 s at 16 kHz
    end_of_turn = "<|im_end|>"
    test_two_fsdp2_processes_equal_one = None  # tests/test_families_fsdp2.py runs this stand-in

    def hf_messages(self, user, answer):
        """The template writes ``Audio N: `` and a newline per clip, then the text: one audio part per
        clip and the last text line."""
        content = [{"type": "audio", "audio_url": p["path"]} for p in user if p["type"] == "audio"]
        texts = [p["text"] for p in user if p["type"] == "text"]
        content.append({"type": "text", "text": texts[-1].split("\n")[-1] if len(texts) > 1 else texts[0]})
        return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]

    def test_one_entry_brings_the_audio_encoder_and_keeps_the_vocabulary(self, family_run, standin):
        from transformers import AutoTokenizer

        model, tok = family_run.model, family_run.tokenizer
        assert list(model.encoders) == ["audio"] and type(model.encoders["audio"]).__name__ == "Qwen2AudioTower"
        assert tok.get_vocab() == AutoTokenizer.from_pretrained(standin).get_vocab()
        assert sorted(model.part_names) == ["audio_tower", "language_model", "multi_modal_projector"]
