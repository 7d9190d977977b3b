"""Tests of decoder/encodec on tiny from-scratch EnCodec models (real values, no downloads)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from omnicore.api import Audio
from omnicore_audio_codec.decoder import EncodecOptions, build, make_codec_config
from omnicore_audio_codec.fit import seed_codebooks
from omnicore_audio_codec.processor import bandwidth_for

# hop 8 * 5 * 4 = 160 samples at 16 kHz (100 frames/s), 2 codebooks of 16 entries: C = 32
TINY = {"num_filters": 4, "hidden_size": 8, "codebook_size": 16, "upsampling_ratios": [8, 5, 4], "num_quantizers": 2}
# hop 4 * 3 * 4 = 48 samples at 24 kHz, 3 codebooks of 8 entries: C = 24
OTHER = {
    "sampling_rate": 24_000,
    "num_filters": 4,
    "hidden_size": 8,
    "codebook_size": 8,
    "upsampling_ratios": [4, 3, 4],
    "num_quantizers": 3,
}
H = 16


def _dec(config=TINY, **options):
    """A tiny decoder whose codebooks start from its own latents of a few test waves (so codes vary)."""
    torch.manual_seed(0)
    d = build({"config": config, **options}, hidden_size=H).eval()
    seed_codebooks(d, torch.stack([_wave(4000, seed=s) * (0.2 + s) for s in range(4)]))
    return d


@pytest.fixture(scope="module")
def dec():
    return _dec(max_seconds=0.25)


def _wave(n: int, seed: int = 0) -> torch.Tensor:
    """A 440 Hz tone plus noise, ``n`` samples, amplitude about 0.3."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    return torch.from_numpy((0.25 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(n)).astype(np.float32))


@pytest.mark.slow
@pytest.mark.parametrize(("config", "hop", "n_q"), [(TINY, 160, 2), (OTHER, 48, 3)])
def test_num_tokens_equals_encode_length_over_a_grid(config, hop, n_q):
    d = _dec(config)
    assert (d.processor.hop_length, d.num_quantizers) == (hop, n_q)
    lengths = [1, 2, hop - 1, hop, hop + 1, 2 * hop - 1, 2 * hop, 2 * hop + 1, 333, 1000, 1601, 4567]
    for n in lengths:
        want = math.ceil(n / hop) * n_q  # the formula, computed here on its own
        assert d.processor.num_tokens({"input_values": torch.zeros(n)}) == want, n
        assert d.encode({"input_values": _wave(n, seed=n)}).numel() == want, n
    # through preprocess: clips of several rates and lengths, several max_seconds
    for max_seconds in (0.05, 0.25, 0.37):
        d.processor.max_seconds = max_seconds
        d.processor.max_samples = round(max_seconds * d.sample_rate)
        for rate, seconds in ((8000, 0.03), (16000, 0.049), (22050, 0.01)):
            f = d.processor.preprocess(Audio(_wave(int(rate * seconds)).numpy(), rate))
            n = f["input_values"].shape[0]
            assert n == round(max_seconds * d.sample_rate)
            assert (
                d.processor.num_tokens(f)
                == math.ceil(n / hop) * n_q
                == d.encode(d.processor.collate([f])).numel()
                == d.dummy_codes().numel()
            )


def test_codes_are_the_libraries_rvq_codes_flattened_frame_by_frame(dec):
    x = _wave(1000)
    codes = dec.encode({"input_values": x})
    with torch.no_grad():
        ref = dec.codec.encode(x.reshape(1, 1, -1), bandwidth=dec.bandwidth).audio_codes[0, 0]  # [n_q, F]
    n_q, frames = ref.shape
    assert (n_q, frames) == (2, 7)  # ceil(1000 / 160)
    assert len(set(ref[0].tolist())) > 1, "an untrained codec should still give distinct codes"
    for f in range(frames):
        for k in range(n_q):
            assert int(codes[f * n_q + k]) == int(ref[k, f]) + k * dec.bins
    assert dec.codebook_size == 2 * 16


def test_decode_matches_the_libraries_decoder(dec):
    x = _wave(1000, seed=3)
    codes = dec.encode({"input_values": x})
    with torch.no_grad():
        enc = dec.codec.encode(x.reshape(1, 1, -1), bandwidth=dec.bandwidth)
        ref = dec.codec.decode(enc.audio_codes, enc.audio_scales).audio_values.reshape(-1)
    wave = dec.decode_waveform(codes)
    assert wave.shape == (7 * 160,)
    torch.testing.assert_close(wave, ref, atol=0, rtol=0)
    out = dec.decode(codes)
    assert isinstance(out, Audio) and out.sample_rate == 16000 and out.samples.dtype == np.float32
    np.testing.assert_allclose(out.samples, ref.clamp(-1, 1).numpy(), atol=1e-6)  # 16 kHz codec: no resampling


