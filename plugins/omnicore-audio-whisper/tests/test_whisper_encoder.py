"""Tests of encoder/whisper: token counts, shapes, resampling, checkpoints, gradients, registry.

All models are tiny and built from configs; all audio is synthetic. Nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from omnicore.api import Audio, resample
from omnicore_audio_whisper.encoder import (
    WhisperAudioEncoder,
    WhisperEncoderOptions,
    build,
    num_tokens_for_frames,
)

H = 32
TINY = {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "num_mel_bins": 80}


def tone(freq: float, seconds: float, rate: int, amp: float = 0.5) -> Audio:
    t = np.arange(int(round(seconds * rate))) / rate
    return Audio((amp * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate)


def noise(seconds: float, rate: int = 16000, seed: int = 0) -> Audio:
    rng = np.random.default_rng(seed)
    return Audio((0.1 * rng.standard_normal(int(round(seconds * rate)))).astype(np.float32), rate)


@pytest.fixture(scope="module")
def enc() -> WhisperAudioEncoder:
    torch.manual_seed(0)
    model = build({"config": TINY}, hidden_size=H)
    model.eval()
    return model


# ---- token counts and shapes -------------------------------------------------------------------


def test_num_tokens_formula_values(enc):
    # chunk_seconds=3, pool=4: 1 s -> 100 frames -> 50 positions -> 13 tokens.
    assert enc.chunk_frames == 300 and enc.whisper.config.max_source_positions == 150
    cases = {1.0: 13, 0.5: 7, 0.01: 1, 0.0: 1, 2.0: 25, 3.0: 38, 5.0: 38 + 25}  # 5 s: a 3 s and a 2 s window
    for seconds, expected in cases.items():
        feats = enc.processor.preprocess(noise(seconds))
        assert enc.processor.num_tokens(feats) == expected, seconds
    # Samples that do not fill a frame still count it (ceil), as the feature extractor's mask does.
    assert int(enc.processor.preprocess(Audio(np.zeros(161, np.float32), 16000))["valid_frames"]) == 2


def test_num_tokens_matches_encoder_convs_and_pooling(enc):
    """Independent count: run Whisper's own convolutions on the valid frames and pool the result."""
    for seconds in (0.07, 0.33, 1.0, 1.27, 2.5):
        feats = enc.processor.preprocess(noise(seconds, seed=3))
        valid = int(feats["valid_frames"])
        # valid frames from the 16 kHz sample count (hop 160 samples = 10 ms)
        assert valid == math.ceil(round(seconds * 16000) / 160)
        with torch.no_grad():
            x = feats["input_features"][None, :, :valid]
            conv = enc.whisper.conv2(F.gelu(enc.whisper.conv1(x)))  # [1, d_model, positions]
            pooled = F.avg_pool1d(conv, kernel_size=enc.pool, stride=enc.pool, ceil_mode=True)
        assert enc.processor.num_tokens(feats) == pooled.shape[-1], seconds
        assert num_tokens_for_frames(valid, enc.pool) == pooled.shape[-1]


def test_num_tokens_ignores_padding_content(enc):
    a = enc.processor.preprocess(noise(1.0, seed=1))
    b = enc.processor.preprocess(noise(1.0, seed=2))
    assert a["input_features"].shape == b["input_features"].shape == (80, 300)
    assert enc.processor.num_tokens(a) == enc.processor.num_tokens(b) == 13


def test_forward_shape_mixed_lengths(enc):
    clips = [noise(1.0, seed=1), tone(440, 0.25, 16000), noise(3.0, seed=2), noise(0.0)]
    items = [enc.processor.preprocess(c) for c in clips]
    ntok = [enc.processor.num_tokens(it) for it in items]
    assert ntok == [13, 4, 38, 1]
    batch = enc.processor.collate(items)
    assert batch["input_features"].shape == (4, 80, 300)
    assert batch["valid_frames"].tolist() == [100, 25, 300, 0]
    with torch.no_grad():
        out = enc(batch)
    assert out.shape == (sum(ntok), H)
    assert torch.isfinite(out).all()
    # Rows are each item's first num_tokens rows, in order: equal to encoding items one at a time.
    with torch.no_grad():
        single = torch.cat([enc(enc.processor.collate([it])) for it in items])
    torch.testing.assert_close(out, single, rtol=1e-5, atol=1e-5)
    # And equal to a hand-written reference of the pipeline.
    with torch.no_grad():
        hidden = enc.whisper(input_features=batch["input_features"]).last_hidden_state
        pooled = F.avg_pool1d(hidden.transpose(1, 2), enc.pool, enc.pool, ceil_mode=True).transpose(1, 2)
        ref = torch.cat([enc.projector(pooled[i, :n]) for i, n in enumerate(ntok)])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_dummy_batch(enc):
    batch = enc.dummy_batch()
    assert batch["input_features"].shape == (1, 80, 300)
    n = enc.processor.num_tokens({"valid_frames": batch["valid_frames"][0]})
    assert n == 7  # 0.5 s: 50 frames -> 25 positions -> 7 tokens
    out = enc(batch)
    assert out.shape == (n, H)
    assert torch.isfinite(out).all()


