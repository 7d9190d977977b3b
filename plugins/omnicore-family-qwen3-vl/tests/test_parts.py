"""The family's parts alone against transformers' own Qwen3-VL classes on the same inputs (fp32):
the processors' token counts over a grid of image sizes and clip lengths, the clip resize rule,
frame sampling and timestamps, the tower's rows (DeepStack rows included), the text LM's logits,
the part names, both checkpoint layouts and the errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from omnicore.api import LoadError, Video, fill_now
from omnicore_family_kit.media_processors import video_settings
from omnicore_family_qwen3_vl.encoder import build as build_encoder
from omnicore_family_qwen3_vl.foundation import Qwen3VLFoundation
from omnicore_family_qwen3_vl.processor import FrameVideoProcessor, build_processor, smart_resize

# (height, width): under min_pixels, around the rounding of 32-pixel multiples, the max_pixels cap,
# extreme aspect ratios, odd sizes
IMAGE_SIZES = [(10, 10), (32, 32), (64, 64), (60, 45), (47, 113), (48, 112), (128, 128), (129, 127), (200, 150), (480, 640), (20, 300)]
# (frames, height, width, fps): short clips (sampled up to min_frames, capped by the clip), odd counts, several sizes and rates
CLIP_SHAPES = [
    (2, 64, 64, 2.0),
    (3, 50, 80, 1.0),
    (4, 40, 40, 2.0),
    (5, 112, 100, 4.0),
    (7, 20, 200, 3.0),
    (9, 90, 60, 1.5),
    (24, 64, 96, 12.0),
]
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
        assert t == 1 and t * gh * gw == want and proc.runs(feats) == [("", (1, gh, gw))]
        counts.append(want)
    # the grid spans the processor's bounds: min_pixels (4 tokens) to max_pixels (16 tokens)
    assert min(counts) == 4 and max(counts) == 16 and len(set(counts)) >= 4


def test_clip_resize_is_transformers_rule():
    """:func:`smart_resize` is ``video_processing_qwen3_vl.smart_resize`` over frames, sizes and bounds."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_resize

    for n in (2, 3, 4, 7, 16):
        for h, w in [(10, 10), (50, 80), (64, 64), (20, 300), (300, 17), (480, 640), (113, 111)]:
            for lo, hi in [(4096, 32768), (4096, 8 * 4096), (128 * 1024, 768 * 1024)]:
                want = hf_resize(n, h, w, temporal_factor=2, factor=32, min_pixels=lo, max_pixels=hi)
                assert smart_resize(n, h, w, 32, 2, lo, hi) == want, (n, h, w, lo, hi)
    with pytest.raises(ValueError, match="shorter than temporal_patch_size"):
        smart_resize(1, 64, 64, 32, 2, 4096, 32768)


def test_clip_tokens_and_timestamps_equal_the_hf_processor(standin, hf_processor, frames):
    """Over clip lengths, sizes and rates: the same pads, the same timestamp text between runs
    (transformers' ``Qwen3VLProcessor`` expands the clip), and the runs add up to ``num_tokens``."""
    proc = build_processor({"checkpoint": str(standin), "modality": "video"})
    tok = hf_processor.tokenizer
    for i, (n, h, w, fps) in enumerate(CLIP_SHAPES):
        clip = frames(n, h, w, seed=i)
        feats = proc.preprocess(Video(frames=clip, fps=fps))
        ref = hf_processor(text=VIDEO_TEXT, videos=[clip], video_metadata=[{"total_num_frames": n, "fps": fps}], return_tensors="pt")
        assert proc.num_tokens(feats) == _count(ref, hf_processor, "<|video_pad|>"), (n, h, w)
        assert torch.equal(feats["video_grid_thw"], ref["video_grid_thw"][0])
        assert torch.equal(feats["pixel_values_videos"], ref["pixel_values_videos"])
        t, gh, gw = proc.grid(feats)
        runs = proc.runs(feats)
        written = "".join(text + VIDEO_TEXT.replace("<|video_pad|>", "<|video_pad|>" * (a * b * c)) for text, (a, b, c) in runs)
        assert tok.encode(written, add_special_tokens=False) == ref["input_ids"][0].tolist(), (n, h, w, fps)
        assert len(runs) == t and all(g == (1, gh, gw) for _, g in runs)


