"""The family's parts alone against transformers' own Qwen2-VL / Qwen2.5-VL classes on the same
inputs (fp32), for both families: the processors' pixels and token counts over a grid of image
sizes and clip lengths, frame sampling, the clip's time spacing, the tower's rows, the text LM's
logits, both checkpoint layouts and the errors."""

from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from omnicore.api import LoadError, Video, fill_now
from omnicore_family_kit.media_processors import FrameVideoProcessor, video_settings
from omnicore_family_qwen2_vl.encoder import build as build_encoder
from omnicore_family_qwen2_vl.foundation import Qwen2VLFoundation
from omnicore_family_qwen2_vl.processor import build_processor

# (height, width): under min_pixels, around the rounding of 28-pixel multiples, the max_pixels cap,
# extreme aspect ratios, odd sizes
IMAGE_SIZES = [
    (10, 10),
    (28, 28),
    (56, 56),
    (60, 45),
    (41, 99),
    (42, 98),
    (112, 112),
    (113, 111),
    (200, 150),
    (480, 640),
    (20, 300),
    (300, 17),
]
# (frames, height, width): one frame (padded to a tubelet), odd counts, several sizes
CLIP_SHAPES = [(1, 56, 56), (2, 50, 80), (3, 64, 48), (4, 30, 30), (5, 112, 100), (7, 20, 200), (9, 90, 60)]
IMAGE_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_TEXT = "<|vision_start|><|video_pad|><|vision_end|>"


def _count(inputs, hf_processor, token):
    return int((inputs["input_ids"][0] == hf_processor.tokenizer.convert_tokens_to_ids(token)).sum())


def test_image_tokens_and_pixels_equal_the_hf_processor(standin, hf_processor, image):
    proc = build_processor({"checkpoint": str(standin)})
    counts = []
    for i, (h, w) in enumerate(IMAGE_SIZES):
        img = image(h, w, seed=i)
        feats = proc.preprocess(img)
        ref = hf_processor(text=IMAGE_TEXT, images=[img], return_tensors="pt")
        want = _count(ref, hf_processor, "<|image_pad|>")
        assert proc.num_tokens(feats) == want, (h, w)
        assert torch.equal(feats["pixel_values"], ref["pixel_values"]), (h, w)
        assert torch.equal(feats["image_grid_thw"], ref["image_grid_thw"][0]), (h, w)
        t, gh, gw = proc.grid(feats)
        assert t == 1 and t * gh * gw == want and proc.time_interval(feats) == 1.0
        counts.append(want)
    # the grid spans the processor's bounds: min_pixels (4 tokens) to max_pixels (16 tokens)
    assert min(counts) == 4 and max(counts) == 16 and len(set(counts)) >= 4