def test_pool_option_changes_count():
    torch.manual_seed(0)
    model = build({"config": TINY, "pool": 1, "chunk_seconds": 2.0}, hidden_size=8)
    feats = model.processor.preprocess(noise(1.0))
    assert model.processor.num_tokens(feats) == 50
    assert model(model.processor.collate([feats])).shape == (50, 8)
    assert model.whisper.config.max_source_positions == 100


# ---- resampling ----------------------------------------------------------------------------------


def test_resampled_tone_keeps_its_frequency():
    src = tone(440.0, 1.0, 8000)
    up = resample(src, 16000)
    assert up.sample_rate == 16000 and abs(len(up.samples) - 16000) <= 1
    spec = np.abs(np.fft.rfft(up.samples * np.hanning(len(up.samples))))
    freqs = np.fft.rfftfreq(len(up.samples), 1 / 16000)
    assert abs(freqs[np.argmax(spec)] - 440.0) <= 1.0
    # nothing new appears above the 8 kHz source's Nyquist frequency (4 kHz)
    assert spec[freqs > 4200].max() < 1e-3 * spec.max()


def test_preprocess_8k_matches_16k_version_of_same_tone(enc):
    f8 = enc.processor.preprocess(tone(440.0, 1.0, 8000))
    f16 = enc.processor.preprocess(tone(440.0, 1.0, 16000))
    assert int(f8["valid_frames"]) == int(f16["valid_frames"]) == 100
    a, b = f8["input_features"], f16["input_features"]
    # Whisper's log-mel is scaled to about [-1, 1.5]; away from the clip's edges (where the resampler's
    # filter starts and stops) the two agree to about 1e-7 (measured); the bounds leave room for soxr.
    interior = slice(5, 95)
    diff = (a[:, interior] - b[:, interior]).abs()
    assert diff.mean() < 1e-3 and diff.max() < 1e-2
    assert (a - b).abs().mean() < 1e-2
    # the tone's mel bin is the loudest in both
    assert a[:, interior].mean(1).argmax() == b[:, interior].mean(1).argmax()
    # and a different tone is clearly different
    other = enc.processor.preprocess(tone(1500.0, 1.0, 16000))["input_features"]
    assert (other[:, interior] - b[:, interior]).abs().mean() > 10 * diff.mean()


# ---- checkpoints ---------------------------------------------------------------------------------


