"""Tests of decoder/movqgan on tiny from-scratch MoVQ models (real values, no downloads)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from omnicore_image_movqgan.decoder import MoVQGANOptions, build, make_vq_config
from omnicore_image_movqgan.fit import fit_vq
from omnicore_image_movqgan.fit import main as fit_main

# 16x16 images, 2 levels -> f = 2, 8x8 = 64 codes of a 64-entry codebook.
TINY = {"block_out_channels": [32, 32], "latent_channels": 4, "num_vq_embeddings": 64, "sample_size": 16}
H = 32


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Run these tiny models on one intra-op thread (restored afterwards).

    On a shared 2-core machine, 2 OpenMP threads competing with another busy process made a 30-step
    fit 25x slower (39 s vs 1.6 s, measured); one thread is as fast when the machine is idle.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _images(n: int, size: int = 20, seed: int = 0) -> list[Image.Image]:
    """Synthetic images: a bright rectangle and a coloured disc on a dark background, of varied sizes."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a = np.zeros((size, size + i % 3, 3), np.uint8)
        y0, x0 = rng.integers(0, size // 2, 2)
        a[y0 : y0 + size // 3, x0 : x0 + size // 4] = 230
        yy, xx = np.mgrid[:size, : size + i % 3]
        cy, cx = rng.integers(4, size - 4, 2)
        a[(yy - cy) ** 2 + (xx - cx) ** 2 < 9] = rng.integers(60, 255, 3)
        out.append(Image.fromarray(a))
    return out


@pytest.fixture(scope="module")
def dec():
    torch.manual_seed(0)
    return build({"config": TINY, "image_size": 16}, hidden_size=H)


def _batch(dec, imgs):
    return dec.processor.collate([dec.processor.preprocess(im) for im in imgs])


def test_uses_spatial_norm(dec):
    from diffusers.models.attention_processor import SpatialNorm

    assert dec.vq.config.norm_type == "spatial"
    norms = [m for m in dec.vq.decoder.modules() if isinstance(m, SpatialNorm)]
    assert norms, "decoder has no SpatialNorm: not the MoVQ architecture"
    assert isinstance(dec.vq.decoder.conv_norm_out, SpatialNorm)
    # the conditioning convs read the D-dim codebook vectors
    assert norms[0].conv_y.in_channels == dec.code_dim == 4


def test_norm_type_is_forced_and_checked():
    assert make_vq_config({})["norm_type"] == "spatial"
    with pytest.raises(ValueError, match="spatial"):
        make_vq_config({"norm_type": "group"})
    with pytest.raises(ValueError, match="multiple of 32"):
        make_vq_config({"block_out_channels": [16, 32]})


def test_preprocess_and_num_tokens(dec):
    f = dec.processor.preprocess(Image.new("L", (28, 21), 255))
    pv = f["pixel_values"]
    assert pv.shape == (3, 16, 16) and pv.dtype == torch.float32
    assert torch.allclose(pv, torch.ones_like(pv))
    assert dec.downsample_factor == 2 and dec.processor.num_tokens(f) == 64 == dec.num_image_tokens
    assert dec.processor.preprocess(Image.new("RGB", (16, 16)))["pixel_values"].min() == -1


def test_encode_codes(dec):
    imgs = _images(3)
    codes = dec.encode(_batch(dec, imgs))
    assert codes.dtype == torch.long and codes.shape == (3 * 64,)
    assert int(codes.min()) >= 0 and int(codes.max()) < dec.codebook_size == 64
    # item order: encoding one item alone gives its slice
    one = dec.encode(_batch(dec, imgs[1:2]))
    assert torch.equal(one, codes[64:128])


def test_decode_matches_diffusers_forward_path(dec):
    imgs = _images(2, seed=1)
    batch = _batch(dec, imgs)
    codes = dec.encode(batch).reshape(2, -1)
    with torch.no_grad():
        ref = dec.vq.decode(dec.vq.encode(batch["pixel_values"]).latents).sample
        ref_fwd = dec.vq(batch["pixel_values"]).sample
    ours = dec.decode_pixels(codes)
    assert ours.shape == (2, 3, 16, 16)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours, ref_fwd, atol=1e-5, rtol=0)
    img = dec.decode(codes[1])
    assert isinstance(img, Image.Image) and img.mode == "RGB" and img.size == (16, 16)
    expect = ((ref[1].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).numpy()
    assert np.abs(np.asarray(img).astype(int) - expect.astype(int)).max() <= 1
    # [g, g] input works too; wrong counts and out-of-range codes fail clearly
    assert np.array_equal(np.asarray(dec.decode(codes[1].reshape(8, 8))), np.asarray(img))
    with pytest.raises(ValueError, match="64 codes"):
        dec.decode(codes[1][:10])
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        dec.decode(torch.full((64,), 64))


def test_embed_head_and_gradients(dec):
    codes = torch.tensor([0, 5, 63, 7])
    e = dec.embed(codes)
    assert e.shape == (4, H)
    logits = dec.head(torch.randn(4, H))
    assert logits.shape == (4, 64)
    dec.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(dec.head(dec.embed(codes)), codes)
    loss.backward()
    assert dec.lm_head.weight.grad is not None and dec.lm_head.weight.grad.abs().sum() > 0
    assert dec.code_embed.weight.grad[codes].abs().sum() > 0
    # frozen tokenizer: no VQ parameter is trainable
    assert not any(p.requires_grad for p in dec.vq.parameters())
    dec.train()
    assert not dec.vq.training
    d = dec.dummy_codes()
    assert d.dtype == torch.long and d.shape == (64,)
    dec.zero_grad(set_to_none=True)


def test_save_pretrained_roundtrip(dec, tmp_path):
    with torch.no_grad():
        dec.code_embed.weight.add_(1.0)  # make the adapter differ from any fresh init
    dec.save_pretrained(tmp_path / "ck")
    names = {p.name for p in (tmp_path / "ck").iterdir()}
    assert names == {"config.json", "diffusion_pytorch_model.safetensors", "omnicore_extra.safetensors"}
    from safetensors import safe_open

    with safe_open(str(tmp_path / "ck" / "omnicore_extra.safetensors"), "pt") as f:
        header = f.metadata()
        assert sorted(f.keys()) == ["code_embed.weight", "lm_head.bias", "lm_head.weight"]
        assert torch.equal(f.get_tensor("code_embed.weight"), dec.code_embed.weight)
    assert header["component"] == "decoder/movqgan"
    assert json.loads(header["meta"]) == {"image_size": 16, "hidden_size": H, "codebook_size": 64}

    torch.manual_seed(77)  # nothing may come from fresh initialisation
    back = build({"checkpoint": str(tmp_path / "ck")}, hidden_size=H)
    assert back.image_size == 16 and back.codebook_size == 64
    batch = _batch(dec, _images(2, seed=2))
    c1, c2 = dec.encode(batch), back.encode(batch)
    assert torch.equal(c1, c2)
    torch.testing.assert_close(back.decode_pixels(c2.reshape(2, -1)), dec.decode_pixels(c1.reshape(2, -1)), atol=0, rtol=0)
    for name in ("code_embed.weight", "lm_head.weight", "lm_head.bias"):
        assert torch.equal(back.state_dict()[name], dec.state_dict()[name]), name
    for k, v in dec.vq.state_dict().items():
        assert torch.equal(back.vq.state_dict()[k], v), k
    with pytest.raises(ValueError) as err:
        build({"checkpoint": str(tmp_path / "ck")}, hidden_size=H + 1)
    msg = str(err.value)
    assert str(tmp_path / "ck" / "omnicore_extra.safetensors") in msg
    assert f"'code_embed.weight' has shape (64, {H}) in the file, (64, {H + 1}) in this module" in msg
    assert f"'lm_head.weight' has shape (64, {H}) in the file, (64, {H + 1}) in this module" in msg
    assert f"saved with image_size=16, hidden_size={H}, codebook_size=64: build decoder/movqgan with those settings" in msg


def test_checkpoint_missing_a_vq_tensor_raises_naming_it(tmp_path):
    from diffusers import VQModel
    from safetensors.torch import load_file, save_file

    VQModel(**make_vq_config(TINY)).save_pretrained(str(tmp_path))
    file = tmp_path / "diffusion_pytorch_model.safetensors"
    state = load_file(str(file))
    del state["quantize.embedding.weight"]
    save_file(state, str(file))
    with pytest.raises(ValueError, match=r"MoVQGAN checkpoint .* lacks 1 of the .* tensors of VQModel: 'quantize\.embedding\.weight'"):
        build({"checkpoint": str(tmp_path)}, hidden_size=8)


def test_old_adapter_files_are_not_silently_ignored(dec, tmp_path):
    dec.vq.save_pretrained(str(tmp_path))
    (tmp_path / "omnicore_decoder.json").write_text(json.dumps({"image_size": 16}))
    with pytest.raises(ValueError, match="holds omnicore_decoder.json from an older version of decoder/movqgan .*Re-save"):
        build({"checkpoint": str(tmp_path)}, hidden_size=H)


@pytest.mark.slow
def test_fit_cli_folder_loads_with_its_image_size(tmp_path):
    for i, im in enumerate(_images(4, seed=5)):
        im.save(tmp_path / f"{i}.png")
    cfg = json.dumps({**TINY, "sample_size": 32})  # the fitted size (16), not the config's 32, must win
    assert (
        fit_main(
            [
                "--images",
                str(tmp_path / "*.png"),
                "--out",
                str(tmp_path / "movq"),
                "--steps",
                "2",
                "--batch-size",
                "2",
                "--image-size",
                "16",
                "--config",
                cfg,
            ]
        )
        == 0
    )
    names = {p.name for p in (tmp_path / "movq").iterdir()}
    assert names == {"config.json", "diffusion_pytorch_model.safetensors"}  # a plain diffusers folder, no adapter yet
    assert json.loads((tmp_path / "movq" / "config.json").read_text())["sample_size"] == 16
    d = build({"checkpoint": str(tmp_path / "movq")}, hidden_size=8)
    assert d.image_size == 16 and d.num_image_tokens == 64
    assert build({"checkpoint": str(tmp_path / "movq"), "image_size": 32}, hidden_size=8).image_size == 32


@pytest.mark.slow
def test_plain_diffusers_folder_loads(tmp_path):
    from diffusers import VQModel

    torch.manual_seed(1)
    vq = VQModel(**make_vq_config(TINY))
    vq.save_pretrained(str(tmp_path / "movq"))
    d = build({"checkpoint": str(tmp_path / "movq"), "image_size": 16}, hidden_size=8)
    assert d.code_embed.weight.shape == (64, 8)  # fresh adapter
    x = torch.rand(1, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        ref = vq(x).sample
    torch.testing.assert_close(d.decode_pixels(d.encode({"pixel_values": x}).reshape(1, -1)), ref, atol=1e-5, rtol=0)
    # the Kandinsky layout: pointing at the pipeline root hints at the movq subfolder
    with pytest.raises(ValueError, match="did you mean"):
        build({"checkpoint": str(tmp_path)}, hidden_size=8)


def test_bad_checkpoint_folders(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        build({"checkpoint": str(tmp_path / "nope")}, hidden_size=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty' has no config\.json.*VQModel"):
        build({"checkpoint": str(tmp_path / "empty")}, hidden_size=8)
    with pytest.raises(ValueError, match="not both"):
        MoVQGANOptions(checkpoint="x", config={"latent_channels": 4})
    with pytest.raises(Exception, match="extra"):
        MoVQGANOptions(checkpiont="x")


@pytest.mark.slow
def test_fit_vq_lowers_reconstruction_loss():
    torch.manual_seed(0)
    d = build({"config": TINY, "image_size": 16}, hidden_size=8)
    before = [p.clone() for p in d.vq.parameters()]
    losses = fit_vq(d, _images(12, seed=3), steps=30, batch_size=8, lr=3e-3, seed=0)
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:3]), losses
    assert any(not torch.equal(a, b) for a, b in zip(before, d.vq.parameters()))
    assert not any(p.requires_grad for p in d.vq.parameters())  # freezing restored


@pytest.mark.cli
def test_plugin_module_is_torch_free():
    code = "import omnicore_image_movqgan.plugin, sys; assert 'torch' not in sys.modules and 'diffusers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registry_builds_decoder():
    from omnicore.api import Decoder, Registry

    reg = Registry.discover()
    row = [r for r in reg.components("decoder") if r.name == "movqgan"]
    assert row and row[0].status == "available" and row[0].provider == "omnicore-image-movqgan"
    d = reg.build("decoder", "movqgan", {"config": TINY, "image_size": 16}, hidden_size=32)
    assert isinstance(d, Decoder) and d.modality == "image" and d.hidden_size == 32
    from omnicore.api import RegistryError

    with pytest.raises(RegistryError, match="image_sise"):
        reg.build("decoder", "movqgan", {"image_sise": 16}, hidden_size=32)
