"""Loading media files named by samples, with errors that name the file.

Images are decoded by Pillow, audio by soundfile (libsndfile). Resampling is the encoder's business
(each encoder knows the rate it expects): see :func:`resample`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


class MediaError(Exception):
    """A media file is missing or cannot be decoded; the message names the file."""


@dataclass
class Audio:
    """Mono audio: ``samples`` float32 ``[num_samples]`` in [-1, 1]; ``sample_rate`` in Hz."""

    samples: np.ndarray
    sample_rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / float(self.sample_rate)


def load_image(path: str | Path):
    """Open an image file as a fully decoded ``PIL.Image.Image`` (mode kept as stored).

    Raises:
        MediaError: if the file is missing or Pillow cannot decode it.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise MediaError(f"image file not found: {path}")
    try:
        with Image.open(path) as img:
            img.load()
            return img.copy()
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise MediaError(f"cannot read image {path}: {exc}") from exc


def load_audio(path: str | Path) -> Audio:
    """Read an audio file as mono float32 (channels are averaged).

    Raises:
        MediaError: if the file is missing, cannot be decoded by libsndfile, or holds no samples.
    """
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise MediaError(f"audio file not found: {path}")
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError for bad files
        raise MediaError(f"cannot read audio {path}: {exc}") from exc
    if data.shape[0] == 0:
        raise MediaError(f"audio file {path} holds no samples")
    return Audio(samples=data.mean(axis=1).astype(np.float32), sample_rate=int(rate))


def resample(audio: Audio, target_rate: int) -> Audio:
    """Resample to ``target_rate`` Hz with soxr's high-quality polyphase resampler (libsoxr)."""
    if audio.sample_rate == target_rate:
        return audio
    import soxr

    out = soxr.resample(audio.samples, audio.sample_rate, target_rate, quality="HQ")
    return Audio(samples=np.asarray(out, dtype=np.float32), sample_rate=target_rate)
