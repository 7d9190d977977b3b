"""Decoders that return audio: ``omnicore generate`` writes WAV files (not PNG), and the training
sample grids draw images only and write each prompt's clip as a WAV next to the grid."""

from __future__ import annotations

import numpy as np
import soundfile as sf
from PIL import Image

from omnicore.data.media import Audio
from omnicore.eval.generate import save_decoded
from omnicore.eval.samples import _write_clips, sample_cells


def test_save_decoded_writes_wav_for_audio_and_png_for_images(tmp_path):
    samples = np.sin(np.linspace(0, 60, 1600)).astype(np.float32) * 0.5
    samples[:3] = [1.5, -2.0, 0.25]  # out of range: clipped on writing
    path = save_decoded(Audio(samples, 16000), tmp_path / "generated-audio-0")
    assert path == tmp_path / "generated-audio-0.wav"
    back, rate = sf.read(path, dtype="float32")
    assert rate == 16000 and sf.info(path).subtype == "PCM_16" and back.shape == (1600,)
    want = np.clip(samples, -1, 1)
    assert np.abs(back - want).max() <= 1 / 32767 + 1e-6  # 16-bit quantisation
    img = Image.new("RGB", (4, 3), (10, 20, 30))
    assert save_decoded(img, tmp_path / "generated-image-0") == tmp_path / "generated-image-0.png"
    assert Image.open(tmp_path / "generated-image-0.png").getpixel((0, 0)) == (10, 20, 30)


def test_sample_grid_skips_audio_and_clips_are_written(tmp_path):
    clip = Audio(np.full(800, 0.25, np.float32), 16000)
    img = Image.new("RGB", (8, 8), "white")
    answers = [
        {"text": "", "images": {"audio": [clip]}},
        {"text": "", "images": {"image": [img], "audio": []}},
        {"text": "", "images": {}},
    ]
    images, labels = sample_cells(["Say 1.", "Draw 2.", "Say 3."], ["audio", "image"], answers)
    assert images == [None, img, None]
    assert labels == ["Say 1.", "Draw 2. [image]", "Say 3."]
    paths = _write_clips(tmp_path, ["step-00000020", "final"], ["audio", "image"], answers)
    assert paths == [tmp_path / "step-00000020-audio-0.wav", tmp_path / "final-audio-0.wav"]
    back, rate = sf.read(paths[0], dtype="float32")
    assert rate == 16000 and np.abs(back - 0.25).max() < 1e-4
