"""decoder/mel_rvq around a fitted MelRVQ folder: codes, the codebooks it uses, saving, and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from omnicore.api import Audio
from omnicore_audio_mel.decoder import build
from omnicore_audio_mel.fit import clip_frames, fit_codebooks
from omnicore_audio_mel.processor import build_processor
from omnicore_audio_mel.tokenizer import MelRVQ

TINY = {"n_mels": 16, "stack": 2, "num_codebooks": 3, "codebook_size": 8, "griffin_lim_iters": 4}
DEPTH = {"layers": 1, "hidden_size": 16, "heads": 2}


@pytest.fixture
def folder(tmp_path, clips):
    mel = MelRVQ(TINY)
    fit_codebooks(mel, clip_frames(mel, clips)).save_pretrained(tmp_path / "mel")
    return tmp_path / "mel"


def _features(dec, clip):
    return dec.processor.collate([dec.processor.preprocess(Audio(clip, 8000))])


def test_codes_are_the_tokenizers_first_codebooks(folder, clips):
    mel = MelRVQ.from_pretrained(folder)
    full = build({"checkpoint": str(folder), "depth": DEPTH}, hidden_size=16).eval()
    assert (full.num_codebooks, full.codebook_size, full.processor.codes_per_token) == (3, 8, 3)
    two = build({"checkpoint": str(folder), "num_codebooks": 2, "depth": DEPTH}, hidden_size=16).eval()
    one = build({"checkpoint": str(folder), "num_codebooks": 1}, hidden_size=16).eval()
    assert one.depth_decoder is None and two.depth_decoder is not None and two.fixed_codes
    batch = _features(full, clips[2])
    want = mel.encode(batch["input_values"][0])  # the clip padded with silence to max_seconds (1 s)
    assert want.shape == (51, 3) and full.processor.num_tokens({"input_values": batch["input_values"][0]}) == 51
    assert torch.equal(full.encode(batch), want)
    assert torch.equal(two.encode(batch), want[:, :2]) and torch.equal(one.encode(batch), want[:, 0])
    audio = two.decode(two.encode(batch))
    assert audio.sample_rate == 16000 and audio.samples.dtype == np.float32 and len(audio.samples) == 2 * (51 * 2 - 1) * 80
    assert two.dummy_codes().shape == (51, 2) and one.dummy_codes().shape == (51,)


@pytest.mark.parametrize("seconds", [0.01, 0.03, 0.3, 0.31])
def test_num_tokens_is_the_number_of_frames_encode_gives(folder, clips, seconds):
    dec = build({"checkpoint": str(folder), "num_codebooks": 1, "max_seconds": seconds, "long_audio": "crop"}, hidden_size=8)
    feats = dec.processor.preprocess(Audio(clips[0], 8000))
    assert dec.encode(dec.processor.collate([feats])).shape == (dec.processor.num_tokens(feats),)


def test_a_saved_decoder_comes_back_with_its_settings(folder, clips, tmp_path):
    torch.manual_seed(0)
    dec = build({"checkpoint": str(folder), "num_codebooks": 2, "max_seconds": 0.5, "depth": DEPTH}, hidden_size=16)
    dec.save_pretrained(tmp_path / "saved")
    assert torch.equal(MelRVQ.from_pretrained(tmp_path / "saved").codebooks, MelRVQ.from_pretrained(folder).codebooks)
    torch.manual_seed(1)
    back = build({"checkpoint": str(tmp_path / "saved")}, hidden_size=16)
    assert (back.num_codebooks, back.max_seconds, back.depth_options) == (2, 0.5, dec.depth_options)
    for name, tensor in dec.adapter_state().items():
        assert torch.equal(back.adapter_state()[name], tensor), name
    proc = build_processor({"checkpoint": str(tmp_path / "saved")})
    assert (proc.num_codebooks, proc.max_samples) == (2, 4000)


def test_options_and_codes_are_checked(folder, clips):
    with pytest.raises(ValueError, match="options.num_codebooks=4: the tokenizer has 3 codebooks"):
        build({"checkpoint": str(folder), "num_codebooks": 4}, hidden_size=8)
    with pytest.raises(ValidationError, match="give either 'checkpoint'"):
        build({"checkpoint": str(folder), "config": {"stack": 2}}, hidden_size=8)
    with pytest.raises(ValueError, match=r"options.config: stak: Extra inputs are not permitted"):
        build_processor({"config": {"stak": 2}})
    with pytest.raises(ValueError, match=r"MelRVQ: folder .*nowhere does not exist"):
        build_processor({"checkpoint": str(folder.parent / "nowhere")})
    dec = build({"checkpoint": str(folder), "num_codebooks": 2, "depth": DEPTH}, hidden_size=8)
    with pytest.raises(ValueError, match=r"decode needs codes \[frames, 2\], got \(4,\)"):
        dec.decode(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 8\); got \[0, 9\]"):
        dec.decode(torch.tensor([[0, 9]]))
    with pytest.raises(ValueError, match="target clip of 2.000 s is longer than max_seconds=1 s"):
        dec.processor.preprocess(Audio(np.zeros(16000, np.float32), 8000))
