"""The family's parts alone against transformers' own LLaVA classes on the same inputs (fp32), for
both stand-ins: the processor's pixels and token counts, the encoder's rows for each feature layer
and select strategy, which tower parameters it freezes, every checkpoint layout, and bad folders."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from omnicore.api import LoadError, fill_now
from omnicore_family_llava.encoder import build as build_encoder
from omnicore_family_llava.foundation import LlavaFoundation
from omnicore_family_llava.processor import WHAT_TO_PUT, build_processor
from omnicore_family_llava.standin import save_standin

SIZES = [(8, 8), (31, 17), (32, 32), (50, 40), (100, 33), (17, 90), (224, 224)]
"""Image ``(width, height)``: smaller and larger than the tower's 32, square, wide and tall."""


def _hf_count(hf_processor, img):
    out = hf_processor(text="<image>", images=[img], return_tensors="pt")
    return int((out["input_ids"][0] == hf_processor.image_token_id).sum()), out["pixel_values"][0]


def test_token_counts_and_pixels_equal_the_hf_processor(standin, hf_processor, image):
    proc = build_processor({"checkpoint": str(standin)})
    assert proc.placeholder == hf_processor.image_token == "<image>"
    for i, (w, h) in enumerate(SIZES):
        img = image(w, h, seed=i)
        feats = proc.preprocess(img)
        want, pixels = _hf_count(hf_processor, img)
        assert torch.equal(feats["pixel_values"], pixels), (w, h)
        assert proc.num_tokens(feats) == want == 16, (w, h)  # 4 x 4 patches (CLIP: + class token - "default")


def _with_image_processor(src, dst, **changes):
    """``src`` copied to ``dst`` with ``changes`` in its processor_config.json's image processor."""
    shutil.copytree(src, dst)
    path = dst / "processor_config.json"
    raw = json.loads(path.read_text())
    raw["image_processor"].update(changes)
    path.write_text(json.dumps(raw))
    return dst


def test_token_counts_follow_the_pixel_size_as_llava_processor_counts_them(standin, tower, tmp_path, image):
    from transformers import AutoProcessor

    # pixel sizes that follow the image: CLIP without its centre crop, SigLIP resized to a rectangle
    changes = {"do_center_crop": False} if tower == "clip" else {"size": {"height": 24, "width": 40}}
    folder = _with_image_processor(standin, tmp_path / "other", **changes)
    proc, hf = build_processor({"checkpoint": str(folder)}), AutoProcessor.from_pretrained(folder)
    counts = []
    for i, (w, h) in enumerate(SIZES):
        img = image(w, h, seed=i)
        feats = proc.preprocess(img)
        want, pixels = _hf_count(hf, img)
        assert torch.equal(feats["pixel_values"], pixels), (w, h)
        assert proc.num_tokens(feats) == want, (w, h)
        counts.append(want)
    assert len(set(counts)) >= (4 if tower == "clip" else 1) and min(counts) >= 15


VARIANTS = [(-1, "full"), ([0, -2], "default"), ([-3, -1], "default"), (-2, "full")]