def test_save_pretrained_roundtrip_identical(enc, tmp_path):
    torch.manual_seed(1)
    model = build({"config": TINY, "pool": 2}, hidden_size=H).eval()
    model.save_pretrained(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"config.json", "model.safetensors", "preprocessor_config.json", "omnicore_extra.safetensors"}
    from safetensors import safe_open

    with safe_open(str(tmp_path / "omnicore_extra.safetensors"), "pt") as f:
        header = f.metadata()
        assert sorted(f.keys()) == ["bias", "weight"]
        assert torch.equal(f.get_tensor("weight"), model.projector.weight)
    assert header["component"] == "encoder/whisper"
    assert json.loads(header["meta"]) == {"chunk_seconds": 3.0, "pool": 2, "hidden_size": H, "d_model": 32}

    torch.manual_seed(99)  # nothing may come from fresh initialisation
    loaded = build({"checkpoint": str(tmp_path), "pool": 2}, hidden_size=H)
    assert loaded.training
    loaded.eval()
    batch = model.processor.collate([model.processor.preprocess(noise(1.3, seed=5)), model.processor.preprocess(tone(300, 2.2, 22050))])
    batch2 = loaded.processor.collate([loaded.processor.preprocess(noise(1.3, seed=5)), loaded.processor.preprocess(tone(300, 2.2, 22050))])
    assert torch.equal(batch["input_features"], batch2["input_features"])
    with torch.no_grad():
        assert torch.equal(model(batch), loaded(batch2))
    for (k, v), (k2, v2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k

    # the backbone is an ordinary transformers checkpoint
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    plain = WhisperEncoder.from_pretrained(str(tmp_path))
    for k, v in plain.state_dict().items():
        assert torch.equal(v, model.whisper.state_dict()[k]), k


@pytest.mark.parametrize("cls_name, prefix", [("WhisperModel", "encoder."), ("WhisperForConditionalGeneration", "model.encoder.")])
def test_load_published_style_checkpoint(tmp_path, cls_name, prefix):
    import transformers
    from safetensors import safe_open
    from transformers import WhisperConfig

    cfg = WhisperConfig(
        **TINY,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
        vocab_size=64,
        max_target_positions=16,
        max_source_positions=300,  # a 6 s model, used with 3 s chunks
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=3,
    )
    torch.manual_seed(2)
    full = getattr(transformers, cls_name)(cfg)
    full.save_pretrained(str(tmp_path))
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f"{prefix}conv1.weight" in f.keys()  # the prefixes WhisperEncoder.from_pretrained misses
    src = full.get_encoder().state_dict()

    model = build({"checkpoint": str(tmp_path)}, hidden_size=H)
    got = model.whisper.state_dict()
    assert set(got) == set(src)
    for k, v in got.items():
        if k == "embed_positions.weight":
            assert v.shape == (150, 32) and torch.equal(v, src[k][:150])
        else:
            assert torch.equal(v, src[k]), k
    with torch.no_grad():
        assert model(model.dummy_batch()).shape == (7, H)

    # the cut encoder equals a 3 s WhisperEncoder holding the same weights and the first 150 positions
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    ref_cfg = WhisperConfig(**TINY, max_source_positions=150)
    ref = WhisperEncoder(ref_cfg).eval()
    ref.load_state_dict({k: (v[:150] if k == "embed_positions.weight" else v) for k, v in src.items()})
    feats = model.processor.collate([model.processor.preprocess(noise(1.0, seed=4))])["input_features"]
    model.eval()
    with torch.no_grad():
        assert torch.equal(model.whisper(input_features=feats).last_hidden_state, ref(input_features=feats).last_hidden_state)
    assert not any(p.requires_grad for p in model.whisper.embed_positions.parameters())

    with pytest.raises(ValueError, match="300"):
        build({"checkpoint": str(tmp_path), "chunk_seconds": 8.0}, hidden_size=H)
    with pytest.raises(ValueError, match="contradicts"):
        build({"checkpoint": str(tmp_path), "config": {"d_model": 64}}, hidden_size=H)
    # non-shape keys override the checkpoint's config
    assert build({"checkpoint": str(tmp_path), "config": {"dropout": 0.5}}, hidden_size=H).whisper.config.dropout == 0.5


def test_checkpoint_missing_an_encoder_tensor_raises_naming_it(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import WhisperConfig, WhisperModel

    cfg = WhisperConfig(
        **TINY,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
        vocab_size=64,
        max_target_positions=16,
        max_source_positions=150,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=3,
    )
    WhisperModel(cfg).save_pretrained(str(tmp_path))
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["encoder.layers.0.fc2.weight"]
    del state["decoder.layers.0.fc2.weight"]  # the decoder is never loaded: only the encoder's tensor is named
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        ValueError,
        match=r"whisper encoder checkpoint .* lacks 1 of the .* tensors of WhisperEncoder after stripping the prefixes \['model.encoder.', 'encoder.'\]: 'layers\.0\.fc2\.weight'",
    ):
        build({"checkpoint": str(tmp_path)}, hidden_size=H)


def test_projector_of_another_hidden_size_raises_naming_file_and_shapes(tmp_path):
    torch.manual_seed(0)
    build({"config": TINY}, hidden_size=H).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as err:
        build({"checkpoint": str(tmp_path)}, hidden_size=H + 8)
    msg = str(err.value)
    assert str(tmp_path / "omnicore_extra.safetensors") in msg
    assert f"'weight' has shape ({H}, 32) in the file, ({H + 8}, 32) in this module" in msg
    assert f"'bias' has shape ({H},) in the file, ({H + 8},) in this module" in msg
    assert "build encoder/whisper with those settings, or delete omnicore_extra.safetensors" in msg


def test_saved_settings_differing_from_options_warn(tmp_path):
    torch.manual_seed(0)
    build({"config": TINY, "pool": 2}, hidden_size=H).save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="saved with pool=2 but options give 4"):
        build({"checkpoint": str(tmp_path), "pool": 4}, hidden_size=H)