def _tubelets_from_image_processor(image_processor, settings, clip):
    """The clip's ``pixel_values_videos`` built another way: each frame through transformers' image
    processor (tubelets of 2 copies of itself, within the video's pixel bounds), then patch ``s`` of
    tubelet ``t`` takes frame ``2t``'s and ``2t + 1``'s copy, the last frame repeated."""
    size = dict(settings["size"])
    per = [image_processor(images=[f], size=size, return_tensors="pt") for f in clip]
    grid = per[0]["image_grid_thw"][0]
    p = int(settings["patch_size"])
    frames = [o["pixel_values"].reshape(-1, 3, 2, p, p)[:, :, 0] for o in per]
    if len(frames) % 2:
        frames.append(frames[-1])
    rows = []
    for t in range(len(frames) // 2):
        for s in range(frames[0].shape[0]):
            rows.append(torch.stack([frames[2 * t][s], frames[2 * t + 1][s]], dim=1).reshape(-1))
    return torch.stack(rows), (len(frames) // 2, int(grid[1]), int(grid[2]))


def test_clip_tokens_and_pixels_equal_the_hf_processor(standin, hf_processor, frames):
    proc = build_processor({"checkpoint": str(standin), "modality": "video"})
    settings = FrameVideoProcessor(video_settings(standin, "test")).settings
    image_processor = hf_processor.image_processor
    for i, (n, h, w) in enumerate(CLIP_SHAPES):
        clip = frames(n, h, w, seed=i)
        feats = proc.preprocess(Video(frames=clip, fps=2.0))
        meta = [{"total_num_frames": n, "fps": 2.0}]
        ref = hf_processor(text=VIDEO_TEXT, videos=[clip], video_metadata=meta, return_tensors="pt")
        want = _count(ref, hf_processor, "<|video_pad|>")
        assert proc.num_tokens(feats) == want, (n, h, w)
        assert torch.equal(feats["video_grid_thw"], ref["video_grid_thw"][0])
        # transformers' get_num_of_video_patches: the frame's patches from smart_resize, ceil(n / 2) frame groups
        bounds = {"min_pixels": settings["size"]["shortest_edge"], "max_pixels": settings["size"]["longest_edge"]}
        patches = image_processor.get_number_of_image_patches(h, w, bounds)
        assert want == patches * -(-n // 2) // 4, (n, h, w)
        pixels, grid = _tubelets_from_image_processor(image_processor, settings, clip)
        assert tuple(feats["video_grid_thw"].tolist()) == grid
        assert torch.equal(feats["pixel_values_videos"], pixels), (n, h, w)
        assert proc.grid(feats) == (grid[0], grid[1] // 2, grid[2] // 2)


def test_clip_time_interval_is_the_hf_processors(standin, hf_processor, family, frames):
    proc = build_processor({"checkpoint": str(standin), "modality": "video"})
    for fps in (1.0, 2.0, 3.0, 7.5, 24.0):
        clip = frames(6, 56, 56)
        feats = proc.preprocess(Video(frames=clip, fps=fps))
        ref = hf_processor(text=VIDEO_TEXT, videos=[clip], video_metadata=[{"total_num_frames": 6, "fps": fps}], return_tensors="pt")
        assert torch.equal(feats["second_per_grid_ts"], torch.tensor(2 / fps, dtype=torch.float32))
        if family == "qwen2_5_vl":
            assert torch.equal(feats["second_per_grid_ts"], ref["second_per_grid_ts"][0])
            assert proc.time_interval(feats) == float(torch.tensor(2 / fps, dtype=torch.float32) * 2)  # tokens_per_second 2
        else:
            assert "second_per_grid_ts" not in ref and proc.time_interval(feats) == 1.0


def test_frame_sampling_follows_the_settings(standin, frames, tmp_path):
    """With ``do_sample_frames`` the kept frames are Qwen2VLVideoProcessor.sample_frames' (worked by hand)."""
    settings = dict(video_settings(standin, "test"), do_sample_frames=True, fps=2)
    vp = FrameVideoProcessor(settings)
    # 20 frames at 10 fps, 2 per second: 4 frames, every fifth
    assert vp.sample_indices(20, 10.0).tolist() == [0, 5, 10, 15]
    # 9 frames at 1 fps would give 18: capped at the clip's 9, rounded down to 8 (two per tubelet)
    assert vp.sample_indices(9, 1.0).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    # 100 frames at 30 fps: 6.67 frames, at least min_frames 4, rounded down to 6
    assert vp.sample_indices(100, 30.0).tolist() == [0, 16, 33, 50, 66, 83]
    assert FrameVideoProcessor(dict(settings, fps=None, num_frames=5)).sample_indices(10, 5.0).tolist() == [0, 2, 5, 7]
    with pytest.raises(ValueError, match="cannot be sampled"):
        vp.sample_indices(1, 1.0)
    folder = tmp_path / "sampled"
    shutil.copytree(standin, folder)
    (folder / "video_preprocessor_config.json").write_text(json.dumps(settings))
    proc = build_processor({"checkpoint": str(folder), "modality": "video"})
    clip = frames(20, 56, 56)
    feats = proc.preprocess(Video(frames=clip, fps=10.0))
    assert feats["video_grid_thw"].tolist() == [2, 4, 4]  # the 4 kept frames
    assert float(feats["second_per_grid_ts"]) == 1.0  # 2 frames a tubelet at the sampled 2 fps
    alone = build_processor({"checkpoint": str(standin), "modality": "video"}).preprocess(Video(frames=clip[[0, 5, 10, 15]], fps=2.0))
    assert torch.equal(feats["pixel_values_videos"], alone["pixel_values_videos"])


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="transformers' video processor needs torchvision")
def test_frame_video_processor_equals_transformers_video_processor(standin, frames):
    from transformers import AutoVideoProcessor

    hf = AutoVideoProcessor.from_pretrained(standin)
    mine = FrameVideoProcessor(video_settings(standin, "test"))
    for i, (n, h, w) in enumerate(CLIP_SHAPES):
        clip = frames(n, h, w, seed=i)
        want = hf(videos=[clip], return_tensors="pt")
        got = mine(videos=[clip])
        assert torch.equal(got["video_grid_thw"], want["video_grid_thw"])
        torch.testing.assert_close(got["pixel_values_videos"], want["pixel_values_videos"], atol=0.02, rtol=0)  # PIL vs torchvision resize


def _encoder(folder, modality="image"):
    return fill_now(build_encoder({"checkpoint": str(folder), "modality": modality}, hidden_size=64)).eval()


def test_tower_rows_equal_the_hf_image_and_video_features(standin, hf_model, image, frames):
    enc = _encoder(standin)
    proc = enc.processor
    feats = [proc.preprocess(image(h, w, seed=i)) for i, (h, w) in enumerate([(60, 45), (112, 112), (20, 300), (200, 150)])]
    batch = proc.collate(feats)
    with torch.no_grad():
        got = enc(batch)
        want = torch.cat(hf_model.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"]).pooler_output)
    assert got.shape == (sum(proc.num_tokens(f) for f in feats), 64)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    start = sum(proc.num_tokens(f) for f in feats[:2])
    with torch.no_grad():  # an item alone gives its rows of the batch (windows and attention stay per item)
        alone = enc(proc.collate([feats[2]]))
    torch.testing.assert_close(alone, got[start : start + alone.shape[0]], atol=1e-5, rtol=0)
    vproc = build_processor({"checkpoint": str(standin), "modality": "video"})
    clips = [vproc.preprocess(Video(frames=frames(n, h, w, seed=n), fps=2.0)) for n, h, w in CLIP_SHAPES[:4]]
    vbatch = vproc.collate(clips)
    with torch.no_grad():
        got = enc(vbatch)
        want = torch.cat(hf_model.model.get_video_features(vbatch["pixel_values_videos"], vbatch["video_grid_thw"]).pooler_output)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_lm_logits_equal_the_hf_model_on_text(standin, hf_model):
    found = Qwen2VLFoundation({"checkpoint": str(standin)})
    tok = found.build_tokenizer()
    lm = fill_now(found.build_model(len(tok))).eval()
    ids = torch.tensor([tok.encode("<|im_start|>user\nhello there<|im_end|>\n", add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(lm(input_ids=ids).logits, hf_model(input_ids=ids).logits, atol=1e-5, rtol=0)
    assert lm.get_input_embeddings().weight.shape == hf_model.get_input_embeddings().weight.shape
    grown = found.build_model(len(tok) + 50)  # more rows than the checkpoint: the extra rows are filled later
    assert grown.get_input_embeddings().weight.shape[0] == len(tok) + 50 and grown.omnicore_pending_load.rows


def test_part_names_split_the_tower_exactly(standin):
    enc = _encoder(standin)
    parts = Qwen2VLFoundation({"checkpoint": str(standin)}).part_names()
    names = ["encoders.image." + n for n, _ in enc.named_parameters()]
    visual = [n for n in names if any(n.startswith(p) for p in parts["visual"])]
    merger = [n for n in names if any(n.startswith(p) for p in parts["merger"])]
    assert visual and merger and sorted(visual + merger) == sorted(names)
    assert all(".merger." in n for n in merger)


def _relayout(src, dst):
    """``src``'s checkpoint re-saved under transformers 5's in-memory names (model.visual.*, ...)."""
    shutil.copytree(src, dst)
    names = {"visual.": "model.visual.", "model.": "model.language_model.", "lm_head.": "lm_head."}
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        tensors = {next(new + k[len(old) :] for old, new in names.items() if k.startswith(old)): f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return tensors


def test_both_layouts_load_the_same_tensors(standin, tmp_path):
    tensors = _relayout(standin, tmp_path / "new")
    assert "model.language_model.embed_tokens.weight" in tensors and "model.visual.merger.mlp.0.weight" in tensors
    for folder in (standin, tmp_path / "new"):
        enc = _encoder(folder)
        assert torch.equal(enc.visual.patch_embed.proj.weight, tensors["model.visual.patch_embed.proj.weight"])
        assert torch.equal(enc.visual.merger.mlp[2].bias, tensors["model.visual.merger.mlp.2.bias"])
        lm = fill_now(Qwen2VLFoundation({"checkpoint": str(folder)}).build_model(10))
        assert torch.equal(lm.lm_head.weight, tensors["lm_head.weight"])
        assert torch.equal(lm.model.layers[1].mlp.up_proj.weight, tensors["model.language_model.layers.1.mlp.up_proj.weight"])


def test_bad_checkpoints_and_media_name_what_to_fix(standin, tmp_path, image):
    with pytest.raises(ValueError, match=r"model.encoders.image.options.checkpoint: .* has no config.json"):
        build_processor({"checkpoint": str(tmp_path)})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    with pytest.raises(ValueError, match=r"model_type 'llava', not one of qwen2_vl, qwen2_5_vl"):
        Qwen2VLFoundation({"checkpoint": str(tmp_path)})
    with pytest.raises(ValueError, match=r"hidden size of 64, but the foundation's is 48"):
        build_encoder({"checkpoint": str(standin)}, hidden_size=48)
    tensors = _relayout(standin, tmp_path / "broken")
    del tensors["model.visual.merger.ln_q.weight"]
    save_file(tensors, str(tmp_path / "broken" / "model.safetensors"))
    with pytest.raises(LoadError, match=r"model.encoders.image.options.checkpoint: .*visual.merger.ln_q.weight"):
        build_encoder({"checkpoint": str(tmp_path / "broken")}, hidden_size=64)
    with pytest.raises(TypeError, match="expects a PIL image"):
        build_processor({"checkpoint": str(standin)}).preprocess(np.zeros((4, 4, 3)))
    with pytest.raises(TypeError, match="expects an omnicore.api.Video"):
        build_processor({"checkpoint": str(standin), "modality": "video"}).preprocess(image(30, 30))


def test_a_tied_checkpoint_reads_the_head_from_the_embeddings(standin, tmp_path):
    """Qwen2-VL-2B ties its embeddings (no ``lm_head.weight`` in its safetensors): the LM is tied
    and its logits are transformers'."""
    from transformers import AutoModelForImageTextToText

    folder = tmp_path / "tied"
    shutil.copytree(standin, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=True)))
    with safe_open(str(standin / "model.safetensors"), "pt") as f:
        save_file({k: f.get_tensor(k) for k in f.keys() if k != "lm_head.weight"}, str(folder / "model.safetensors"))
    hf = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    found = Qwen2VLFoundation({"checkpoint": str(folder)})
    lm = fill_now(found.build_model(len(found.build_tokenizer()))).eval()
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    ids = torch.tensor([[5, 60, 7, 250, 9]])
    with torch.no_grad():
        torch.testing.assert_close(lm(input_ids=ids).logits, hf(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_the_foundation_serves_its_model_types():
    """foundation/qwen2_vl names its model types in its spec, so ``name: auto`` picks it for them."""
    from omnicore.api import Registry
    from omnicore_family_qwen2_vl import plugin

    assert plugin.MODEL_TYPES == ("qwen2_vl", "qwen2_5_vl")
    assert [s.extra["model_types"] for s in plugin.omnicore_foundations()] == [plugin.MODEL_TYPES]
    reg = Registry.discover()
    assert {t: reg.foundation_for(t) for t in plugin.MODEL_TYPES} == {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl"}


@pytest.mark.parametrize(
    ("model_type", "foundation"),
    [
        ("qwen3_vl", "qwen3_vl"),
        ("llava", "generic"),  # foundation/llava claims no model type for auto: the generic family serves llava
        ("qwen2_audio", "qwen2_audio"),
        ("qwen2_5_omni_thinker", "qwen2_5_omni"),
        ("gemma3", "generic"),  # no family names it: the generic family of omnicore-family-kit serves it
    ],
)
def test_a_checkpoint_of_another_family_names_the_foundation_serving_it(tmp_path, model_type, foundation):
    pytest.importorskip(f"omnicore_family_{'kit' if foundation == 'generic' else foundation}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(
        ValueError,
        match=rf"model_type '{model_type}', not one of qwen2_vl, qwen2_5_vl; model type '{model_type}' is served by "
        rf"foundation/{foundation}: set model.foundation.name to {foundation} \(or auto\); otherwise point options.checkpoint",
    ):
        Qwen2VLFoundation({"checkpoint": str(tmp_path)})
    with pytest.raises(
        ValueError,
        match=rf"model.encoders.image.options.checkpoint: .*served by foundation/{foundation}: "
        rf"point model.foundation \(name: {foundation}, or auto\) at it, not model.encoders.image;",
    ):
        build_processor({"checkpoint": str(tmp_path)})


def test_the_hint_comes_from_the_installed_foundations(tmp_path, monkeypatch, isolated_registry):
    """The foundation named is whichever installed one lists the model type (no table here): with
    only this family installed a LLaVA checkpoint gets no hint."""
    from omnicore_family_kit import checkpoint

    rows = tuple(isolated_registry("omnicore_family_qwen2_vl.plugin").rows)
    monkeypatch.setattr(checkpoint, "_installed_rows", lambda: rows)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    with pytest.raises(ValueError, match=r"model_type 'llava', not one of qwen2_vl, qwen2_5_vl; otherwise point options.checkpoint"):
        Qwen2VLFoundation({"checkpoint": str(tmp_path)})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    assert Qwen2VLFoundation({"checkpoint": str(tmp_path)}).folder == tmp_path


def test_building_the_lm_logs_the_checkpoint_model_type(standin, family, caplog):
    caplog.set_level("INFO", logger="omnicore_family_qwen2_vl.foundation")
    Qwen2VLFoundation({"checkpoint": str(standin)}).build_model(10)
    cls = "Qwen2_5_VLForConditionalGeneration" if family == "qwen2_5_vl" else "Qwen2VLForConditionalGeneration"
    assert f"foundation qwen2_vl: {standin} is a {family} checkpoint ({cls})" in caplog.text
