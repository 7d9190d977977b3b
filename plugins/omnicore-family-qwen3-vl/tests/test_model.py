"""The whole family through omnicore's run path (one foundation entry) against transformers'
``Qwen3VLForConditionalGeneration`` and its processor on the same images and clips (fp32):
omnicore's family parity suite (:class:`omnicore.testing.FamilyParitySuite`: ids, logits on text
only, one image, two images, a clip, and a clip and an image, the 3-D positions against
``get_rope_index``, a packed row, the loss on the assistant tokens, the export read back by
``from_pretrained``), and what only this family brings: the DeepStack rows and greedy generation
with media.

The clip (8 frames at 3 fps) is sampled to 5 frames at 2 fps (3 frame groups, the last frame
repeated), each group written after its timestamp; its groups outnumber nothing, but each is its
own position block, so the text after it starts where ``get_rope_index`` puts it. Every image and
clip sample also runs the DeepStack rows through the LM's first two layers; the sample with a
clip and an image joins both modalities' rows in sequence order, as ``Qwen3VLModel.forward`` does.
Two FSDP2 processes against one (and Ulysses): ``tests/test_families_fsdp2.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import omnicore_family_qwen3_vl.plugin
from omnicore.testing import FamilyParitySuite, generate_batch, read_jsonl


def _conftest():
    """This folder's ``conftest.py`` as pytest imported it (test modules cannot import it by name:
    the repository's ``conftest`` is first)."""
    path = Path(__file__).with_name("conftest.py")
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) and Path(m.__file__) == path)


class TestQwen3VLParity(FamilyParitySuite):
    foundation = "qwen3_vl"
    plugins = [(omnicore_family_qwen3_vl.plugin, "omnicore-family-qwen3-vl")]
    hf_class = "AutoModelForImageTextToText"
    samples = [
        ([{"type": "text", "text": "Say hi"}], "hi there"),
        ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "What is it?"}], "noise"),
        (
            [
                {"type": "text", "text": "Compare "},
                {"type": "image", "path": "b.png"},
                {"type": "text", "text": " and "},
                {"type": "image", "path": "a.png"},
                {"type": "text", "text": "."},
            ],
            "the first is larger",
        ),
        ([{"type": "video", "path": "c.mkv"}, {"type": "text", "text": "What happens?"}], "it flickers"),
        ([{"type": "video", "path": "c.mkv"}, {"type": "text", "text": "then"}, {"type": "image", "path": "a.png"}], "a still"),
    ]
    media = {"a.png": (45, 60), "b.png": (120, 100), "c.mkv": (8, 80, 50, 3)}
    mrope = True
    end_of_turn = "<|im_end|>"
    test_two_fsdp2_processes_equal_one = None  # tests/test_families_fsdp2.py runs this stand-in

    def load_hf_processor(self, folder):
        """The conftest's ``load_hf_processor`` (transformers' processor class, also without torchvision)."""
        return _conftest().load_hf_processor(folder)

    def test_one_entry_brings_one_tower_for_images_and_video(self, family_run, standin):
        from transformers import AutoTokenizer

        model, tok = family_run.model, family_run.tokenizer
        assert list(model.encoders) == ["image"] and type(model.encoders["image"]).__name__ == "Qwen3VLVisionTower"
        assert model.shared["video"][0] == "image" and model.shared["video"][1].placeholder == "<|video_pad|>"
        assert tok.get_vocab() == AutoTokenizer.from_pretrained(standin).get_vocab()
        assert sorted(model.part_names) == ["language_model", "merger", "visual"]
        assert type(model.lm.model).__name__ == "Qwen3VLTextModel" and model.layer_inputs is not None

    def test_the_clip_is_three_frame_groups_each_after_its_timestamp(self, hf_reference):
        inputs = hf_reference.inputs[3]
        assert inputs["video_grid_thw"][0].tolist() == [3, 4, 4]  # 50 x 80 frames at 64 x 64
        assert "<0.3 seconds><|vision_start|>" in hf_reference.processor.tokenizer.decode(inputs["input_ids"][0])

    def test_deepstack_rows_change_the_logits(self, family_run):
        """The layer inputs are used: without them the image sample's logits move."""
        model, encoded = family_run.model, family_run.encoded
        with_rows = self.logits(model, [encoded[1]]).logits[0]
        keep = model.layer_inputs
        model.layer_inputs = lambda mask, per_layer: {"visual_pos_masks": mask, "deepstack_visual_embeds": [0 * x for x in per_layer]}
        try:
            without = self.logits(model, [encoded[1]]).logits[0]
        finally:
            model.layer_inputs = keep
        assert not torch.allclose(with_rows, without, atol=1e-3)

    def test_greedy_generation_equals_transformers_generate(self, family_run, hf_reference):
        """Greedy continuation of prompts with media, DeepStack rows in the prefill: omnicore's batched
        generation (two prompts of other lengths, left-padded together) gives each prompt the tokens
        ``Qwen3VLForConditionalGeneration.generate`` gives it alone."""
        model, tok = family_run.model, family_run.tokenizer
        rows = read_jsonl(family_run.data / "train.jsonl")
        stop = tok.convert_tokens_to_ids("<|im_end|>")
        prompts = [family_run.chat.encode(rows[k], prompt_only=True) for k in (1, 4)]
        got = generate_batch(model, tok, prompts, max_new_tokens=12, stop_id=stop)
        for k, prompt, out in zip((1, 4), prompts, got):
            user, answer, _, _ = self.sample_list()[k]
            inputs = self.hf_inputs(hf_reference.processor, family_run.data, user, answer, prompt_only=True)
            assert prompt.input_ids == inputs["input_ids"][0].tolist()
            with torch.no_grad():
                ids = hf_reference.model.generate(
                    **inputs, max_new_tokens=12, do_sample=False, eos_token_id=stop, pad_token_id=tok.pad_token_id
                )
            want = ids[0, inputs["input_ids"].shape[1] :].tolist()
            assert out["token_ids"] == want, k
            assert len(want) >= 4  # enough tokens to pass the prefill and several cached steps
