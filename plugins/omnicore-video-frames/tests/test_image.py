"""encoder/video_frames_image: still images as one-tubelet clips through the video tower, and the
tower shared with video (``model.encoders.video.share: image``), as Qwen2-VL's one tower encodes both."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from omnicore.api import Video
from omnicore.testing import Config, EncoderContract, build_omni_model, encoder_token
from omnicore_video_frames.processor import VideoFramesProcessor, build_image_processor

TOWER = dict(depth=1, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=32, patch_size=4, spatial_merge_size=2)


def images(seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((28, 28), (20, 36), (16, 16))]


class TestVideoFramesImageContract(EncoderContract):
    name = "video_frames_image"
    modality = "image"
    options = {"config": TOWER, "image_size": 16}
    hidden_size = 32

    def make_media(self, modality: str) -> list[Any]:
        assert modality == "image"
        return images(self.seed)


@pytest.mark.parametrize("image_size", [16, (8, 24), None])
def test_an_image_is_the_clip_of_two_copies_of_itself(image_size):
    """The image processor's features equal the video processor's for a 2-frame clip of the image
    (at any rate: both frames are sampled), grid (1, h, w)."""
    proc = build_image_processor({"config": TOWER, "image_size": image_size})
    video = VideoFramesProcessor(patch_size=4, merge_size=2, temporal_patch_size=2, fps=1.0, max_frames=2, frame_size=image_size)
    for img in images(1):
        got = proc.preprocess(img)
        frame = np.asarray(img.convert("RGB"))
        want = video.preprocess(Video(frames=np.stack([frame, frame]), fps=1.0))
        assert torch.equal(got["pixel_values_videos"], want["pixel_values_videos"])
        assert torch.equal(got["video_grid_thw"], want["video_grid_thw"]) and int(got["video_grid_thw"][0]) == 1
        assert proc.grid(got)[0] == 1 and proc.num_tokens(got) == video.num_tokens(want)


def test_image_size_must_fit_the_patches():
    with pytest.raises(
        ValueError, match=r"each side must be a multiple of patch_size \* spatial_merge_size = 8 \(e.g. 8 or 16 instead of 12\)"
    ):
        build_image_processor({"config": TOWER, "image_size": 12})


def test_video_shares_the_image_tower(tmp_path):
    """With ``video: {share: image}`` the model has one tower, which encodes both modalities: the
    embeddings at the image and the video placeholders are that module's outputs on each batch."""
    from omnicore.api import byte_tokenizer

    byte_tokenizer().save_pretrained(tmp_path / "tok")
    lm = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": 512}  # fmt: skip
    cfg = Config.model_validate(
        {
            "run": {"output_dir": str(tmp_path / "run")},
            "model": {
                "foundation": {"name": "hf_causal_lm", "options": {"config": lm, "tokenizer": str(tmp_path / "tok")}},
                "encoders": {
                    "image": {"name": "video_frames_image", "options": {"config": TOWER, "image_size": 16}},
                    "video": {"name": "video_frames", "share": "image", "options": {"config": TOWER, "fps": 4, "max_frames": 4}},
                },
            },
            "data": {"train": str(tmp_path / "d.jsonl")},
        }
    )
    model, tok = build_omni_model(cfg)
    model.eval()
    assert list(model.encoders) == ["image"] and model.shared["video"][0] == "image"
    assert sum(p.numel() for p in model.encoders.parameters()) == sum(p.numel() for p in model.encoders["image"].parameters())
    procs = model.encoder_processors()
    clip = Video(frames=np.random.default_rng(0).integers(0, 256, (4, 16, 24, 3), dtype=np.uint8), fps=4.0)
    feats = {"image": procs["image"].preprocess(images(2)[0]), "video": procs["video"].preprocess(clip)}
    img, vid = (tok.convert_tokens_to_ids(encoder_token(m)) for m in ("image", "video"))
    text = tok.encode("look", add_special_tokens=False)
    ids = torch.tensor(
        [text + [img] * procs["image"].num_tokens(feats["image"]) + text + [vid] * procs["video"].num_tokens(feats["video"])]
    )
    inputs = {m: procs[m].collate([f]) for m, f in feats.items()}
    with torch.no_grad():
        embeds, _, _ = model.embed(ids, inputs, {})
        tower = model.encoders["image"]
        image_rows, video_rows = tower(inputs["image"]), tower(inputs["video"])
    ids = ids[0]
    assert image_rows.shape[0] == 4 and video_rows.shape[0] == 2 * 2 * 3  # (1, 2, 2) and (2, 2, 3) after the merge
    torch.testing.assert_close(embeds[0][ids == img], image_rows, atol=0, rtol=0)
    torch.testing.assert_close(embeds[0][ids == vid], video_rows, atol=0, rtol=0)
