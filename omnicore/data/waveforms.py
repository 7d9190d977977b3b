"""Target clips of an audio decoder's processor: one clip to a fixed-length waveform, and a batch of
waveforms padded to the longest.

An audio tokenizer (a codec, a mel quantiser) encodes the waveform at its own rate; its processor
resamples each target clip to that rate and pads it with silence to a fixed length, so every item
has the same number of code frames. Importing this module is torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from omnicore.data.media import Audio, resample

if TYPE_CHECKING:
    import torch


def target_waveform(media: Audio, sample_rate: int, max_seconds: float, long_audio: str, what: str) -> dict[str, torch.Tensor]:
    """One clip to ``{"input_values": float32 [max_samples]}`` at ``sample_rate`` Hz, in [-1, 1]:
    resampled (soxr, :func:`resample`), clipped, and padded at the end with zeros (silence) to
    ``max_samples = max(1, round(max_seconds * sample_rate))``.

    Args:
        media: mono :class:`Audio`, samples ``[num_samples]``.
        sample_rate: the tokenizer's rate in Hz.
        max_seconds: the length every target is padded to, in seconds.
        long_audio: a clip longer than ``max_seconds``: ``"refuse"`` (raise) or ``"crop"`` (keep
            its first ``max_samples``).
        what: the component, first in every message (``"encodec decoder"``).

    Raises:
        TypeError: ``media`` is not an :class:`Audio`.
        ValueError: the samples are not 1-D, the rate is not positive, or the clip is longer than
            ``max_seconds`` with ``long_audio="refuse"`` (its duration and the limit named, and
            what to change).
    """
    import torch

    if not isinstance(media, Audio):
        raise TypeError(f"{what} preprocess expects an omnicore.api.Audio, got {type(media).__name__}")
    samples = np.asarray(media.samples, dtype=np.float32)
    if samples.ndim != 1:
        raise ValueError(f"{what} expects mono audio of shape [num_samples]; got shape {samples.shape}")
    if not media.sample_rate or media.sample_rate <= 0:
        raise ValueError(f"{what}: sample_rate must be a positive number of Hz, got {media.sample_rate}")
    max_samples = max(1, round(max_seconds * sample_rate))
    x = resample(Audio(samples, int(media.sample_rate)), sample_rate).samples
    if len(x) > max_samples:
        if long_audio == "refuse":
            raise ValueError(
                f"{what}: target clip of {len(samples) / media.sample_rate:.3f} s is longer than "
                f"max_seconds={max_seconds:g} s (long_audio: refuse); cut it, raise max_seconds, or set long_audio: crop"
            )
        x = x[:max_samples]
    out = np.zeros(max_samples, dtype=np.float32)
    out[: len(x)] = np.clip(x, -1.0, 1.0)
    return {"input_values": torch.from_numpy(out)}


def collate_waveforms(items: list[dict[str, Any]], what: str) -> dict[str, torch.Tensor]:
    """Waveforms ``{"input_values": [L_i]}`` to one batch ``{"input_values": float32 [B, max L_i],
    "num_samples": int64 [B]}``, in order: each waveform zero-padded at the end to the longest, and
    its length ``L_i``.

    Args:
        items: one dict per clip (a tensor or array under ``input_values``).
        what: the component, first in the message (``"encodec decoder"``).

    Raises:
        ValueError: ``items`` is empty.
    """
    import torch

    if not items:
        raise ValueError(f"{what}: collate() needs at least one item")
    lengths = [int(it["input_values"].shape[-1]) for it in items]
    batch = torch.zeros(len(items), max(lengths), dtype=torch.float32)
    for i, it in enumerate(items):
        batch[i, : lengths[i]] = torch.as_tensor(it["input_values"])
    return {"input_values": batch, "num_samples": torch.tensor(lengths, dtype=torch.long)}