def test_decode_of_a_24khz_codec_is_resampled_to_16khz():
    d = _dec(OTHER)
    codes = d.encode({"input_values": _wave(960)})  # 20 frames of 48 samples at 24 kHz = 40 ms
    out = d.decode(codes)
    assert out.sample_rate == 16000 and out.samples.shape == (640,)
    assert np.abs(out.samples).max() <= 1.0


def test_ids_of_another_codebook_are_read_modulo_bins(dec):
    codes = dec.encode({"input_values": _wave(480)})
    shifted = codes.clone()
    shifted[0::2] += dec.bins  # codebook 0's positions now hold codebook 1's ids
    torch.testing.assert_close(dec.decode_waveform(shifted), dec.decode_waveform(codes), atol=0, rtol=0)
    with pytest.raises(ValueError, match="multiple of n_q=2"):
        dec.decode(codes[:3])
    with pytest.raises(ValueError, match=r"\[0, 32\)"):
        dec.decode(torch.full((4,), 32))


def test_encode_batch_keeps_items_apart(dec):
    a, b = _wave(700, seed=1), _wave(1600, seed=2)
    batch = dec.processor.collate([{"input_values": a}, {"input_values": b}])
    assert batch["input_values"].shape == (2, 1600) and batch["num_samples"].tolist() == [700, 1600]
    codes = dec.encode(batch)
    ca, cb = dec.encode({"input_values": a}), dec.encode({"input_values": b})
    assert torch.equal(codes, torch.cat([ca, cb])) and ca.numel() == 5 * 2


def test_preprocess_resamples_pads_and_refuses_long_clips(dec):
    f = dec.processor.preprocess(Audio(np.full(800, 0.5, np.float32), 8000))  # 0.1 s at 8 kHz
    x = f["input_values"]
    assert x.shape == (4000,) and x.dtype == torch.float32
    assert abs(float(x[400:1200].mean()) - 0.5) < 1e-3 and float(x[1700:].abs().max()) == 0.0
    with pytest.raises(ValueError, match=r"0\.300 s is longer than max_seconds=0\.25 s"):
        dec.processor.preprocess(Audio(np.zeros(2400, np.float32), 8000))
    crop = _dec(max_seconds=0.25, long_audio="crop")
    y = crop.processor.preprocess(Audio(np.linspace(-1, 1, 4800).astype(np.float32), 16000))["input_values"]
    assert y.shape == (4000,) and float(y[-1]) == pytest.approx(-1 + 2 * 3999 / 4799)
    with pytest.raises(TypeError, match="omnicore.api.Audio"):
        dec.processor.preprocess(np.zeros(10))


def test_embed_head_dummy_codes_and_freezing(dec):
    codes = torch.tensor([0, 17, 31, 17])
    assert dec.embed(codes).shape == (4, H) and dec.head(torch.randn(4, H)).shape == (4, 32)
    loss = torch.nn.functional.cross_entropy(dec.head(dec.embed(codes)), codes)
    loss.backward()
    assert dec.lm_head.weight.grad.abs().sum() > 0 and dec.code_embed.weight.grad[codes].abs().sum() > 0
    assert not any(p.requires_grad for p in dec.codec.parameters())
    dec.train()
    assert not dec.codec.training
    dec.eval().zero_grad(set_to_none=True)
    dummy = dec.dummy_codes()
    assert dummy.tolist() == [0, 16] * 25  # 0.25 s = 25 frames; entry 0 of each codebook


