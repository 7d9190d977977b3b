"""``omnicore_family_kit.foundation.FamilyFoundation`` (what a family states, what the base does
with it) on the kit's LLaVA stand-in, against transformers' ``LlavaForConditionalGeneration``
itself; and the torch-free spec helpers of ``omnicore_family_kit.specs``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from omnicore.api import ComponentSpec, fill_now
from omnicore_family_kit.foundation import TOKENIZER_FILES, FamilyFoundation
from omnicore_family_kit.keymap import KeyMap
from omnicore_family_kit.options import CheckpointOptions
from omnicore_family_kit.specs import foundation_spec, part_spec

LEGACY = {
    "vision_tower.": "model.vision_tower.",
    "multi_modal_projector.": "model.multi_modal_projector.",
    "language_model.model.": "model.language_model.",
    "language_model.lm_head.": "lm_head.",
}
"""What transformers 5's ``LlavaForConditionalGeneration.save_pretrained`` writes -> its in-memory names."""
LM = KeyMap(
    parts={"model.": "model.language_model.", "lm_head.": "lm_head."},
    legacy=LEGACY,
    others=("model.vision_tower.", "model.multi_modal_projector."),
)
TOWER = KeyMap(parts={"vision_tower.": "model.vision_tower.", "multi_modal_projector.": "model.multi_modal_projector."})


class Options(CheckpointOptions):
    long_audio: str = "refuse"


class Fam(FamilyFoundation):
    """A family stating only attributes, plus an export of the LM and a tower module."""

    family = "fam"
    model_types = ("llava",)
    what_to_put = "point options.checkpoint at a LLaVA folder"
    options_model = Options
    lm_keys = LM
    encoder_entries = {
        "image": {"name": "fam_encoder"},
        "video": {"name": "fam_encoder", "options": {"modality": "video", "long_audio": ...}, "share": "image"},
    }
    part_prefixes = {"vision_tower": ["encoders.image.vision_tower."], "language_model": ["lm."]}

    def export_pretrained(self, model, tokenizer, folder):
        from transformers import LlavaForConditionalGeneration

        tower = self.one_module(model.encoders, torch.nn.Module, "encoder/fam_encoder")
        config = self.export_config(model, tokenizer, {"image_token_index": "<image>"})
        self.write_export(folder, model, LlavaForConditionalGeneration, config, [(tower, TOWER), (model.lm, LM)], tokenizer=tokenizer)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    from omnicore_family_kit.standins import save_standin

    return save_standin("llava", tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def hf_model(standin):
    from transformers import LlavaForConditionalGeneration

    return LlavaForConditionalGeneration.from_pretrained(standin, dtype=torch.float32).eval()


def test_the_lm_is_the_class_text_model_read_strictly(standin, hf_model, caplog):
    caplog.set_level("INFO", logger=__name__)
    found = Fam({"checkpoint": str(standin)})
    tok = found.build_tokenizer()
    lm = fill_now(found.build_model(len(tok))).eval()
    assert f"foundation fam: {standin} is a llava checkpoint (LlavaForConditionalGeneration)" in caplog.text
    ids = torch.tensor([[3, 17, 40, 5, 9]])
    with torch.no_grad():
        torch.testing.assert_close(lm(input_ids=ids).logits, hf_model(input_ids=ids).logits, atol=1e-5, rtol=0)
    grown = found.build_model(len(tok) + 7)
    assert grown.get_input_embeddings().weight.shape[0] == len(tok) + 7 and grown.omnicore_pending_load.rows


def test_encoders_and_parts_are_the_stated_ones(standin):
    found = Fam({"checkpoint": str(standin), "long_audio": "truncate"})
    assert found.encoders() == {
        "image": {"name": "fam_encoder", "options": {"checkpoint": str(standin)}},
        "video": {
            "name": "fam_encoder",
            "options": {"checkpoint": str(standin), "modality": "video", "long_audio": "truncate"},
            "share": "image",
        },
    }
    parts = found.part_names()
    parts["lm"] = ["x."]
    parts["language_model"].append("y.")
    assert found.part_names() == {"vision_tower": ["encoders.image.vision_tower."], "language_model": ["lm."]}


def test_checkpoints_of_another_type_or_without_a_tokenizer_are_refused(standin, tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "mimi"}))
    with pytest.raises(ValueError, match=r"^model.foundation.options.checkpoint: .* has model_type 'mimi', not one of llava"):
        Fam({"checkpoint": str(tmp_path / "other")})
    bare = tmp_path / "bare"
    shutil.copytree(standin, bare)
    for name in TOKENIZER_FILES:
        (bare / name).unlink(missing_ok=True)
    found = Fam({"checkpoint": str(bare)})  # building reads no tokenizer
    looked = ", ".join(TOKENIZER_FILES)
    with pytest.raises(ValueError) as err:
        found.build_tokenizer()
    assert (
        str(err.value)
        == f"model.foundation.options.checkpoint: {bare} has no tokenizer (looked for {looked}); save the checkpoint's tokenizer there"
    )