def test_sampling_and_counts_are_transformers_video_processors(standin, frames):
    """``Qwen3VLVideoProcessor`` (built without torchvision; only its calls need it): its
    ``sample_frames`` keeps our frames, its ``get_num_of_video_patches`` counts our tokens."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    settings = video_settings(standin, "test")
    hf = Qwen3VLVideoProcessor(**{k: v for k, v in settings.items() if k not in ("video_processor_type", "processor_class")})
    ours = FrameVideoProcessor(settings)
    proc = build_processor({"checkpoint": str(standin), "modality": "video"})
    for n, h, w, fps in CLIP_SHAPES + [(100, 48, 64, 30.0), (61, 32, 32, 24.0)]:
        kept = hf.sample_frames(VideoMetadata(total_num_frames=n, fps=fps))
        assert ours.sample_indices(n, fps).tolist() == kept.tolist(), (n, fps)
        feats = proc.preprocess(Video(frames=frames(n, h, w), fps=fps))
        assert proc.num_tokens(feats) == hf.get_num_of_video_patches(len(kept), h, w) // 4, (n, h, w, fps)


def test_a_clip_not_sampled_records_every_frame():
    """With ``do_sample_frames`` off, the metadata gets every frame's index (the timestamps are read
    from them), where :class:`omnicore_family_kit.media_processors.FrameVideoProcessor` leaves it as given (None)."""
    clip = np.zeros((3, 32, 32, 3), np.uint8)
    settings = {"do_sample_frames": False, "size": {"shortest_edge": 1024, "longest_edge": 65536}}
    out = FrameVideoProcessor(settings)(videos=[clip], video_metadata=[{"total_num_frames": 3, "fps": 2.0}], return_metadata=True)
    assert out["video_metadata"][0].frames_indices == [0, 1, 2] and out["video_grid_thw"].tolist() == [[2, 2, 2]]


def test_frame_sampling_follows_the_settings(standin):
    """``Qwen3VLVideoProcessor.sample_frames``' rule, worked by hand."""
    vp = FrameVideoProcessor(video_settings(standin, "test"))  # fps 2, min_frames 4
    assert vp.sample_indices(20, 10.0).tolist() == [0, 6, 13, 19]  # 4 frames by the rate, spread over the clip
    assert len(vp.sample_indices(30, 3.0)) == 20 and vp.sample_indices(30, 3.0)[[0, -1]].tolist() == [0, 29]
    assert vp.sample_indices(3, 1.0).tolist() == [0, 1, 2]  # min_frames 4, capped by the clip's 3
    assert vp.sample_indices(10, None).tolist() == vp.sample_indices(10, 24.0).tolist()  # fps unknown: 24, as transformers
    assert FrameVideoProcessor(dict(video_settings(standin, "t"), fps=None, num_frames=5)).sample_indices(9, 3.0).tolist() == [
        0,
        2,
        4,
        6,
        8,
    ]
    with pytest.raises(ValueError, match="mutually exclusive"):
        vp.sample_indices(10, 2.0, num_frames=4, target_fps=1.0)


def _encoder(folder, modality="image"):
    return fill_now(build_encoder({"checkpoint": str(folder), "modality": modality}, hidden_size=64)).eval()


def test_tower_rows_equal_the_hf_image_and_video_features(standin, hf_model, image, frames):
    enc = _encoder(standin)
    proc = enc.processor
    feats = [proc.preprocess(image(h, w, seed=i)) for i, (h, w) in enumerate([(60, 45), (128, 128), (20, 300), (200, 150)])]
    batch = proc.collate(feats)
    with torch.no_grad():
        got = enc(batch)
        want = hf_model.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"])
    assert got.embeds.shape == (sum(proc.num_tokens(f) for f in feats), 64) and len(got.layer_embeds) == 2
    torch.testing.assert_close(got.embeds, torch.cat(want.pooler_output), atol=1e-5, rtol=0)
    for mine, theirs in zip(got.layer_embeds, want.deepstack_features, strict=True):
        torch.testing.assert_close(mine, torch.cat(theirs), atol=1e-5, rtol=0)
    vproc = build_processor({"checkpoint": str(standin), "modality": "video"})
    clips = [vproc.preprocess(Video(frames=frames(n, h, w, seed=n), fps=fps)) for n, h, w, fps in CLIP_SHAPES[:4]]
    vbatch = vproc.collate(clips)
    with torch.no_grad():
        got = enc(vbatch)
        want = hf_model.model.get_video_features(vbatch["pixel_values_videos"], vbatch["video_grid_thw"])
    torch.testing.assert_close(got.embeds, torch.cat(want.pooler_output), atol=1e-5, rtol=0)
    for mine, theirs in zip(got.layer_embeds, want.deepstack_features, strict=True):
        torch.testing.assert_close(mine, torch.cat(theirs), atol=1e-5, rtol=0)


