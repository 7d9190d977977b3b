"""The fit: deterministic, and its command line writes a folder that loads."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from omnicore_audio_mel.fit import clip_frames, fit_codebooks
from omnicore_audio_mel.fit import main as fit_main
from omnicore_audio_mel.tokenizer import MelRVQ

RATE = 8000
TINY = {"n_mels": 16, "stack": 2, "num_codebooks": 2, "codebook_size": 8}


def test_the_fit_is_deterministic_and_seeded(clips):
    fits = []
    for seed in (0, 0, 1):
        model = MelRVQ(TINY)
        fits.append(fit_codebooks(model, clip_frames(model, clips), seed=seed).codebooks)
    assert torch.equal(fits[0], fits[1]) and not torch.equal(fits[0], fits[2])
    assert not torch.equal(fits[0][1], torch.zeros_like(fits[0][1]))


def test_a_fit_of_fewer_codebooks_is_a_prefix_of_one_of_more(clips):
    model = MelRVQ(TINY)
    frames = clip_frames(model, clips)
    more = fit_codebooks(MelRVQ({**TINY, "num_codebooks": 3}), frames).codebooks
    assert torch.equal(fit_codebooks(model, frames).codebooks, more[:2])


def test_too_few_frames_is_an_error():
    model = MelRVQ(TINY)
    with pytest.raises(ValueError, match="4 code frames are fewer than codebook_size=8"):
        fit_codebooks(model, torch.zeros(4, 32))


def test_the_command_line_writes_a_folder_that_loads(tmp_path, capsys, clips):
    for i, clip in enumerate(clips):
        sf.write(tmp_path / f"clip_{i}.wav", clip, RATE)
    out = tmp_path / "mel"
    argv = ["--audio", str(tmp_path / "clip_[0-4].wav"), "--held-out", str(tmp_path / "clip_5.wav"), "--out", str(out)]
    assert fit_main([*argv, "--config", '{"n_mels": 16, "stack": 2, "num_codebooks": 2, "codebook_size": 8}']) == 0
    text = capsys.readouterr().out
    assert "fitting on 5 clips at 8000 Hz: 80 code frames of 2 x 16 mels (50 frames/s), 2 codebooks of 8" in text
    assert "held-out (1 clips), log-mel L1 dB by codebooks used: 1: " in text
    model = MelRVQ.from_pretrained(out)
    assert model.config.num_codebooks == 2 and model.encode(clips[5]).shape == (16, 2)
    with pytest.raises(SystemExit):  # the folder exists
        fit_main([*argv, "--config", "{}"])
    assert "exists; pass --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fit_main([*argv, "--overwrite", "--config", '{"stacks": 2}'])
    err = capsys.readouterr().err
    assert "stacks" in err and "Extra inputs are not permitted" in err and "Traceback" not in err
    assert np.array_equal(MelRVQ.from_pretrained(out).codebooks, model.codebooks)  # a refused run leaves it
