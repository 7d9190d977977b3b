"""The whole family through omnicore's run path (one foundation entry) against transformers'
``LlavaForConditionalGeneration`` and ``LlavaProcessor`` on the same images (fp32), for both
stand-ins (the conftest's ``standin`` is parametrised by tower): omnicore's family parity suite
(:class:`omnicore.testing.FamilyParitySuite`: ids, logits on text only, one image and two images, a
packed row, the loss on the assistant tokens, the export read back by ``from_pretrained``, a LoRA
run's merged and PEFT adapter exports, 2 FSDP2 processes against one), and what only this family
brings.

The stand-ins' templates render every image of a message (``<image>`` and a newline) before its
text; samples write that newline as text after each image part (omnicore renders the text around
media itself; see README.md).
"""

from __future__ import annotations

import omnicore_family_llava.plugin
from omnicore.testing import FamilyParitySuite


class TestLlavaParity(FamilyParitySuite):
    foundation = "llava"
    plugins = [(omnicore_family_llava.plugin, "omnicore-family-llava")]
    hf_class = "LlavaForConditionalGeneration"
    samples = [
        ([{"type": "text", "text": "Say hi"}], "hi there"),
        ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "\nWhat is it?"}], "noise"),
        (
            [
                {"type": "image", "path": "b.png"},
                {"type": "text", "text": "\n"},
                {"type": "image", "path": "a.png"},
                {"type": "text", "text": "\nWhich is wider?"},
            ],
            "the first",
        ),
    ]
    media = {"a.png": (40, 52), "b.png": (70, 33)}
    media_tokens = {"image": 16}  # both stand-ins: a 4 x 4 patch grid (CLIP's class token dropped)
    lora_export = True  # a LoRA run exported merged and as a PEFT adapter of LlavaForConditionalGeneration

    def hf_messages(self, user, answer):
        """The template renders the images first, then the text: one image part per image and the
        last text part without its leading newline."""
        content = [{"type": "image"} for p in user if p["type"] == "image"]
        content.append({"type": "text", "text": [p["text"] for p in user if p["type"] == "text"][-1].lstrip("\n")})
        return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]

    def test_one_entry_brings_the_image_encoder_and_keeps_the_vocabulary(self, family_run, standin):
        from transformers import AutoTokenizer

        model, tok = family_run.model, family_run.tokenizer
        assert list(model.encoders) == ["image"] and type(model.encoders["image"]).__name__ == "LlavaVisionTower"
        assert tok.get_vocab() == AutoTokenizer.from_pretrained(standin).get_vocab()
        assert sorted(model.part_names) == ["language_model", "multi_modal_projector", "vision_tower"]
