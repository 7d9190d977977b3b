"""SpecAugment's frequency and time masking of log-mel features, applied while the encoder trains.

Source: Park, Chan, Zhang, Chiu, Zoph, Cubuk, Le, "SpecAugment: A Simple Data Augmentation Method
for Automatic Speech Recognition", Interspeech 2019 (arXiv:1904.08779), section 2: ``freq_masks``
bands of ``f ~ U[0, freq_width]`` consecutive mel channels and ``time_masks`` spans of
``t ~ U[0, time_width]`` consecutive frames are set to the mean value (the paper's features are
normalised to mean 0; Whisper's are not, so each item's own mean over its valid frames is used).
Time spans lie inside each item's valid frames, never in the padding after the clip. Time warping
(the paper's third policy, which it found to matter least) is left out.

The encoder applies it only in training mode: validation, ``omnicore eval`` and generation see the
features unchanged.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from omnicore.api import ITEM_SEEDS, item_generators

__all__ = ["SpecAugmentOptions", "spec_augment", "window_generators"]


class SpecAugmentOptions(BaseModel):
    """The ``spec_augment`` option of encoder ``whisper`` (all 0: off, the default).

    Example (spoken digits, 100 mel frames per second)::

        spec_augment: {freq_masks: 2, freq_width: 10, time_masks: 2, time_width: 8}
    """

    model_config = ConfigDict(extra="forbid")

    freq_masks: int = Field(default=0, ge=0, description="frequency bands masked per clip")
    freq_width: int = Field(default=0, ge=0, description="the widest band, mel channels")
    time_masks: int = Field(default=0, ge=0, description="time spans masked per clip")
    time_width: int = Field(default=0, ge=0, description="the longest span, mel frames (10 ms each)")

    @property
    def active(self) -> bool:
        """Whether any mask is drawn at all."""
        return (self.freq_masks > 0 and self.freq_width > 0) or (self.time_masks > 0 and self.time_width > 0)


def _spans(
    count: int, width: int, length: torch.Tensor, size: int, generator: torch.Generator | list[torch.Generator] | None
) -> torch.Tensor:
    """``[B, size]`` bool: per row, the union of ``count`` spans of ``U[0, width]`` positions starting
    uniformly in ``[0, length - w]`` (``length`` ``[B]``, at most ``size``); with a list of
    generators, row ``i`` draws from ``generator[i]``."""
    if isinstance(generator, list):
        return torch.cat([_spans(count, width, length[i : i + 1], size, g) for i, g in enumerate(generator)])
    b = length.shape[0]
    hit = torch.zeros(b, size, dtype=torch.bool)
    pos = torch.arange(size)[None, :]
    for _ in range(count):
        w = torch.minimum(torch.randint(0, width + 1, (b,), generator=generator), length)
        start = (torch.rand(b, generator=generator) * (length - w + 1).float()).long()
        hit |= (pos >= start[:, None]) & (pos < (start + w)[:, None])
    return hit


def spec_augment(
    features: torch.Tensor,
    valid_frames: torch.Tensor,
    options: SpecAugmentOptions,
    generator: torch.Generator | list[torch.Generator] | None = None,
) -> torch.Tensor:
    """Mask ``features`` ``[B, M, T]`` (mel channels, frames) as SpecAugment does.

    Args:
        features: log-mel features of a batch, any device and float dtype.
        valid_frames: ``[B]`` frames of each item that hold its clip (the rest is padding).
        options: how many masks of what width (:class:`SpecAugmentOptions`).
        generator: random numbers: one generator (default: torch's global one), or one per row of
            ``features`` (each clip's draws from its own sample's stream).

    Returns:
        a new tensor (``features`` itself when nothing is active) whose masked entries hold the
        item's mean over its valid frames.
    """
    if not options.active:
        return features
    b, mels, frames = features.shape
    valid = valid_frames.detach().cpu().long().clamp(0, frames)
    freq = _spans(options.freq_masks, options.freq_width, torch.full((b,), mels), mels, generator)  # [B, M]
    time = _spans(options.time_masks, options.time_width, valid, frames, generator)  # [B, T]
    mask = (freq[:, :, None] | time[:, None, :]).to(features.device)
    in_clip = (torch.arange(frames)[None, :] < valid[:, None]).to(features.device)  # [B, T]
    mean = (features * in_clip[:, None, :]).sum((1, 2)) / (in_clip.sum(1) * mels).clamp_min(1)
    mask &= in_clip[:, None, :]
    return torch.where(mask, mean[:, None, None].to(features.dtype), features)


def window_generators(batch: dict[str, torch.Tensor], rows: int) -> list[torch.Generator] | None:
    """One generator per row (window) of a collated batch: each clip's own stream
    (:func:`omnicore.api.item_generators`, from its sample) when every clip is one window; when a
    long clip was split into several windows (which window is whose is not in the batch), every row
    draws from one stream seeded from the batch's clips. None for a batch without seeds (torch's
    global generator)."""
    gens = item_generators(batch)
    if gens is None or len(gens) == rows:
        return gens
    shared = torch.Generator().manual_seed(hash(tuple(batch[ITEM_SEEDS].reshape(-1).tolist())) % 2**63)
    return [shared] * rows
