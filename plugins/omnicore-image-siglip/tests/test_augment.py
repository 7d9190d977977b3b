"""Tests of the training-time image augmentation of encoder ``siglip`` (omnicore_image_siglip.augment)."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch

from omnicore_image_siglip.augment import AugmentOptions, affine_matrices, random_affine
from omnicore_image_siglip.encoder import build

TINY = dict(image_size=28, patch_size=7, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def _warp(pixels: torch.Tensor, shift=(0.0, 0.0), angle=0.0, zoom=1.0) -> torch.Tensor:
    theta = affine_matrices(torch.tensor([shift]), torch.tensor([angle]), torch.tensor([zoom]))
    grid = torch.nn.functional.affine_grid(theta, list(pixels.shape), align_corners=False)
    return torch.nn.functional.grid_sample(pixels, grid, mode="bilinear", padding_mode="border", align_corners=False)


def test_whole_pixel_shift_moves_content_and_repeats_the_border():
    img = torch.rand(1, 3, 28, 28)
    out = _warp(img, shift=(2 / 28, -3 / 28))  # 2 px right, 3 px up
    ref = torch.nn.functional.pad(img, (2, 0, 0, 3), mode="replicate")[:, :, 3:, :28]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_quarter_turn_equals_rot90_and_identity_is_exact():
    img = torch.rand(1, 1, 28, 28)
    torch.testing.assert_close(_warp(img), img, atol=1e-5, rtol=0)
    turned = _warp(img, angle=math.pi / 2)
    torch.testing.assert_close(turned, torch.rot90(img, k=1, dims=(2, 3)), atol=1e-5, rtol=0)


def test_zoom_two_keeps_the_centre_and_doubles_distances():
    img = torch.zeros(1, 1, 28, 28)
    img[0, 0, 14, 16] = 1.0  # 2 px right of the centre (13.5, 13.5) -> 2.5 px
    out = _warp(img, zoom=2.0)[0, 0]
    ys, xs = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    cx, cy = (out * xs).sum() / out.sum(), (out * ys).sum() / out.sum()
    assert cx.item() == pytest.approx(13.5 + 2 * 2.5, abs=1e-4) and cy.item() == pytest.approx(13.5 + 2 * 0.5, abs=1e-4)


def test_random_shift_stays_within_its_bound_and_varies():
    img = torch.zeros(64, 1, 28, 28)
    img[:, :, 12:16, 12:16] = 1.0  # a blob centred on the image centre
    out = random_affine(img, AugmentOptions(shift=0.1), torch.Generator().manual_seed(0))
    ys, xs = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    mass = out.sum((1, 2, 3))
    dx = (out[:, 0] * xs).sum((1, 2)) / mass - 13.5
    dy = (out[:, 0] * ys).sum((1, 2)) / mass - 13.5
    assert dx.abs().max() <= 2.8 + 1e-4 and dy.abs().max() <= 2.8 + 1e-4  # 10% of 28 px
    assert dx.abs().max() > 1.5 and dx.std() > 0.5  # drawn over the whole range, per image


def test_inactive_options_return_the_input_itself():
    img = torch.rand(2, 3, 28, 28)
    assert random_affine(img, AugmentOptions()) is img


def test_options_refuse_out_of_range_values():
    with pytest.raises(pydantic.ValidationError, match="shift"):
        build({"config": TINY, "augment": {"shift": 0.7}}, hidden_size=32)
    with pytest.raises(pydantic.ValidationError, match="skew"):
        build({"config": TINY, "augment": {"skew": 1}}, hidden_size=32)


def test_encoder_augments_in_training_mode_only():
    torch.manual_seed(0)
    enc = build({"config": TINY, "augment": {"shift": 0.1, "rotate": 10, "scale": 0.1}}, hidden_size=32)
    plain = build({"config": TINY}, hidden_size=32)
    plain.load_state_dict(enc.state_dict())
    batch = {"pixel_values": torch.rand(4, 3, 28, 28) * 2 - 1}
    enc.eval(), plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(enc(batch), plain(batch), rtol=0, atol=0)
    enc.train(), plain.train()
    with torch.no_grad():
        moved = enc(batch)
        same = plain(batch)
    assert (moved - same).abs().max() > 1e-3


# ---- patch merging (the ``merge`` option) ----------------------------------------------------


def test_merge_concatenates_each_block_of_neighbouring_patches():
    from omnicore_image_siglip.encoder import merge_patches

    side, d = 4, 3
    hidden = torch.arange(2 * side * side * d, dtype=torch.float32).reshape(2, side * side, d)
    out = merge_patches(hidden, side, 2)
    assert out.shape == (2, 4, 4 * d)
    for b in range(2):
        for i in range(2):
            for j in range(2):
                ref = torch.cat([hidden[b, (2 * i + a) * side + (2 * j + c)] for a in range(2) for c in range(2)])
                assert torch.equal(out[b, i * 2 + j], ref)


def test_merged_encoder_gives_fewer_tokens_and_round_trips(tmp_path):
    cfg = dict(TINY, image_size=32, patch_size=4)
    torch.manual_seed(0)
    enc = build({"config": cfg, "merge": 2}, hidden_size=32).eval()
    batch = {"pixel_values": torch.rand(3, 3, 32, 32) * 2 - 1}
    with torch.no_grad():
        out = enc(batch)
    assert out.shape == (3 * 16, 32) and enc.processor.num_tokens({"pixel_values": batch["pixel_values"][0]}) == 16
    assert enc.processor.grid({"pixel_values": batch["pixel_values"][0]}) == (1, 4, 4)
    enc.save_pretrained(tmp_path / "enc")
    again = build({"checkpoint": str(tmp_path / "enc"), "merge": 2}, hidden_size=32).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(batch), out, rtol=0, atol=0)
    with pytest.raises(ValueError, match="merge 3"):
        build({"config": cfg, "merge": 3}, hidden_size=32)