def test_old_projector_files_are_not_silently_ignored(tmp_path):
    torch.manual_seed(0)
    model = build({"config": TINY}, hidden_size=H)
    model.whisper.save_pretrained(str(tmp_path))
    (tmp_path / "omnicore_encoder.json").write_text(json.dumps({"pool": 4}))
    with pytest.raises(ValueError, match="holds omnicore_encoder.json from an older version of encoder/whisper .*Re-save"):
        build({"checkpoint": str(tmp_path)}, hidden_size=H)


def test_bad_checkpoint_folders(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        build({"checkpoint": str(tmp_path / "nope")}, hidden_size=H)
    with pytest.raises(ValueError, match=r"no config\.json"):
        build({"checkpoint": str(tmp_path)}, hidden_size=H)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ValueError, match="has model_type 'qwen2', but WhisperEncoder needs model_type 'whisper'"):
        build({"checkpoint": str(tmp_path)}, hidden_size=H)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper", **TINY}))
    with pytest.raises(ValueError, match="no weights"):
        build({"checkpoint": str(tmp_path)}, hidden_size=H)


def test_option_validation():
    with pytest.raises(Exception, match="extra"):
        WhisperEncoderOptions.model_validate({"chunk_second": 3.0})
    with pytest.raises(ValueError, match="multiple of 0.02"):
        build({"config": TINY, "chunk_seconds": 1.01}, hidden_size=H)
    with pytest.raises(ValueError, match="max_source_positions"):
        build({"config": {**TINY, "max_source_positions": 10}}, hidden_size=H)
    for name, field in WhisperEncoderOptions.model_fields.items():
        assert field.description, name


# ---- training ------------------------------------------------------------------------------------


def test_gradients_reach_projector_and_encoder():
    torch.manual_seed(0)
    model = build({"config": TINY}, hidden_size=H).train()
    batch = model.processor.collate([model.processor.preprocess(noise(0.8, seed=7)), model.processor.preprocess(tone(600, 1.7, 16000))])
    out = model(batch)
    assert out.shape == (10 + 22, H)
    (out**2).mean().backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert model.projector.weight.grad.abs().sum() > 0
    assert model.whisper.conv1.weight.grad.abs().sum() > 0
    assert model.whisper.layers[0].fc1.weight.grad.abs().sum() > 0


def test_freeze_keeps_encoder_fixed():
    torch.manual_seed(0)
    model = build({"config": TINY, "freeze": True}, hidden_size=H).train()
    assert not any(p.requires_grad for p in model.whisper.parameters())
    out = model(model.dummy_batch())
    out.sum().backward()
    assert model.projector.weight.grad is not None
    assert all(p.grad is None for p in model.whisper.parameters())


# ---- plugin and registry -------------------------------------------------------------------------


@pytest.mark.cli
def test_plugin_import_is_torch_free():
    code = "import omnicore_audio_whisper.plugin, sys; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_registry_builds_whisper():
    from omnicore.api import Registry

    reg = Registry.discover()
    spec = reg.resolve("encoder", "whisper")
    assert spec.modalities == ("audio",) and spec.target == "omnicore_audio_whisper.encoder:build"
    model = reg.build("encoder", "whisper", {"config": TINY, "pool": 4}, hidden_size=32)
    assert isinstance(model, WhisperAudioEncoder) and model.modality == "audio"
    with torch.no_grad():
        assert model(model.dummy_batch()).shape == (7, 32)
    from omnicore.api import Encoder

    assert isinstance(model, Encoder)
    from omnicore.api import RegistryError

    with pytest.raises(RegistryError, match="chunk_second"):
        reg.build("encoder", "whisper", {"chunk_second": 3}, hidden_size=32)
