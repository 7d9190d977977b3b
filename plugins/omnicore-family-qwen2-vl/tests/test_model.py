"""The whole family through omnicore's run path (one foundation entry) against transformers'
``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration`` and its processor on
the same images and clips (fp32), for both families (the conftest's ``standin`` is parametrised):
omnicore's family parity suite (:class:`omnicore.testing.FamilyParitySuite`: ids, logits on text
only, one image, two images and a clip, the 3-D positions against ``get_rope_index``, a packed
row, the loss on the assistant tokens, the export read back by ``from_pretrained``), and what only
this family brings.

The clip (8 frames at 3 fps) has more frame groups (4) than its merged grid has rows or columns
(2 x 3), so the text after it sits where transformers' ``get_rope_index`` puts it (start + max(h,
w)), and Qwen2.5-VL spaces its frame groups by 2 tokens/s x 2/3 s (positions 0, 1, 2, 4). Two
FSDP2 processes against one: ``tests/test_families_fsdp2.py`` (Qwen2-VL's stand-in).
"""

from __future__ import annotations

import sys
from pathlib import Path

import omnicore_family_qwen2_vl.plugin
from omnicore.testing import FamilyParitySuite


def _conftest():
    """This folder's ``conftest.py`` as pytest imported it (test modules cannot import it by name:
    the repository's ``conftest`` is first)."""
    path = Path(__file__).with_name("conftest.py")
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) and Path(m.__file__) == path)


class TestQwen2VLParity(FamilyParitySuite):
    foundation = "qwen2_vl"
    plugins = [(omnicore_family_qwen2_vl.plugin, "omnicore-family-qwen2-vl")]
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
    ]
    media = {"a.png": (45, 60), "b.png": (120, 100), "c.mkv": (8, 80, 50, 3)}
    mrope = True
    end_of_turn = "<|im_end|>"
    test_two_fsdp2_processes_equal_one = None  # tests/test_families_fsdp2.py runs Qwen2-VL's stand-in

    def load_hf_processor(self, folder):
        """The conftest's ``load_hf_processor`` (transformers' processor class, also without torchvision)."""
        return _conftest().load_hf_processor(folder)

    def test_one_entry_brings_one_tower_for_images_and_video(self, family_run, standin):
        from transformers import AutoTokenizer

        model, tok = family_run.model, family_run.tokenizer
        assert list(model.encoders) == ["image"] and type(model.encoders["image"]).__name__ == "Qwen2VLVisionTower"
        assert model.shared["video"][0] == "image" and model.shared["video"][1].placeholder == "<|video_pad|>"
        assert tok.get_vocab() == AutoTokenizer.from_pretrained(standin).get_vocab()
        assert sorted(model.part_names) == ["language_model", "merger", "visual"]

    def test_the_clip_has_more_frame_groups_than_merged_rows_or_columns(self, hf_reference):
        """The spatial rule of ``get_rope_index`` (text after a clip at start + max(h, w)) is exercised."""
        t, h, w = hf_reference.inputs[3]["video_grid_thw"][0].tolist()
        assert t > max(h, w) // 2
