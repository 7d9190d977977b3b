"""The data side of the Qwen2-Audio family: options, the checkpoint's own log-mel features and
the number of ``<|AUDIO|>`` tokens per clip.

Imports no model code: :func:`build_processor` reads the checkpoint folder's feature extractor
(``preprocessor_config.json`` or ``processor_config.json``, through ``AutoFeatureExtractor``), never
its weights, so data workers build it from the options alone.

Token rule (transformers' ``Qwen2AudioProcessor`` and the model's ``feature_attention_mask`` path):
a clip padded to the extractor's fixed length has ``L`` valid mel frames (its attention mask's
sum, ``ceil(samples / hop_length)``); the tower's stride-2 convolution keeps ``(L - 1) // 2 + 1``
positions and its width-2 average pooling ``(positions - 2) // 2 + 1``, which is the number of
placeholder tokens, and of projected rows the model scatters into them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from omnicore.api import Audio, resample
from omnicore_family_kit.checkpoint import checkpoint_folder as kit_checkpoint_folder
from omnicore_family_kit.options import CheckpointOptions
from omnicore_family_qwen2_audio.plugin import MODEL_TYPES

PLACEHOLDER = "<|AUDIO|>"
WRAP = ("<|audio_bos|>", "<|audio_eos|>")
WHAT_TO_PUT = (
    "point options.checkpoint at a Qwen2-Audio folder as published (Qwen/Qwen2-Audio-7B-Instruct, or what "
    "Qwen2AudioForConditionalGeneration.save_pretrained and Qwen2AudioProcessor.save_pretrained write: config.json, "
    "model.safetensors, tokenizer and processor files)"
)


class Qwen2AudioEncoderOptions(CheckpointOptions):
    """Options of ``encoder/qwen2_audio_encoder``."""

    checkpoint: str = Field(
        description=(
            "A published Qwen2-Audio folder (config.json of Qwen2AudioForConditionalGeneration, its safetensors and "
            "feature extractor), or a Hub name in the local cache; its audio_tower and multi_modal_projector are loaded"
        )
    )
    long_audio: Literal["refuse", "truncate"] = Field(
        default="refuse",
        description=(
            "A clip longer than the feature extractor's window (30 s as published): refuse = a bad sample naming its "
            "length and the limit; truncate = keep its first window, as Qwen2AudioProcessor does"
        ),
    )


class Qwen2AudioFoundationOptions(CheckpointOptions):
    """Options of ``foundation/qwen2_audio``."""

    checkpoint: str = Field(
        description=(
            "A published Qwen2-Audio folder (Qwen2AudioForConditionalGeneration config.json, safetensors, tokenizer and "
            "processor files), or a Hub name in the local cache (e.g. Qwen/Qwen2-Audio-7B-Instruct)"
        )
    )
    long_audio: Literal["refuse", "truncate"] = Field(
        default="refuse", description="passed to the audio encoder it brings (see encoder/qwen2_audio_encoder)"
    )


def num_tokens_for_frames(valid_frames: int) -> int:
    """``<|AUDIO|>`` tokens for ``valid_frames`` valid mel frames: ``((L - 1) // 2 + 1 - 2) // 2 + 1``
    (the stride-2 convolution, then the width-2 average pooling; see the module docstring)."""
    positions = (int(valid_frames) - 1) // 2 + 1
    return (positions - 2) // 2 + 1


def checkpoint_folder(checkpoint: str, what: str) -> Path:
    """``checkpoint`` as a Qwen2-Audio folder: :func:`omnicore_family_kit.checkpoint.checkpoint_folder` of
    :data:`MODEL_TYPES` (ValueError naming ``what``, ending with :data:`WHAT_TO_PUT`)."""
    return kit_checkpoint_folder(checkpoint, what, MODEL_TYPES, WHAT_TO_PUT)


class Qwen2AudioClipProcessor:
    """The :class:`omnicore.api.Processor` of the Qwen2-Audio encoder (picklable, no weights).

    Attributes:
        modality: ``"audio"``.
        placeholder: ``<|AUDIO|>``; ``wrap``: ``(<|audio_bos|>, <|audio_eos|>)``: the checkpoint's
            own tokens, as its chat template and ``Qwen2AudioProcessor`` write them.
        feature_extractor: the checkpoint's ``WhisperFeatureExtractor`` (unchanged).
        sampling_rate: Hz the clips are resampled to; ``max_samples``: the window every clip is
            padded to (``n_samples``); ``long_audio``: ``"refuse"`` or ``"truncate"``.
    """

    modality = "audio"
    placeholder = PLACEHOLDER
    wrap = WRAP

    def __init__(self, feature_extractor: Any, *, long_audio: str = "refuse") -> None:
        self.feature_extractor = feature_extractor
        self.long_audio = long_audio
        self.sampling_rate = int(feature_extractor.sampling_rate)
        self.hop_length = int(feature_extractor.hop_length)
        self.max_samples = int(feature_extractor.n_samples)

    def preprocess(self, media: Audio) -> dict[str, torch.Tensor]:
        """One clip to the checkpoint's log-mel features, as ``Qwen2AudioProcessor`` computes them.

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
            raise ValueError(f"qwen2_audio encoder expects mono audio of shape [num_samples]; got shape {samples.shape}")
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
                f"audio of {wave.shape[0]} samples at {self.sampling_rate} Hz is too short for Qwen2-Audio (it needs at least "
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
            raise ValueError("qwen2_audio encoder: collate() needs at least one item")
        return {
            "input_features": torch.stack([torch.as_tensor(it["input_features"]) for it in items]),
            "feature_attention_mask": torch.stack([torch.as_tensor(it["feature_attention_mask"], dtype=torch.long) for it in items]),
        }


def load_feature_extractor(folder: Path, what: str) -> Any:
    """The checkpoint's own feature extractor (``AutoFeatureExtractor.from_pretrained``).

    Raises:
        ValueError: naming ``what`` when the folder has no feature-extractor files.
    """
    from transformers import AutoFeatureExtractor

    if not any((folder / f).is_file() for f in ("preprocessor_config.json", "processor_config.json")):
        raise ValueError(f"{what}: {str(folder)!r} has no preprocessor_config.json or processor_config.json; {WHAT_TO_PUT}")
    return AutoFeatureExtractor.from_pretrained(str(folder))


def build_processor(options: dict[str, Any]) -> Qwen2AudioClipProcessor:
    """The processor factory of ``encoder/qwen2_audio_encoder``: reads the checkpoint's
    ``config.json`` and feature extractor only.

    Raises:
        ValueError: the folder is not a Qwen2-Audio checkpoint, or has no feature extractor.
        pydantic.ValidationError: unknown option keys or bad values.
    """
    opts = Qwen2AudioEncoderOptions.model_validate(dict(options or {}))
    what = "model.encoders.audio.options.checkpoint"
    folder = checkpoint_folder(opts.checkpoint, what)
    return Qwen2AudioClipProcessor(load_feature_extractor(folder, what), long_audio=opts.long_audio)
