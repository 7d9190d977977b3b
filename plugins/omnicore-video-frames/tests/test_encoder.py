"""The video_frames encoder with real values from tiny, randomly initialised towers: token order in
time, checkpoints (its own, a plain transformers tower, a full Qwen2-VL folder), freezing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from omnicore.api import Video
from omnicore_video_frames.encoder import build

H = 16
TINY = dict(depth=2, embed_dim=16, num_heads=2, mlp_ratio=2, hidden_size=24, patch_size=4, spatial_merge_size=2)
OPTS = {"config": TINY, "fps": 4, "max_frames": 8, "frame_size": 16}


def clips() -> list[Video]:
    rng = np.random.default_rng(0)
    return [Video(frames=rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8), fps=4.0) for n in (4, 3, 8)]


def encode(enc, videos: list[Video]) -> torch.Tensor:
    with torch.no_grad():
        return enc(enc.processor.collate([enc.processor.preprocess(v) for v in videos]))


def test_tokens_follow_the_grid_in_time():
    """The tower attends within each tubelet step (Qwen2-VL), so a 4-frame clip's 8 tokens (grid (2, 2, 2)) are
    those of its two 2-frame halves encoded as clips of their own, in order: rows 0-3, then rows 4-7."""
    torch.manual_seed(0)
    enc = build(OPTS, hidden_size=H).eval()
    whole = clips()[0]
    halves = [Video(frames=whole.frames[i : i + 2], fps=4.0) for i in (0, 2)]
    assert enc.processor.grid(enc.processor.preprocess(whole)) == (2, 2, 2)
    out = encode(enc, [whole])
    torch.testing.assert_close(out, encode(enc, halves), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out[:4], out[4:])


def test_save_pretrained_round_trip(tmp_path):
    torch.manual_seed(0)
    enc = build(OPTS, hidden_size=H).eval()
    before = encode(enc, clips())
    enc.save_pretrained(tmp_path / "ckpt")
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {"config.json", "model.safetensors", "omnicore_extra.safetensors"}
    with safe_open(str(tmp_path / "ckpt" / "omnicore_extra.safetensors"), "pt") as f:
        meta = f.metadata()
        assert sorted(f.keys()) == ["bias", "weight"]
        assert torch.equal(f.get_tensor("weight"), enc.projector.weight)
    assert meta["component"] == "encoder/video_frames"
    assert json.loads(meta["meta"]) == {"hidden_size": H, "merged_width": 24}
    torch.manual_seed(123)  # nothing may come from fresh initialisation
    loaded = build({"checkpoint": str(tmp_path / "ckpt"), "fps": 4, "max_frames": 8, "frame_size": 16}, hidden_size=H)
    assert loaded.training
    assert torch.equal(encode(loaded.eval(), clips()), before)
    for k, v in enc.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    # the tower folder is a plain transformers checkpoint
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    plain = Qwen2VisionTransformerPretrainedModel.from_pretrained(str(tmp_path / "ckpt"))
    for k, v in enc.tower.state_dict().items():
        assert torch.equal(plain.state_dict()[k], v), k


def test_projector_for_another_hidden_size_is_an_error(tmp_path):
    build(OPTS, hidden_size=H).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="omnicore_extra.safetensors"):
        build({"checkpoint": str(tmp_path / "ckpt"), "frame_size": 16}, hidden_size=H + 1)


@pytest.mark.slow
def test_loads_the_vision_tower_of_a_full_qwen2_vl_folder(tmp_path):
    """A Qwen2VLForConditionalGeneration folder: its vision_config and model.visual.* tensors; the projector starts fresh."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(vocab_size=64, hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2]}
    torch.manual_seed(0)
    full = Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=TINY))
    full.save_pretrained(tmp_path / "full")
    enc = build({"checkpoint": str(tmp_path / "full"), "fps": 4, "frame_size": 16}, hidden_size=H)
    visual = full.model.visual.state_dict()
    assert enc.tower.state_dict().keys() == visual.keys()
    for k, v in visual.items():
        assert torch.equal(enc.tower.state_dict()[k], v), k
    feats = enc.processor.collate([enc.processor.preprocess(v) for v in clips()])
    with torch.no_grad():
        merged = full.model.visual(feats["pixel_values_videos"], grid_thw=feats["video_grid_thw"]).pooler_output
        torch.testing.assert_close(enc.eval()(feats), enc.projector(merged))


def test_freeze_keeps_the_tower_and_trains_the_projector():
    enc = build(dict(OPTS, freeze=True), hidden_size=H).train()
    out = enc(enc.processor.collate([enc.processor.preprocess(clips()[1])]))
    out.sum().backward()
    assert all(p.grad is None and not p.requires_grad for p in enc.tower.parameters())
    assert enc.projector.weight.grad is not None and enc.projector.weight.grad.abs().sum() > 0
