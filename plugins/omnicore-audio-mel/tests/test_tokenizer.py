"""MelRVQ: shapes, the residual property, saving and loading, and the errors of a bad folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from omnicore_audio_mel.config import MelRVQConfig
from omnicore_audio_mel.fit import clip_frames, fit_codebooks, reconstruction_errors
from omnicore_audio_mel.tokenizer import MelRVQ, scale_loudness

RATE = 8000
TINY = {"n_mels": 16, "stack": 2, "num_codebooks": 3, "codebook_size": 8, "griffin_lim_iters": 4}


def _fitted(clips: list[np.ndarray], **over) -> MelRVQ:
    model = MelRVQ({**TINY, **over})
    return fit_codebooks(model, clip_frames(model, clips), seed=0, max_iter=20)


def test_encode_decode_shapes_and_loudness(clips):
    model = _fitted(clips)
    assert model.frames_per_second == 50.0 and tuple(model.codebooks.shape) == (3, 8, 32)
    for n in (1, 100, 256, 2399, 2400, 2401):  # shorter than n_fft, an odd number of mel frames, ...
        codes = model.encode(torch.from_numpy(clips[0][:n]))
        assert codes.dtype == torch.long and codes.shape == (model.num_frames(n), 3)
        assert int(codes.min()) >= 0 and int(codes.max()) < 8
    codes = model.encode(clips[1])  # numpy in, too
    assert codes.shape == (16, 3)  # 1 + 2400 // 80 = 31 mel frames -> 16 code frames
    wave = model.decode(codes)
    assert wave.dtype == torch.float32 and wave.shape == ((16 * 2 - 1) * 80,)
    assert float(wave.abs().max()) <= 1.0
    loudest = max(float(wave[i : i + 160].pow(2).mean().sqrt()) for i in range(0, len(wave) - 159, 160))
    top = float(model.unstack_frames(model.dequantize(codes)).max())
    assert 20 * np.log10(loudest) == pytest.approx(-20.0 + min(top, 0.0), abs=1e-3)
    assert model.decode(codes[:, :1]).shape == wave.shape  # the first codebook alone: a coarser clip


def test_log_mel_is_relative_and_floored(clips):
    model = MelRVQ(TINY)
    x = clips[0]
    db = model.log_mel(x)
    assert db.shape == (31, 16) and float(db.max()) == 0.0 and float(db.min()) >= -80.0
    assert torch.allclose(model.log_mel(0.25 * x), db, atol=1e-3)  # the level does not matter
    assert torch.equal(model.log_mel(np.zeros(800, np.float32)), torch.zeros(11, 16))  # silence: all at its own max


def test_residual_codebooks_reconstruct_exactly_what_they_can():
    """Frames a_i + b_j of four far-apart a's and four small b's: one codebook finds the a's (error:
    the b's spread about their mean), the second the b's (error 0)."""
    a = torch.tensor([[0.0, 0.0], [-100.0, 0.0], [0.0, -100.0], [-100.0, -100.0]])
    b = torch.tensor([[1.0, 0.0], [0.0, 3.0], [-2.0, 0.0], [0.0, -1.0]])
    frames = (a[:, None] + b[None]).reshape(-1, 2).repeat(3, 1)
    model = fit_codebooks(MelRVQ({"n_mels": 2, "stack": 1, "num_codebooks": 2, "codebook_size": 4}), frames)
    codes = model.quantize(frames)
    errors = [float((model.dequantize(codes[:, :k]) - frames).abs().mean()) for k in (1, 2)]
    assert errors[0] == pytest.approx(float((b - b.mean(0)).abs().mean()))  # 8.5 / 8
    assert errors == [pytest.approx(1.0625), pytest.approx(0.0, abs=1e-5)]


def test_more_codebooks_never_reconstruct_worse(clips):
    model = _fitted(clips, num_codebooks=4)
    errors = reconstruction_errors(model, clips)
    assert len(errors) == 4 and all(e1 >= e2 for e1, e2 in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.6 * errors[0], errors
    frames = clip_frames(model, clips)  # the squared error, the quantity k-means lowers, falls too
    sq = [float((model.dequantize(model.quantize(frames, k)) - frames).pow(2).mean()) for k in (1, 2, 3, 4)]
    assert all(e1 >= e2 for e1, e2 in zip(sq, sq[1:])), sq


def test_save_and_load_give_the_same_codes(tmp_path, clips):
    model = _fitted(clips)
    model.save_pretrained(tmp_path / "mel")
    assert {p.name for p in (tmp_path / "mel").iterdir()} == {"config.json", "model.safetensors"}
    assert json.loads((tmp_path / "mel" / "config.json").read_text())["model_type"] == "mel_rvq"
    back = MelRVQ.from_pretrained(tmp_path / "mel")
    assert back.config == model.config and torch.equal(back.codebooks, model.codebooks)
    for clip in clips[:3]:
        assert torch.equal(back.encode(clip), model.encode(clip))
    assert set(back.state_dict()) == {"codebooks"}  # the mel filters follow from the config


def _folder(tmp_path, config=None, tensors=None, name="bad"):
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_a_bad_folder_is_named_with_what_it_lacks(tmp_path):
    good = MelRVQConfig(**TINY).model_dump()
    books = {"codebooks": torch.zeros(3, 8, 32)}
    cases = [
        (tmp_path / "nowhere", f"folder {tmp_path / 'nowhere'} does not exist"),
        (_folder(tmp_path, name="empty"), "cannot read"),
        (_folder(tmp_path, "{not json", name="text"), "config.json: Expecting property name"),
        (_folder(tmp_path, {"model_type": "encodec"}, name="encodec"), "has model_type 'encodec', not 'mel_rvq'"),
        (_folder(tmp_path, {**good, "stack": 0}, name="zero"), "config.json: stack: Input should be greater than 0"),
        (_folder(tmp_path, {**good, "stacks": 2}, name="typo"), "config.json: stacks: Extra inputs are not permitted"),
    ]
    for folder, message in cases:
        with pytest.raises(ValueError, match="MelRVQ") as err:
            MelRVQ.from_pretrained(folder)
        assert message in str(err.value), (message, str(err.value))
    folder = _folder(tmp_path, good)
    with pytest.raises(ValueError, match=r"cannot read .*model\.safetensors"):
        MelRVQ.from_pretrained(folder)
    _folder(tmp_path, good, {**books, "extra": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"holds the tensors \['codebooks', 'extra'\]; it must hold exactly 'codebooks'"):
        MelRVQ.from_pretrained(folder)
    _folder(tmp_path, good, {"codebooks": torch.zeros(3, 8, 16)})
    with pytest.raises(ValueError, match=r"codebooks of shape \(3, 8, 16\); this config needs \[3, 8, 32\].*against .*config\.json"):
        MelRVQ.from_pretrained(folder)
    _folder(tmp_path, good, books)
    assert MelRVQ.from_pretrained(folder).config == MelRVQConfig(**TINY)


def test_config_and_codes_are_checked():
    with pytest.raises(ValueError, match="n_fft=64 must be at least hop=80"):
        MelRVQConfig(n_fft=64)
    with pytest.raises(ValueError, match="fmax=5000.0 is above the Nyquist frequency"):
        MelRVQConfig(fmax=5000)
    model = MelRVQ(TINY)
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 8\); got \[0, 8\]"):
        model.decode(torch.tensor([[0, 8, 1]]))
    with pytest.raises(ValueError, match=r"codes must be \[frames >= 1, 1..3\]"):
        model.decode(torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mono samples of shape \[num_samples\]"):
        model.encode(torch.zeros(2, RATE))


def test_scale_loudness():
    x = np.concatenate([np.full(160, 0.01), np.full(160, 0.1)])
    y = scale_loudness(x, RATE, -20.0)
    assert np.allclose(y[160:], 0.1) and np.allclose(y[:160], 0.01)
    assert np.array_equal(scale_loudness(np.zeros(400), RATE, -20.0), np.zeros(400, np.float32))
    assert scale_loudness(x, RATE, -0.0001).max() <= 1.0