@pytest.mark.parametrize("layer,strategy", VARIANTS, ids=[f"{layer}-{strategy}" for layer, strategy in VARIANTS])
def test_encoder_rows_equal_get_image_features(tower, layer, strategy, tmp_path, image):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    folder = save_standin(tmp_path / "s", tower=tower, vision_feature_layer=layer, vision_feature_select_strategy=strategy, seed=3)
    hf = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    hf_proc = AutoProcessor.from_pretrained(folder)
    enc = fill_now(build_encoder({"checkpoint": str(folder)}, hidden_size=32)).eval()
    imgs = [image(w, h, seed=i) for i, (w, h) in enumerate(SIZES[:4])]
    batch = enc.processor.collate([enc.processor.preprocess(im) for im in imgs])
    pixels = hf_proc(text="<image>" * len(imgs), images=imgs, return_tensors="pt")["pixel_values"]
    assert torch.equal(batch["pixel_values"], pixels)
    with torch.no_grad():
        got = enc(batch)
        want = torch.cat(list(hf.model.get_image_features(pixel_values=pixels).pooler_output))
    assert got.shape == want.shape == (len(imgs) * enc.processor.num_tokens({"pixel_values": pixels[0]}), 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # the frozen parameters are exactly those that no output depends on
    frozen = {n for n, p in enc.named_parameters() if not p.requires_grad}
    enc.requires_grad_(True)
    enc(batch).square().sum().backward()
    assert frozen == {n for n, p in enc.named_parameters() if p.grad is None}
    assert any(n.startswith("vision_tower.post_layernorm.") for n in frozen)


def _relayout(src, dst, names):
    """``src``'s checkpoint re-saved with its key prefixes changed by ``names`` (first match wins)."""
    shutil.copytree(src, dst)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        tensors = {next(new + k[len(old) :] for old, new in names.items() if k.startswith(old)): f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return tensors


LAYOUTS = {
    "published": {"vision_tower.": "vision_tower.vision_model.", "": ""},  # llava-hf, written by transformers 4
    "memory": {
        "vision_tower.": "model.vision_tower.",
        "multi_modal_projector.": "model.multi_modal_projector.",
        "language_model.model.": "model.language_model.",
        "language_model.lm_head.": "lm_head.",
    },
    "memory_4": {
        "vision_tower.": "model.vision_tower.vision_model.",
        "multi_modal_projector.": "model.multi_modal_projector.",
        "language_model.model.": "model.language_model.",
        "language_model.lm_head.": "lm_head.",
    },
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_loads_the_same_tensors(standin, hf_model, tmp_path, layout):
    from transformers import LlavaForConditionalGeneration

    folder = tmp_path / layout
    _relayout(standin, folder, LAYOUTS[layout])
    enc = fill_now(build_encoder({"checkpoint": str(folder)}, hidden_size=32))
    lm = fill_now(LlavaFoundation({"checkpoint": str(folder)}).build_model(10))
    want = dict(hf_model.named_parameters())
    for name, p in enc.named_parameters():
        assert torch.equal(p, want["model." + name]), name
    for name, p in lm.named_parameters():
        assert torch.equal(p, want[name if name.startswith("lm_head.") else "model.language_model." + name[len("model.") :]]), name
    if layout == "published":  # transformers reads this layout too, to the same model
        back = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
        assert all(torch.equal(p, want[n]) for n, p in back.named_parameters())


def test_bad_checkpoints_name_the_field(standin, tower, tmp_path):
    with pytest.raises(ValueError, match=r"model.encoders.image.options.checkpoint: .* has no config.json"):
        build_processor({"checkpoint": str(tmp_path)})
    with pytest.raises(ValueError, match=r"model.foundation.options.checkpoint: .* has no config.json"):
        LlavaFoundation({"checkpoint": str(tmp_path)})
    with pytest.raises(ValueError, match=r"hidden size of 32, but the foundation's is 48"):
        build_encoder({"checkpoint": str(standin)}, hidden_size=48)
    tensors = _relayout(standin, tmp_path / "broken", {"": ""})
    del tensors["multi_modal_projector.linear_2.bias"]
    save_file(tensors, str(tmp_path / "broken" / "model.safetensors"))
    with pytest.raises(LoadError, match=r"model.encoders.image.options.checkpoint: .*multi_modal_projector.linear_2.bias"):
        build_encoder({"checkpoint": str(tmp_path / "broken")}, hidden_size=32)
    shutil.copytree(standin, tmp_path / "miscount")
    path = tmp_path / "miscount" / "processor_config.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps(dict(raw, num_additional_image_tokens=1 - raw["num_additional_image_tokens"])))
    with pytest.raises(ValueError, match=r"counts 1[57] <image> tokens .* but the model gives 16 rows"):
        build_processor({"checkpoint": str(tmp_path / "miscount")})
    path.write_text(json.dumps({k: v for k, v in raw.items() if k != "patch_size"}))
    with pytest.raises(ValueError, match=r"processor_config.json has no patch_size"):
        build_processor({"checkpoint": str(tmp_path / "miscount")})


def test_auto_leaves_llava_to_the_generic_family():
    """foundation/llava reads llava checkpoints but claims none for ``name: auto``: the generic
    family serves them exactly (the template's newline after each image included)."""
    from omnicore.api import Registry
    from omnicore_family_llava import plugin

    assert plugin.MODEL_TYPES == ("llava",)
    assert [s.extra["model_types"] for s in plugin.omnicore_foundations()] == [()]
    assert Registry.discover().foundation_for("llava") == "generic"


def test_another_model_type_names_the_installed_foundation_serving_it(tmp_path, monkeypatch, isolated_registry):
    """A checkpoint of another model type names the installed foundation listing it (read from the
    registry, no table here); with none listing it, no hint."""
    from omnicore.api import ComponentSpec, hookimpl
    from omnicore_family_kit import checkpoint

    class Other:
        @hookimpl
        def omnicore_foundations(self):
            return [ComponentSpec(name="other_fam", target="other_fam:build", extra={"model_types": ("qwen2_vl",)})]

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    cfg = tmp_path / "config.json"
    for plugins, hint in (
        (
            ("omnicore_family_llava.plugin", (Other(), "other")),
            "; model type 'qwen2_vl' is served by foundation/other_fam: set model.foundation.name to other_fam (or auto)",
        ),
        (("omnicore_family_llava.plugin",), ""),
    ):
        rows = tuple(isolated_registry(*plugins).rows)
        monkeypatch.setattr(checkpoint, "_installed_rows", lambda rows=rows: rows)
        with pytest.raises(ValueError) as err:
            LlavaFoundation({"checkpoint": str(tmp_path)})
        assert (
            str(err.value)
            == f"model.foundation.options.checkpoint: {cfg} has model_type 'qwen2_vl', not one of llava{hint}; otherwise {WHAT_TO_PUT}"
        )
        if hint:  # an encoder's field: the checkpoint belongs to a foundation, not to it
            with pytest.raises(
                ValueError,
                match=r"model.encoders.image.options.checkpoint: .* is served by foundation/other_fam: point model.foundation \(name: other_fam, or auto\) at it, not model.encoders.image;",
            ):
                build_processor({"checkpoint": str(tmp_path)})