def test_one_module_counts_shared_entries_once(standin):
    found = Fam({"checkpoint": str(standin)})
    a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    assert found.one_module({"image": a, "video": a}, torch.nn.Linear, "encoder/x") is a
    for modules, n in (({}, 0), ({"image": a, "audio": b}, 2)):
        with pytest.raises(ValueError, match=rf"^fam export: the model needs exactly one encoder/x module, found {n}$"):
            found.one_module(modules, torch.nn.Linear, "encoder/x")


def test_the_export_is_what_the_class_loads_back(standin, hf_model, tmp_path):
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    found = Fam({"checkpoint": str(standin)})
    tok = found.build_tokenizer()
    tower = torch.nn.Module()
    tower.vision_tower, tower.multi_modal_projector = hf_model.model.vision_tower, hf_model.model.multi_modal_projector
    lm = fill_now(found.build_model(len(tok)))
    with torch.no_grad():
        lm.model.norm.weight.add_(0.5)  # a trained change, to be found in the export
    found.export_pretrained(SimpleNamespace(lm=lm, encoders={"image": tower}), tok, tmp_path / "out")
    out = tmp_path / "out"
    back = LlavaForConditionalGeneration.from_pretrained(out, dtype=torch.float32)
    want = hf_model.state_dict()
    got = back.state_dict()
    assert sorted(got) == sorted(want)
    changed = "model.language_model.norm.weight"
    assert torch.equal(got[changed], want[changed] + 0.5)
    assert all(torch.equal(got[k], v) for k, v in want.items() if k != changed)
    assert back.config.image_token_index == tok.convert_tokens_to_ids("<image>")
    for name in ("processor_config.json", "chat_template.jinja", "generation_config.json"):
        assert (out / name).read_bytes() == (standin / name).read_bytes(), name
    assert AutoTokenizer.from_pretrained(out).get_vocab() == tok.get_vocab()


def test_the_spec_helpers_name_the_kit_layout():
    spec = foundation_spec("fam_pkg", "fam", "FamOptions", ["fam_type"], "a family")
    assert spec == ComponentSpec(
        name="fam", target="fam_pkg.foundation:build", options_model="fam_pkg.processor:FamOptions", description="a family"
    )
    assert spec.extra == {"model_types": ("fam_type",)}
    enc = part_spec("fam_pkg", "fam_audio", "AudioOptions", ["audio"], "the tower", target="encoder:build_audio")
    assert enc == ComponentSpec(
        name="fam_audio",
        target="fam_pkg.encoder:build_audio",
        options_model="fam_pkg.processor:AudioOptions",
        processor="fam_pkg.processor:build_audio_processor",
        modalities=("audio",),
        description="the tower",
    )
    assert part_spec("p", "d", "O", ("audio",), "", target="decoder:build").processor == "p.processor:build_processor"


@pytest.mark.cli
def test_the_kit_modules_a_hook_module_imports_are_torch_free():
    code = (
        "import sys, omnicore_family_kit.specs, omnicore_family_kit.options, omnicore_family_kit.foundation; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
