"""The data side of a family's Whisper-style audio tower (Qwen2-Audio's, Qwen2.5-Omni's thinker's):
the checkpoint's own ``WhisperFeatureExtractor`` over one clip, padded to its window, and the number
of audio tokens the tower gives it.

Token rule (transformers' ``Qwen2AudioProcessor`` and ``Qwen2_5OmniProcessor``,
``_get_feat_extract_output_lengths``): a clip of ``L`` valid mel frames gives
``((L - 1) // 2 + 1 - 2) // 2 + 1`` tokens (the stride-2 convolution, then the width-2 average
pooling), so a clip needs at least 3 mel frames.

Imports no model code (data workers build it from the options alone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnicore.api import Audio, resample

PLACEHOLDER = "<|AUDIO|>"
"""The audio token these checkpoints write once per tower row."""
WRAP = ("<|audio_bos|>", "<|audio_eos|>")
"""The tokens around a clip's placeholders, as their chat templates and processors write them."""


def num_tokens_for_frames(valid_frames: int) -> int:
    """Audio tokens of ``valid_frames`` valid mel frames: ``((L - 1) // 2 + 1 - 2) // 2 + 1``."""
    return ((int(valid_frames) - 1) // 2 + 1 - 2) // 2 + 1


def load_feature_extractor(folder: Path, what: str, what_to_put: str) -> Any:
    """The checkpoint's own feature extractor (``AutoFeatureExtractor.from_pretrained``).

    Raises:
        ValueError: naming ``what``, ending with ``what_to_put``, when the folder has neither
            ``preprocessor_config.json`` nor ``processor_config.json``.
    """
    from transformers import AutoFeatureExtractor

    if not any((folder / f).is_file() for f in ("preprocessor_config.json", "processor_config.json")):
        raise ValueError(f"{what}: {str(folder)!r} has no preprocessor_config.json or processor_config.json; {what_to_put}")
    return AutoFeatureExtractor.from_pretrained(str(folder))


class WhisperClipProcessor:
    """The :class:`omnicore.api.Processor` of a Whisper-style audio tower (picklable, no weights).
    A family subclasses it, naming itself in :attr:`label` and :attr:`model_name`.

    Args:
        feature_extractor: the checkpoint's ``WhisperFeatureExtractor`` (unchanged).
        long_audio: ``"refuse"`` a clip longer than the window, or ``"truncate"`` it to the window.

    Attributes:
        modality: ``"audio"``; placeholder: ``<|AUDIO|>``; wrap: ``(<|audio_bos|>, <|audio_eos|>)``.
        label: how messages name the component (``"qwen2_audio encoder"``); model_name: how they
            name the model (``"Qwen2-Audio"``).
        sampling_rate: Hz the clips are resampled to; hop_length: samples per mel frame;
            max_samples: the window every clip is padded to (``n_samples``); long_audio: as given.
    """

    modality = "audio"
    placeholder = PLACEHOLDER
    wrap = WRAP
    label = "audio encoder"
    model_name = "this model"

    def __init__(self, feature_extractor: Any, *, long_audio: str = "refuse") -> None:
        self.feature_extractor = feature_extractor
        self.long_audio = long_audio
        self.sampling_rate = int(feature_extractor.sampling_rate)
        self.hop_length = int(feature_extractor.hop_length)
        self.max_samples = int(feature_extractor.n_samples)

    def preprocess(self, media: Audio) -> dict[str, torch.Tensor]:
        """One clip to the checkpoint's log-mel features, as the family's transformers processor
        computes them.

        Args:
            media: :class:`omnicore.api.Audio`, mono float32 samples ``[num_samples]`` in [-1, 1]
                at ``media.sample_rate`` Hz (resampled with soxr to :attr:`sampling_rate`).

        Returns:
            ``{"input_features": float32 [num_mel_bins, max_frames], "feature_attention_mask":
            int64 [max_frames]}`` (1 on the frames that cover the clip, 0 on the padding).

        Raises:
            ValueError: the samples are not one-dimensional; the clip gives no token (under 3 mel
                frames, about 20 ms at 16 kHz); or it is longer than the window with
                ``long_audio="refuse"`` (the message gives both lengths).
        """
        samples = np.asarray(media.samples)
        if samples.ndim != 1:
            raise ValueError(f"{self.label} expects mono audio of shape [num_samples]; got shape {samples.shape}")
        audio = resample(Audio(samples=samples.astype(np.float32, copy=False), sample_rate=int(media.sample_rate)), self.sampling_rate)
        wave = np.asarray(audio.samples, dtype=np.float32)
        if wave.shape[0] > self.max_samples and self.long_audio == "refuse":
            raise ValueError(
                f"audio is {wave.shape[0] / self.sampling_rate:.2f} s long, longer than the checkpoint's window of "
                f"{self.max_samples / self.sampling_rate:g} s (long_audio: refuse); cut the clip, or set long_audio: truncate"
            )
        out = self.feature_extractor(
            wave, sampling_rate=self.sampling_rate, return_attention_mask=True, padding="max_length", return_tensors="pt"
        )
        features = {
            "input_features": out["input_features"][0].to(torch.float32).contiguous(),
            "feature_attention_mask": out["attention_mask"][0].to(torch.long).contiguous(),
        }
        if self.num_tokens(features) < 1:
            raise ValueError(
                f"audio of {wave.shape[0]} samples at {self.sampling_rate} Hz is too short for {self.model_name} (it needs at least "
                f"3 mel frames, {2 * self.hop_length + 1} samples)"
            )
        return features

    def num_tokens(self, features: dict[str, Any]) -> int:
        """``<|AUDIO|>`` tokens of one clip: :func:`num_tokens_for_frames` of its mask's sum."""
        return num_tokens_for_frames(int(torch.as_tensor(features["feature_attention_mask"]).sum()))

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack clips in order: ``input_features`` ``[B, num_mel_bins, max_frames]`` and
        ``feature_attention_mask`` ``[B, max_frames]`` (the model's own input names).

        Raises:
            ValueError: ``items`` is empty.
        """
        if not items:
            raise ValueError(f"{self.label}: collate() needs at least one item")
        return {
            "input_features": torch.stack([torch.as_tensor(it["input_features"]) for it in items]),
            "feature_attention_mask": torch.stack([torch.as_tensor(it["feature_attention_mask"], dtype=torch.long) for it in items]),
        }