@pytest.mark.slow
def test_bandwidth_chooses_the_codebooks():
    bw2, bw4 = bandwidth_for(2, 16, 100), bandwidth_for(4, 16, 100)
    assert (bw2, bw4) == (pytest.approx(0.8), pytest.approx(1.6))  # n_q * log2(16) * 100 frames/s, in kbps
    cfg = {k: v for k, v in TINY.items() if k != "num_quantizers"}
    d = _dec({**cfg, "target_bandwidths": [bw2, bw4]}, bandwidth=bw4)
    assert (d.num_quantizers, d.codebook_size) == (4, 64)
    assert d.codec.quantizer.get_num_quantizers_for_bandwidth(bw4) == 4  # the library's own count
    assert _dec({**cfg, "target_bandwidths": [bw2, bw4]}).num_quantizers == 2  # the smallest by default
    with pytest.raises(ValueError, match=r"bandwidth=3\.0: this codec supports the target bandwidths \[0\.8"):
        _dec({**cfg, "target_bandwidths": [bw2, bw4]}, bandwidth=3.0)
    for n_q, bins, rate in ((1, 1024, 75), (3, 256, 50), (7, 512, 63), (5, 8, 334)):
        bw = bandwidth_for(n_q, bins, rate)
        assert math.floor(bw * 1000 / (math.log2(bins) * rate)) == n_q == int(1000 * bw // (rate * math.log2(bins)))


def test_config_checks():
    assert make_codec_config({}).num_quantizers == 2
    with pytest.raises(ValueError, match="audio_channels=2"):
        make_codec_config({"audio_channels": 2})
    with pytest.raises(ValueError, match="normalize=true"):
        make_codec_config({"normalize": True})
    with pytest.raises(ValueError, match="not both"):
        make_codec_config({"num_quantizers": 2, "target_bandwidths": [1.5]})
    with pytest.raises(ValueError, match="not both"):
        EncodecOptions(checkpoint="x", config={"hidden_size": 8})
    with pytest.raises(Exception, match="extra"):
        EncodecOptions(max_second=1.0)


@pytest.mark.slow
def test_save_pretrained_roundtrip_gives_identical_codes(tmp_path):
    d = _dec(max_seconds=0.25)
    with torch.no_grad():
        d.code_embed.weight.add_(1.0)
    d.save_pretrained(tmp_path / "ck")
    names = {p.name for p in (tmp_path / "ck").iterdir()}
    assert names == {"config.json", "model.safetensors", "omnicore_extra.safetensors"}
    torch.manual_seed(77)  # nothing may come from fresh initialisation
    back = build({"checkpoint": str(tmp_path / "ck")}, hidden_size=H).eval()
    assert (back.max_seconds, back.bandwidth, back.codebook_size) == (0.25, d.bandwidth, 32)
    x = _wave(3000, seed=9)
    c1, c2 = d.encode({"input_values": x}), back.encode({"input_values": x})
    assert torch.equal(c1, c2)
    torch.testing.assert_close(back.decode_waveform(c2), d.decode_waveform(c1), atol=0, rtol=0)
    for k, v in d.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    with pytest.raises(ValueError, match=rf"'code_embed.weight' has shape \(32, {H}\) in the file, \(32, {H + 1}\) in this module"):
        build({"checkpoint": str(tmp_path / "ck")}, hidden_size=H + 1)
    assert build({"checkpoint": str(tmp_path / "ck"), "max_seconds": 0.5}, hidden_size=H).dummy_codes().numel() == 100


@pytest.mark.slow
def test_plain_transformers_folder_loads_with_a_fresh_adapter(tmp_path):
    from transformers import EncodecModel

    torch.manual_seed(1)
    codec = EncodecModel(make_codec_config(TINY))
    with torch.no_grad():
        for layer in codec.quantizer.layers:
            layer.codebook.embed.normal_()
    codec.save_pretrained(str(tmp_path / "enc"))
    d = build({"checkpoint": str(tmp_path / "enc")}, hidden_size=8)
    assert d.code_embed.weight.shape == (32, 8) and d.max_seconds == 1.0
    x = _wave(800)
    with torch.no_grad():
        ref = codec.encode(x.reshape(1, 1, -1), bandwidth=d.bandwidth).audio_codes[0, 0]
    assert torch.equal(d.encode({"input_values": x}), d.flatten(ref))


def test_bad_checkpoint_folders(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        build({"checkpoint": str(tmp_path / "nope")}, hidden_size=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"cannot read .*empty/config\.json.*EncodecModel folder"):
        build({"checkpoint": str(tmp_path / "empty")}, hidden_size=8)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    with pytest.raises(ValueError, match="model_type 'whisper', not 'encodec'"):
        build({"checkpoint": str(tmp_path / "other")}, hidden_size=8)


@pytest.mark.cli
def test_plugin_module_is_torch_free():
    code = "import omnicore_audio_codec.plugin, sys; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registry_builds_decoder():
    from omnicore.api import Decoder, Registry, RegistryError

    reg = Registry.discover()
    row = [r for r in reg.components("decoder") if r.name == "encodec"]
    assert row and row[0].status == "available" and row[0].provider == "omnicore-audio-codec"
    d = reg.build("decoder", "encodec", {"config": TINY}, hidden_size=32)
    assert isinstance(d, Decoder) and d.modality == "audio" and d.hidden_size == 32
    with pytest.raises(RegistryError, match="max_second"):
        reg.build("decoder", "encodec", {"max_second": 1}, hidden_size=32)
