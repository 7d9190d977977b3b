"""Tests of the ``siglip`` image encoder: real values from tiny, randomly initialised towers."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from omnicore.api import Encoder
from omnicore_image_siglip.encoder import SiglipEncoderOptions, SiglipImageEncoder, build

H = 32
TINY = dict(image_size=28, patch_size=7, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8), "L"),
        Image.fromarray(rng.integers(0, 256, (45, 60, 3), dtype=np.uint8), "RGB"),
        Image.fromarray(rng.integers(0, 256, (13, 17), dtype=np.uint8), "L"),
    ]


@pytest.fixture
def encoder() -> SiglipImageEncoder:
    torch.manual_seed(0)
    return build({"config": TINY}, hidden_size=H)


def _batch(enc: SiglipImageEncoder) -> dict:
    return enc.processor.collate([enc.processor.preprocess(im) for im in _images()])


def test_contract_and_output_shape(encoder):
    assert isinstance(encoder, Encoder)
    assert encoder.modality == "image"
    feats = [encoder.processor.preprocess(im) for im in _images()]
    for f in feats:
        assert f["pixel_values"].shape == (3, 28, 28) and f["pixel_values"].dtype == torch.float32
    counts = [encoder.processor.num_tokens(f) for f in feats]
    assert counts == [16, 16, 16]
    out = encoder(encoder.processor.collate(feats))
    assert out.shape == (sum(counts), H)
    assert torch.isfinite(out).all()
    # rows are in item order: encoding image 1 alone gives rows 16..31 of the batch output
    alone = encoder(encoder.processor.collate([feats[1]]))
    torch.testing.assert_close(alone, out[16:32], rtol=1e-5, atol=1e-5)


def test_num_tokens_matches_tower_sequence_length():
    torch.manual_seed(0)
    for cfg in (TINY, dict(TINY, image_size=32, patch_size=5)):  # 16 tokens; floor(32/5)^2 = 36 tokens
        enc = build({"config": cfg}, hidden_size=H)
        feats = enc.processor.preprocess(_images()[1])
        hidden = enc.tower(pixel_values=enc.processor.collate([feats])["pixel_values"]).last_hidden_state
        assert hidden.shape[1] == enc.processor.num_tokens(feats) == (cfg["image_size"] // cfg["patch_size"]) ** 2


@pytest.mark.parametrize("image_size", [28, 40])
def test_preprocess_greyscale_matches_independent_computation(image_size):
    enc = build({"config": dict(TINY, image_size=image_size, patch_size=4)}, hidden_size=H)
    grey = np.random.default_rng(1).integers(0, 256, (28, 28), dtype=np.uint8)
    img = Image.fromarray(grey, "L")
    got = enc.processor.preprocess(img)["pixel_values"].numpy()

    rgb = img.convert("RGB").resize((image_size, image_size), resample=Image.Resampling.BICUBIC)
    x = np.asarray(rgb, dtype=np.float64).transpose(2, 0, 1) / 255.0
    mean = np.asarray(enc.image_processor.image_mean, dtype=np.float64)[:, None, None]
    std = np.asarray(enc.image_processor.image_std, dtype=np.float64)[:, None, None]
    want = (x - mean) / std
    assert got.shape == want.shape == (3, image_size, image_size)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert np.array_equal(got[0], got[1]) and np.array_equal(got[0], got[2])  # grey stays grey


def test_save_pretrained_roundtrip(encoder, tmp_path):
    batch = _batch(encoder)
    encoder.eval()
    with torch.no_grad():
        before = encoder(batch)
    encoder.save_pretrained(tmp_path / "ckpt")
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert names == {"config.json", "model.safetensors", "preprocessor_config.json", "omnicore_extra.safetensors"}
    # the projector is in omnicore's one extra-weights format, with the encoder's settings
    with safe_open(str(tmp_path / "ckpt" / "omnicore_extra.safetensors"), "pt") as f:
        meta = f.metadata()
        assert sorted(f.keys()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        assert torch.equal(f.get_tensor("2.weight"), encoder.projector[2].weight)
    assert meta["component"] == "encoder/siglip"
    assert json.loads(meta["meta"]) == {"hidden_size": H, "tower_width": 64, "merge": 1}
    assert json.loads(meta["shapes"])["0.weight"] == [H, 64]
    torch.manual_seed(123)  # a different seed: nothing may come from fresh initialisation
    loaded = build({"checkpoint": str(tmp_path / "ckpt")}, hidden_size=H)
    assert loaded.training  # like a from-scratch build
    loaded.eval()
    with torch.no_grad():
        after = loaded(batch)
    assert torch.equal(before, after)
    for k, v in encoder.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    # the same images preprocessed by the loaded encoder give the same features
    assert torch.equal(_batch(loaded)["pixel_values"], batch["pixel_values"])
    # the tower folder is a plain transformers checkpoint
    from transformers import SiglipVisionModel

    plain = SiglipVisionModel.from_pretrained(str(tmp_path / "ckpt"))
    for k, v in encoder.tower.state_dict().items():
        assert torch.equal(plain.state_dict()[k], v), k


def test_loads_full_siglip_checkpoint_vision_tower(tmp_path):
    from transformers import SiglipConfig, SiglipModel

    torch.manual_seed(0)
    text = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=16,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    full = SiglipModel(SiglipConfig(text_config=text, vision_config=dict(TINY)))
    full.save_pretrained(tmp_path / "full")
    saved = {k[len("vision_model.") :]: v for k, v in full.state_dict().items() if k.startswith("vision_model.")}
    assert saved, "SiglipModel names its vision weights vision_model.*"

    torch.manual_seed(999)
    enc = build({"checkpoint": str(tmp_path / "full")}, hidden_size=H)
    assert not (tmp_path / "full" / "omnicore_extra.safetensors").exists()  # a plain transformers folder
    tower = enc.tower.state_dict()
    assert tower.keys() <= saved.keys()  # everything but the (unused) pooling head
    assert not any(k.startswith("head.") for k in tower)
    for k, v in tower.items():
        assert torch.equal(v, saved[k]), k
    # the fresh tower initialisation is really overwritten
    fresh = build({"config": TINY}, hidden_size=H).tower.state_dict()
    assert not torch.equal(fresh["embeddings.patch_embedding.weight"], tower["embeddings.patch_embedding.weight"])
    # and it encodes like the original vision tower
    pv = _batch(enc)["pixel_values"]
    with torch.no_grad():
        want = full.vision_model(pixel_values=pv).last_hidden_state
        got = enc.tower(pixel_values=pv).last_hidden_state
    torch.testing.assert_close(got, want)
    assert enc(_batch(enc)).shape == (48, H)


def test_loads_siglip_vision_model_checkpoint(tmp_path):
    from transformers import SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(0)
    plain = SiglipVisionModel(SiglipVisionConfig(**TINY))  # with its pooling head
    plain.save_pretrained(tmp_path / "vision")
    enc = build({"checkpoint": str(tmp_path / "vision")}, hidden_size=H)
    saved = plain.state_dict()
    for k, v in enc.tower.state_dict().items():
        assert torch.equal(v, saved[k]), k


def test_checkpoint_missing_a_tower_tensor_raises_naming_it(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import SiglipVisionConfig, SiglipVisionModel

    SiglipVisionModel(SiglipVisionConfig(**TINY)).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["encoder.layers.1.self_attn.k_proj.bias"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        ValueError,
        match=r"SigLIP checkpoint .* lacks 1 of the .* tensors of SiglipVisionModel: 'encoder\.layers\.1\.self_attn\.k_proj\.bias'",
    ):
        build({"checkpoint": str(tmp_path)}, hidden_size=H)


def test_bad_checkpoint_folders(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match="nope.*does not exist.*save_pretrained"):
        build({"checkpoint": str(missing)}, hidden_size=H)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="empty.*no config.json.*model_type 'siglip'"):
        build({"checkpoint": str(empty)}, hidden_size=H)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "whisper"}')
    with pytest.raises(
        ValueError, match="other/config.json has model_type 'whisper', but SiglipVisionModel needs model_type 'siglip_vision_model'"
    ):
        build({"checkpoint": str(other)}, hidden_size=H)


def test_projector_of_another_hidden_size_raises_naming_file_and_shapes(encoder, tmp_path):
    encoder.save_pretrained(tmp_path)
    with pytest.raises(ValueError) as err:
        build({"checkpoint": str(tmp_path)}, hidden_size=H * 2)
    msg = str(err.value)
    assert str(tmp_path / "omnicore_extra.safetensors") in msg
    assert f"'0.weight' has shape ({H}, 64) in the file, ({2 * H}, 64) in this module" in msg
    assert f"'2.weight' has shape ({H}, {H}) in the file, ({2 * H}, {2 * H}) in this module" in msg
    assert f"saved with hidden_size={H}, tower_width=64, merge=1: build encoder/siglip with those settings" in msg


def test_old_projector_file_is_not_silently_ignored(encoder, tmp_path):
    from safetensors.torch import save_file

    encoder.tower.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in encoder.projector.state_dict().items()}, str(tmp_path / "projector.safetensors"))
    with pytest.raises(ValueError, match="holds projector.safetensors from an older version of encoder/siglip .*Re-save the folder"):
        build({"checkpoint": str(tmp_path)}, hidden_size=H)


def test_options_validation():
    with pytest.raises(ValueError, match="either"):
        SiglipEncoderOptions(checkpoint="x", config=TINY)
    with pytest.raises(ValueError, match="set `checkpoint`"):
        SiglipEncoderOptions()
    with pytest.raises(ValueError, match="did you mean 'patch_size'"):
        SiglipEncoderOptions(config=dict(TINY, patch_szie=7))
    with pytest.raises(ValueError, match="extra"):
        SiglipEncoderOptions(config=TINY, frozen=True)
    for name, field in SiglipEncoderOptions.model_fields.items():
        assert field.description, name


def test_dummy_batch(encoder):
    batch = encoder.dummy_batch()
    assert batch["pixel_values"].shape == (1, 3, 28, 28)
    out = encoder(batch)
    assert out.shape == (16, H)
    (0 * out.sum()).backward()
    assert all(p.grad is not None for p in encoder.parameters())


def test_gradients_reach_tower_and_projector(encoder):
    out = encoder(_batch(encoder))
    out.pow(2).mean().backward()
    for name, p in encoder.named_parameters():
        assert p.grad is not None, name
    assert encoder.tower.embeddings.patch_embedding.weight.grad.abs().sum() > 0
    assert encoder.tower.encoder.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert encoder.projector[0].weight.grad.abs().sum() > 0
    assert encoder.projector[2].weight.grad.abs().sum() > 0


def test_freeze_keeps_projector_trainable():
    enc = build({"config": TINY, "freeze": True}, hidden_size=H)
    enc(enc.dummy_batch()).sum().backward()
    assert all(p.grad is None and not p.requires_grad for p in enc.tower.parameters())
    assert all(p.grad is not None for p in enc.projector.parameters())


@pytest.mark.cli
def test_plugin_module_is_torch_free():
    code = "import omnicore_image_siglip.plugin, sys; assert 'torch' not in sys.modules; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registry_builds_siglip():
    from omnicore.api import Registry

    reg = Registry.discover()
    spec = reg.resolve("encoder", "siglip")
    assert spec.modalities == ("image",)
    enc = reg.build("encoder", "siglip", {"config": TINY}, hidden_size=H)
    assert isinstance(enc, SiglipImageEncoder)
    assert enc(enc.dummy_batch()).shape == (16, H)


def test_checkpoint_preprocessor_config_is_used_but_size_follows_tower(tmp_path):
    from transformers import SiglipVisionConfig, SiglipVisionModel

    SiglipVisionModel(SiglipVisionConfig(**TINY)).save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(
        '{"image_processor_type": "SiglipImageProcessor", "processor_class": "SiglipProcessor", "do_resize": true,'
        ' "size": {"height": 224, "width": 224}, "resample": 3, "do_rescale": true, "rescale_factor": 0.00392156862745098,'
        ' "do_normalize": true, "image_mean": [0.25, 0.5, 0.75], "image_std": [0.5, 0.25, 0.125]}'
    )
    enc = build({"checkpoint": str(tmp_path)}, hidden_size=H)
    assert list(enc.image_processor.image_mean) == [0.25, 0.5, 0.75]
    pv = enc.processor.preprocess(Image.new("RGB", (50, 30), (255, 0, 51)))["pixel_values"]
    assert pv.shape == (3, 28, 28)
    want = torch.tensor([(1.0 - 0.25) / 0.5, (0.0 - 0.5) / 0.25, (0.2 - 0.75) / 0.125])
    torch.testing.assert_close(pv[:, 5, 5], want, rtol=0, atol=1e-5)
