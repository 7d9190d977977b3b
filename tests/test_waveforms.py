"""The audio target helpers of ``omnicore.api`` that decoder processors share
(:mod:`omnicore.data.waveforms`), on tiny clips whose outputs are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnicore.api import Audio, collate_waveforms, target_waveform


def test_target_waveform_clips_pads_crops_and_refuses():
    """At the tokenizer's rate (no resampling): clipped to [-1, 1] and padded with zeros to
    ``round(max_seconds * rate)`` samples; a longer clip cropped or refused with its duration."""
    clip = Audio(np.array([0.5, -2.0, 1.5], dtype=np.float32), 100)
    out = target_waveform(clip, 100, 0.05, "refuse", "x decoder")
    assert out["input_values"].dtype == torch.float32 and out["input_values"].tolist() == [0.5, -1.0, 1.0, 0.0, 0.0]
    long = Audio(np.arange(7, dtype=np.float32) / 10, 100)
    assert target_waveform(long, 100, 0.05, "crop", "x decoder")["input_values"].numpy().tolist() == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError, match=r"^x decoder: target clip of 0\.070 s is longer than max_seconds=0\.05 s \(long_audio: refuse\)"):
        target_waveform(long, 100, 0.05, "refuse", "x decoder")
    with pytest.raises(TypeError, match="^x decoder preprocess expects an omnicore.api.Audio, got ndarray"):
        target_waveform(clip.samples, 100, 0.05, "refuse", "x decoder")
    with pytest.raises(ValueError, match=r"mono audio of shape \[num_samples\]; got shape \(1, 3\)"):
        target_waveform(Audio(clip.samples[None], 100), 100, 0.05, "refuse", "x decoder")
    with pytest.raises(ValueError, match="sample_rate must be a positive number of Hz, got 0"):
        target_waveform(Audio(clip.samples, 0), 100, 0.05, "refuse", "x decoder")


def test_collate_waveforms_pads_to_the_longest():
    out = collate_waveforms([{"input_values": torch.tensor([1.0, 2.0, 3.0])}, {"input_values": np.array([4.0, 5.0])}], "x decoder")
    assert out["input_values"].tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]] and out["input_values"].dtype == torch.float32
    assert out["num_samples"].tolist() == [3, 2] and out["num_samples"].dtype == torch.long
    with pytest.raises(ValueError, match="^x decoder: collate\\(\\) needs at least one item$"):
        collate_waveforms([], "x decoder")
