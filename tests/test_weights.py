"""Tests of omnicore.model.weights: library checkpoints through from_pretrained, and omnicore's extra weights.

Tiny models built from configs and saved to temporary folders; nothing is downloaded.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from omnicore.api import load_extra_weights, load_hf_pretrained, save_extra_weights
from omnicore.model.weights import EXTRA_WEIGHTS_FILE

VISION = dict(image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
TEXT = dict(
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
WHISPER = dict(
    d_model=32,
    encoder_layers=1,
    encoder_attention_heads=2,
    encoder_ffn_dim=64,
    num_mel_bins=80,
    decoder_layers=1,
    decoder_attention_heads=2,
    decoder_ffn_dim=64,
    vocab_size=64,
    max_target_positions=16,
    max_source_positions=50,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=3,
)


@pytest.fixture(scope="module")
def full_siglip(tmp_path_factory):
    """A full SiglipModel (text and vision towers) saved as transformers writes it; returns (model, folder)."""
    from transformers import SiglipConfig, SiglipModel

    torch.manual_seed(0)
    model = SiglipModel(SiglipConfig(text_config=TEXT, vision_config=VISION)).eval()
    folder = tmp_path_factory.mktemp("siglip_full")
    model.save_pretrained(folder)
    return model, folder


def _copy_with(src, dst, change):
    """Copy a one-file transformers folder to ``dst`` with ``change(state)`` applied to its tensors."""
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    change(state)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


# ---- load_hf_pretrained ------------------------------------------------------------------------


@pytest.mark.slow
def test_vision_tower_from_full_siglip_checkpoint(full_siglip):
    from transformers import SiglipVisionModel

    full, folder = full_siglip
    tower = load_hf_pretrained(SiglipVisionModel, folder, config_overrides={"vision_use_head": False})
    want = full.vision_model.state_dict()
    got = tower.state_dict()
    assert got and not any(k.startswith("head.") for k in got)
    assert set(got) == {k for k in want if not k.startswith("head.")}
    for k, v in got.items():
        assert v.dtype == torch.float32 and torch.equal(v, want[k]), k
    pv = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(tower(pixel_values=pv).last_hidden_state, full.vision_model(pixel_values=pv).last_hidden_state)


def test_sharded_checkpoint_loads_identically(full_siglip, tmp_path):
    from transformers import SiglipVisionModel

    full, _ = full_siglip
    full.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    tower = load_hf_pretrained(SiglipVisionModel, tmp_path)  # keeps the pooling head, as the config says
    want = full.vision_model.state_dict()
    assert set(tower.state_dict()) == set(want)
    for k, v in tower.state_dict().items():
        assert torch.equal(v, want[k]), k


def test_missing_tower_tensor_is_named(full_siglip, tmp_path):
    from transformers import SiglipVisionModel

    _, src = full_siglip
    gone = "vision_model.encoder.layers.1.mlp.fc1.weight"
    folder = _copy_with(src, tmp_path / "holey", lambda s: s.pop(gone))
    with pytest.raises(ValueError, match=r"holey.*lacks 1 of the \d+ tensors of SiglipVisionModel: 'encoder\.layers\.1\.mlp\.fc1\.weight'"):
        load_hf_pretrained(SiglipVisionModel, folder, config_overrides={"vision_use_head": False})
    # a tensor of the part left out (the pooling head) may be missing
    folder2 = _copy_with(src, tmp_path / "headless", lambda s: [s.pop(k) for k in list(s) if k.startswith("vision_model.head.")])
    load_hf_pretrained(SiglipVisionModel, folder2, config_overrides={"vision_use_head": False})


def test_mismatched_shape_names_tensor_and_both_shapes(full_siglip, tmp_path):
    from transformers import SiglipVisionModel

    _, src = full_siglip
    key = "vision_model.post_layernorm.weight"
    folder = _copy_with(src, tmp_path / "odd", lambda s: s.__setitem__(key, torch.ones(5)))
    with pytest.raises(ValueError, match=re.escape("post_layernorm.weight: checkpoint (5,), model (32,)")):
        load_hf_pretrained(SiglipVisionModel, folder, config_overrides={"vision_use_head": False})


@pytest.mark.parametrize("cls_name, prefix", [("WhisperModel", "encoder."), ("WhisperForConditionalGeneration", "model.encoder.")])
def test_prefixes_take_the_whisper_encoder(tmp_path, cls_name, prefix):
    import transformers
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(1)
    full = getattr(transformers, cls_name)(WhisperConfig(**WHISPER))
    full.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f"{prefix}conv1.weight" in f.keys()
    # without the prefixes, transformers would leave a random encoder (with a warning): here it is an error
    with pytest.raises(ValueError, match="lacks .* tensors of WhisperEncoder: .*'conv1.weight'"):
        load_hf_pretrained(WhisperEncoder, tmp_path)
    enc = load_hf_pretrained(WhisperEncoder, tmp_path, prefixes=("model.encoder.", "encoder."))
    want = full.get_encoder().state_dict()
    assert set(enc.state_dict()) == set(want)
    for k, v in enc.state_dict().items():
        assert torch.equal(v, want[k]), k


def test_prefix_that_starts_the_models_own_names_is_refused(full_siglip):
    from transformers import SiglipVisionModel

    _, folder = full_siglip
    with pytest.raises(ValueError, match=r"prefixes \['encoder\.'\] also start tensor names of SiglipVisionModel"):
        load_hf_pretrained(SiglipVisionModel, folder, prefixes=("encoder.",))


def test_config_object_and_overrides(full_siglip):
    from transformers import SiglipVisionConfig, SiglipVisionModel

    _, folder = full_siglip
    cfg = SiglipVisionConfig.from_pretrained(str(folder))
    cfg.vision_use_head = False
    tower = load_hf_pretrained(SiglipVisionModel, folder, config=cfg, config_overrides={"attention_dropout": 0.25})
    assert tower.config.attention_dropout == 0.25 and not tower.config.vision_use_head
    assert cfg.attention_dropout == 0.0  # the caller's config is copied, not modified
    with pytest.raises(ValueError, match="has no attribute 'vision_use_haed'"):
        load_hf_pretrained(SiglipVisionModel, folder, config_overrides={"vision_use_haed": False})


def test_dtype_is_float32_whatever_the_checkpoint_holds(full_siglip, tmp_path):
    from transformers import SiglipVisionModel

    _, src = full_siglip
    folder = _copy_with(src, tmp_path / "bf16", lambda s: s.update({k: v.to(torch.bfloat16) for k, v in s.items()}))
    tower = load_hf_pretrained(SiglipVisionModel, folder)
    assert {p.dtype for p in tower.parameters()} == {torch.float32}
    assert {p.dtype for p in load_hf_pretrained(SiglipVisionModel, folder, dtype=torch.bfloat16).parameters()} == {torch.bfloat16}


def test_folder_errors(full_siglip, tmp_path):
    from transformers import SiglipVisionModel

    # a hub id is not a folder: nothing is downloaded
    with pytest.raises(ValueError, match=r"SiglipVisionModel checkpoint folder 'google/siglip-base-patch16-224' does not exist"):
        load_hf_pretrained(SiglipVisionModel, "google/siglip-base-patch16-224")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty' has no config\.json; put one there"):
        load_hf_pretrained(SiglipVisionModel, tmp_path / "empty", hint="put one there")
    (tmp_path / "cfgonly").mkdir()
    (tmp_path / "cfgonly" / "config.json").write_text((full_siglip[1] / "config.json").read_text())
    with pytest.raises(ValueError, match=r"cfgonly' has config\.json but no weights \(expected one of model\.safetensors"):
        load_hf_pretrained(SiglipVisionModel, tmp_path / "cfgonly")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    with pytest.raises(
        ValueError,
        match=r"other/config\.json has model_type 'whisper', but SiglipVisionModel needs model_type 'siglip_vision_model' \(or a config whose 'vision_config' is one\)",
    ):
        load_hf_pretrained(SiglipVisionModel, tmp_path / "other", what="SigLIP")
    with pytest.raises(TypeError, match="PreTrainedModel or diffusers ModelMixin"):
        load_hf_pretrained(nn.Linear, tmp_path)


@pytest.mark.slow
def test_library_logging_is_restored(full_siglip):
    import transformers.utils.logging as hf_logging
    from transformers import SiglipVisionModel

    before = hf_logging.get_verbosity()
    load_hf_pretrained(SiglipVisionModel, full_siglip[1], config_overrides={"vision_use_head": False})
    assert hf_logging.get_verbosity() == before


def test_meta_device_builds_shapes_without_reading_weights(full_siglip):
    from transformers import SiglipVisionModel

    real = load_hf_pretrained(SiglipVisionModel, full_siglip[1], config_overrides={"vision_use_head": False})
    with torch.device("meta"):
        meta = load_hf_pretrained(SiglipVisionModel, full_siglip[1], config_overrides={"vision_use_head": False})
    assert {p.device.type for p in meta.parameters()} == {"meta"}
    assert {k: v.shape for k, v in meta.state_dict().items()} == {k: v.shape for k, v in real.state_dict().items()}


@pytest.mark.slow
def test_diffusers_vqmodel(tmp_path):
    from diffusers import VQModel

    cfg = dict(
        block_out_channels=[32, 32],
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        latent_channels=4,
        num_vq_embeddings=16,
        norm_type="spatial",
        layers_per_block=1,
        sample_size=16,
    )
    torch.manual_seed(0)
    vq = VQModel(**cfg).eval()
    vq.save_pretrained(str(tmp_path / "vq"))
    got = load_hf_pretrained(VQModel, tmp_path / "vq")
    for k, v in vq.state_dict().items():
        assert torch.equal(got.state_dict()[k], v), k
    x = torch.rand(1, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        assert torch.equal(got(x).sample, vq(x).sample)
    # a missing tensor is named, as for transformers models
    (tmp_path / "holey").mkdir()
    (tmp_path / "holey" / "config.json").write_text((tmp_path / "vq" / "config.json").read_text())
    state = load_file(str(tmp_path / "vq" / "diffusion_pytorch_model.safetensors"))
    del state["decoder.conv_out.weight"]
    save_file(state, str(tmp_path / "holey" / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(ValueError, match="holey.*lacks 1 of the .* tensors of VQModel: 'decoder.conv_out.weight'"):
        load_hf_pretrained(VQModel, tmp_path / "holey")
    with pytest.raises(ValueError, match="for transformers models"):
        load_hf_pretrained(VQModel, tmp_path / "vq", prefixes=("movq.",))


# ---- extra weights -----------------------------------------------------------------------------


def _projector(width: int = 8, hidden: int = 4, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, hidden))


def test_extra_weights_round_trip_and_file_layout(tmp_path):
    src = _projector(seed=0)
    path = save_extra_weights(tmp_path, src, component="encoder/test", hidden_size=4, note="x")
    assert path == tmp_path / EXTRA_WEIGHTS_FILE == tmp_path / "omnicore_extra.safetensors"
    assert [p.name for p in tmp_path.iterdir()] == [EXTRA_WEIGHTS_FILE]  # no temporary file left
    with safe_open(str(path), "pt") as f:
        header = f.metadata()
        assert sorted(f.keys()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert header["format"] == "pt" and header["omnicore_extra_format"] == "1" and header["component"] == "encoder/test"
    assert json.loads(header["shapes"]) == {"0.weight": [4, 8], "0.bias": [4], "2.weight": [4, 4], "2.bias": [4]}
    assert json.loads(header["meta"]) == {"hidden_size": 4, "note": "x"}

    dst = _projector(seed=1)
    assert not torch.equal(dst[0].weight, src[0].weight)
    meta = load_extra_weights(tmp_path, dst, component="encoder/test")
    assert meta == {"hidden_size": 4, "note": "x"}
    x = torch.randn(3, 8)
    assert torch.equal(dst(x), src(x))
    assert load_extra_weights(tmp_path, None, component="encoder/test") == meta  # metadata only


def test_extra_weights_from_a_mapping_fill_tensors_in_place_with_their_dtype(tmp_path):
    emb, head = nn.Embedding(5, 3), nn.Linear(3, 5)
    save_extra_weights(tmp_path, {"emb": emb.weight, "head.w": head.weight}, component="decoder/test")
    emb2, head2 = nn.Embedding(5, 3).to(torch.bfloat16), nn.Linear(3, 5)
    load_extra_weights(tmp_path, {"emb": emb2.weight, "head.w": head2.weight}, component="decoder/test")
    assert emb2.weight.dtype == torch.bfloat16 and torch.equal(emb2.weight, emb.weight.detach().to(torch.bfloat16))
    assert torch.equal(head2.weight, head.weight) and head2.weight.requires_grad


def test_extra_weights_wrong_shape_names_file_shapes_and_what_to_do(tmp_path):
    save_extra_weights(tmp_path, _projector(8, 4), component="encoder/test", hidden_size=4)
    with pytest.raises(ValueError) as err:
        load_extra_weights(tmp_path, _projector(8, 6), component="encoder/test")
    msg = str(err.value)
    assert str(tmp_path / EXTRA_WEIGHTS_FILE) in msg
    assert "'0.weight' has shape (4, 8) in the file, (6, 8) in this module" in msg
    assert "'2.weight' has shape (4, 4) in the file, (6, 6) in this module" in msg
    assert "saved with hidden_size=4: build encoder/test with those settings, or delete omnicore_extra.safetensors" in msg


def test_extra_weights_name_errors(tmp_path):
    save_extra_weights(tmp_path, nn.Linear(2, 3), component="encoder/test")
    with pytest.raises(ValueError, match=r"missing tensors '0\.bias', '0\.weight'.*unexpected tensors 'bias', 'weight'"):
        load_extra_weights(tmp_path, nn.Sequential(nn.Linear(2, 3)), component="encoder/test")
    with pytest.raises(ValueError, match=r"holds extra weights of 'encoder/test', not of 'encoder/other'"):
        load_extra_weights(tmp_path, nn.Linear(2, 3), component="encoder/other")


def test_extra_weights_absent_legacy_and_foreign_files(tmp_path):
    lin = nn.Linear(2, 3)
    before = lin.weight.detach().clone()
    assert load_extra_weights(tmp_path, lin, component="encoder/test", required=False) is None
    assert torch.equal(lin.weight, before)
    with pytest.raises(ValueError, match="has no omnicore_extra.safetensors"):
        load_extra_weights(tmp_path, lin, component="encoder/test")
    save_file({"weight": torch.zeros(3, 2)}, str(tmp_path / "projector.safetensors"))
    with pytest.raises(ValueError, match=r"holds projector\.safetensors from an older version of encoder/test .*Re-save the folder"):
        load_extra_weights(tmp_path, lin, component="encoder/test", required=False, legacy_files=("projector.safetensors",))
    save_file({"weight": torch.zeros(3, 2)}, str(tmp_path / EXTRA_WEIGHTS_FILE))  # a safetensors file, but not ours
    with pytest.raises(ValueError, match="is not omnicore extra weights of format 1"):
        load_extra_weights(tmp_path, lin, component="encoder/test")


def test_save_extra_weights_refuses_bad_input(tmp_path):
    with pytest.raises(ValueError, match="no tensors"):
        save_extra_weights(tmp_path, {}, component="encoder/test")
    with pytest.raises(ValueError, match="JSON-serialisable"):
        save_extra_weights(tmp_path, nn.Linear(2, 2), component="encoder/test", when=object())
    with pytest.raises(TypeError, match="'x' is a int, not a tensor"):
        save_extra_weights(tmp_path, {"x": 3}, component="encoder/test")
    assert not (tmp_path / EXTRA_WEIGHTS_FILE).exists()