def test_lm_logits_equal_the_hf_model_on_text(standin, hf_model):
    found = Qwen3VLFoundation({"checkpoint": str(standin)})
    tok = found.build_tokenizer()
    lm = fill_now(found.build_model(len(tok))).eval()
    assert type(lm.model).__name__ == "Qwen3VLTextModel"
    ids = torch.tensor([tok.encode("<|im_start|>user\nhello there<|im_end|>\n", add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(lm(input_ids=ids).logits, hf_model(input_ids=ids).logits, atol=1e-5, rtol=0)
    grown = found.build_model(len(tok) + 50)  # more rows than the checkpoint: the extra rows are filled later
    assert grown.get_input_embeddings().weight.shape[0] == len(tok) + 50 and grown.omnicore_pending_load.rows


def test_part_names_split_the_tower_exactly(standin):
    enc = _encoder(standin)
    parts = Qwen3VLFoundation({"checkpoint": str(standin)}).part_names()
    names = ["encoders.image." + n for n, _ in enc.named_parameters()]
    visual = [n for n in names if any(n.startswith(p) for p in parts["visual"])]
    merger = [n for n in names if any(n.startswith(p) for p in parts["merger"])]
    assert visual and merger and sorted(visual + merger) == sorted(names)
    assert any(".deepstack_merger_list.1." in n for n in merger) and any(".pos_embed." in n for n in visual)
    assert all(".merger." in n or ".deepstack_merger_list." in n for n in merger)


def _relayout(src, dst):
    """``src``'s checkpoint re-saved under the older top-level names (``visual.*``, ``model.*``)."""
    shutil.copytree(src, dst)
    names = {"model.visual.": "visual.", "model.language_model.": "model.", "lm_head.": "lm_head."}
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        tensors = {next(new + k[len(old) :] for old, new in names.items() if k.startswith(old)): f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return tensors


def test_both_layouts_load_the_same_tensors(standin, tmp_path):
    tensors = _relayout(standin, tmp_path / "old")
    for folder in (standin, tmp_path / "old"):
        enc = _encoder(folder)
        assert torch.equal(enc.visual.pos_embed.weight, tensors["visual.pos_embed.weight"])
        assert torch.equal(enc.visual.deepstack_merger_list[1].linear_fc2.bias, tensors["visual.deepstack_merger_list.1.linear_fc2.bias"])
        lm = fill_now(Qwen3VLFoundation({"checkpoint": str(folder)}).build_model(10))
        assert torch.equal(lm.lm_head.weight, tensors["lm_head.weight"])
        assert torch.equal(lm.model.layers[1].mlp.up_proj.weight, tensors["model.layers.1.mlp.up_proj.weight"])


def test_bad_checkpoints_and_media_name_what_to_fix(standin, tmp_path, image):
    with pytest.raises(ValueError, match=r"model.encoders.image.options.checkpoint: .* has no config.json"):
        build_processor({"checkpoint": str(tmp_path)})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    with pytest.raises(ValueError, match=r"model_type 'qwen2_vl', not one of qwen3_vl"):
        Qwen3VLFoundation({"checkpoint": str(tmp_path)})
    with pytest.raises(ValueError, match=r"hidden size of 64, but the foundation's is 48"):
        build_encoder({"checkpoint": str(standin)}, hidden_size=48)
    shutil.copytree(standin, tmp_path / "broken")
    with safe_open(str(standin / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != "model.visual.deepstack_merger_list.0.norm.weight"}
    save_file(tensors, str(tmp_path / "broken" / "model.safetensors"))
    with pytest.raises(LoadError, match=r"model.encoders.image.options.checkpoint: .*deepstack_merger_list.0.norm.weight"):
        build_encoder({"checkpoint": str(tmp_path / "broken")}, hidden_size=64)
    with pytest.raises(TypeError, match="expects a PIL image"):
        build_processor({"checkpoint": str(standin)}).preprocess(np.zeros((4, 4, 3)))
    with pytest.raises(TypeError, match="expects an omnicore.api.Video"):
        build_processor({"checkpoint": str(standin), "modality": "video"}).preprocess(image(30, 30))


def test_a_tied_checkpoint_reads_the_head_from_the_embeddings(standin, tmp_path):
    """Qwen3-VL-2B and 4B tie their embeddings (no ``lm_head.weight`` in their safetensors): the LM
    is tied and its logits are transformers'."""
    from transformers import AutoModelForImageTextToText

    folder = tmp_path / "tied"
    shutil.copytree(standin, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=True)))
    with safe_open(str(standin / "model.safetensors"), "pt") as f:
        save_file({k: f.get_tensor(k) for k in f.keys() if k != "lm_head.weight"}, str(folder / "model.safetensors"))
    hf = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    found = Qwen3VLFoundation({"checkpoint": str(folder)})
    lm = fill_now(found.build_model(len(found.build_tokenizer()))).eval()
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    ids = torch.tensor([[5, 60, 7, 250, 9]])
    with torch.no_grad():
        torch.testing.assert_close(lm(input_ids=ids).logits, hf(input_ids=ids).logits, atol=1e-5, rtol=0)


def test_the_foundation_serves_its_model_types():
    """foundation/qwen3_vl names its model type in its spec, so ``name: auto`` picks it."""
    from omnicore.api import Registry
    from omnicore_family_qwen3_vl import plugin

    assert plugin.MODEL_TYPES == ("qwen3_vl",)
    assert [s.extra["model_types"] for s in plugin.omnicore_foundations()] == [plugin.MODEL_TYPES]
    assert Registry.discover().foundation_for("qwen3_vl") == "qwen3_vl"


@pytest.mark.parametrize(
    ("model_type", "foundation"),
    [
        ("qwen2_vl", "qwen2_vl"),
        ("qwen2_5_vl", "qwen2_vl"),
        ("llava", "generic"),  # foundation/llava claims no model type for auto: the generic family serves llava
        ("qwen2_audio", "qwen2_audio"),
        ("qwen2_5_omni", "qwen2_5_omni"),
        ("gemma3", "generic"),  # no family names it: the generic family of omnicore-family-kit serves it
    ],
)
def test_a_checkpoint_of_another_family_names_the_foundation_serving_it(tmp_path, model_type, foundation):
    pytest.importorskip(f"omnicore_family_{'kit' if foundation == 'generic' else foundation}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(
        ValueError,
        match=rf"model_type '{model_type}', not one of qwen3_vl; model type '{model_type}' is served by "
        rf"foundation/{foundation}: set model.foundation.name to {foundation} \(or auto\); otherwise point options.checkpoint",
    ):
        Qwen3VLFoundation({"checkpoint": str(tmp_path)})
    with pytest.raises(
        ValueError,
        match=rf"model.encoders.image.options.checkpoint: .*served by foundation/{foundation}: "
        rf"point model.foundation \(name: {foundation}, or auto\) at it, not model.encoders.image;",
    ):
        build_processor({"checkpoint": str(tmp_path)})


def test_the_hint_comes_from_the_installed_foundations(tmp_path, monkeypatch, isolated_registry):
    """The foundation named is whichever installed one lists the model type (no table here): with
    only this family installed a Qwen2-VL checkpoint gets no hint."""
    from omnicore_family_kit import checkpoint

    rows = tuple(isolated_registry("omnicore_family_qwen3_vl.plugin").rows)
    monkeypatch.setattr(checkpoint, "_installed_rows", lambda: rows)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    with pytest.raises(ValueError, match=r"model_type 'qwen2_vl', not one of qwen3_vl; otherwise point options.checkpoint"):
        Qwen3VLFoundation({"checkpoint": str(tmp_path)})


def test_building_the_lm_logs_the_checkpoint_model_type(standin, caplog):
    caplog.set_level("INFO", logger="omnicore_family_qwen3_vl.foundation")
    Qwen3VLFoundation({"checkpoint": str(standin)}).build_model(10)
    assert f"foundation qwen3_vl: {standin} is a qwen3_vl checkpoint (Qwen3VLForConditionalGeneration)" in caplog.text
