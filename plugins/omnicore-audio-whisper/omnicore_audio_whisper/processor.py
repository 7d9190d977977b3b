"""The data side of ``encoder/whisper``: options, log-mel features, token counts and batching.

Imports no model code (only transformers' ``WhisperFeatureExtractor`` and ``WhisperConfig``), so
data workers build :class:`WhisperAudioProcessor` with :func:`build_processor` from the options
alone: a checkpoint folder's ``config.json`` and ``preprocessor_config.json`` are read, never its
weights. :class:`omnicore_audio_whisper.encoder.WhisperAudioEncoder` holds the same processor and
delegates to it. The token formula is :func:`num_tokens_for_frames` (see the encoder module).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import WhisperConfig, WhisperFeatureExtractor

from omnicore.api import Audio, resample
from omnicore_audio_whisper.augment import SpecAugmentOptions

SHAPE_KEYS = ("d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "num_mel_bins")
"""WhisperConfig keys that change weight shapes (a checkpoint's own values win; options must agree)."""
WHAT_TO_PUT = (
    "point options.checkpoint at a folder written by WhisperAudioEncoder.save_pretrained, or a Hugging Face Whisper "
    "checkpoint (config.json with model_type 'whisper' plus model.safetensors) as WhisperModel, "
    "WhisperForConditionalGeneration or WhisperEncoder save_pretrained writes it"
)


class WhisperEncoderOptions(BaseModel):
    """Options of ``encoder/whisper`` (the ``options`` mapping in config).

    Either ``checkpoint`` (a local folder) or ``config`` (a from-scratch, randomly initialised
    encoder; an empty ``config`` means transformers' ``WhisperConfig`` defaults, the whisper-tiny
    shape) describes the backbone.
    """

    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = Field(
        default=None,
        description=(
            "Local folder to load: one written by WhisperAudioEncoder.save_pretrained (projector restored) "
            "or a Hugging Face Whisper checkpoint as published (WhisperModel / WhisperForConditionalGeneration "
            "/ WhisperEncoder save_pretrained: config.json plus model.safetensors, sharded safetensors or "
            "pytorch_model.bin); its encoder is used and the projector is freshly initialised. "
            "preprocessor_config.json there, if any, sets the feature extractor. Nothing is downloaded."
        ),
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "WhisperConfig keyword arguments for a from-scratch encoder (e.g. d_model, encoder_layers, "
            "encoder_attention_heads, encoder_ffn_dim, num_mel_bins). With a checkpoint, keys that do not "
            "change weight shapes (e.g. dropout) override the checkpoint's config; shape keys must match it. "
            "max_source_positions is derived from chunk_seconds."
        ),
    )
    chunk_seconds: float = Field(
        default=3.0,
        gt=0,
        description=(
            "Length in seconds every clip is padded (with silence) or truncated to. Sets the mel frames "
            "(chunk_seconds * 100 at 16 kHz / hop 160) and max_source_positions = frames / 2; must give an "
            "even whole number of frames (a multiple of 0.02 s). A longer clip follows long_audio."
        ),
    )
    long_audio: Literal["split", "refuse"] = Field(
        default="split",
        description=(
            "A clip longer than chunk_seconds: split = encode it as consecutive chunk_seconds windows (the last one padded), "
            "whose tokens form one placeholder span (num_tokens is the sum over windows); refuse = a bad sample naming the "
            "file, its duration and chunk_seconds (data.on_error: skip counts it). Audio is never cut silently."
        ),
    )
    pool: int = Field(
        default=4,
        ge=1,
        description=(
            "Stride (and width) of the average pooling over the encoder's output positions (20 ms each) "
            "before projection; num_tokens = max(1, ceil(ceil(valid_frames / 2) / pool))."
        ),
    )
    freeze: bool = Field(
        default=False,
        description="Freeze the Whisper encoder (no gradients, run under no_grad); the projector still trains.",
    )
    spec_augment: SpecAugmentOptions = Field(
        default_factory=SpecAugmentOptions,
        description=(
            "SpecAugment frequency and time masks while the encoder trains (never in eval, validation or "
            "generation), e.g. {freq_masks: 2, freq_width: 10, time_masks: 2, time_width: 8}; off by default"
        ),
    )


def num_tokens_for_frames(valid_frames: int, pool: int) -> int:
    """Tokens for ``valid_frames`` unpadded mel frames: ``max(1, ceil(ceil(valid_frames / 2) / pool))``.

    ``ceil(valid_frames / 2)`` is the number of output positions of Whisper's second convolution
    (kernel 3, stride 2, padding 1) over the valid frames; ``ceil(. / pool)`` is the number of
    pooling windows (stride ``pool``, the last one possibly partial) that touch them. At least one
    token is always produced, so an empty clip still has a placeholder.
    """
    positions = -(-int(valid_frames) // 2)
    return max(1, -(-positions // int(pool)))


class WhisperAudioProcessor:
    """The :class:`omnicore.components.Processor` of ``encoder/whisper`` (picklable, no weights).

    Attributes:
        modality: ``"audio"``.
        feature_extractor: transformers' ``WhisperFeatureExtractor`` set to ``chunk_seconds``.
        chunk_seconds: seconds per window; ``chunk_frames`` mel frames (100 per second at 16 kHz);
            ``chunk_samples`` samples at ``sampling_rate`` Hz; ``hop_length`` samples per frame.
        pool: average-pooling stride over encoder positions (enters :meth:`num_tokens`).
        long_audio: ``"split"`` or ``"refuse"`` (see :class:`WhisperEncoderOptions`).

    Build it with :func:`build_processor`.
    """

    modality = "audio"

    def __init__(self, feature_extractor: WhisperFeatureExtractor, *, chunk_seconds: float, pool: int, long_audio: str = "split") -> None:
        self.feature_extractor = feature_extractor
        self.chunk_seconds = float(chunk_seconds)
        self.pool = int(pool)
        self.long_audio = long_audio
        self.sampling_rate = int(feature_extractor.sampling_rate)
        self.hop_length = int(feature_extractor.hop_length)
        self.chunk_frames = int(feature_extractor.nb_max_frames)
        self.chunk_samples = int(feature_extractor.n_samples)

    def preprocess(self, media: Audio) -> dict[str, torch.Tensor]:
        """One clip to log-mel features (CPU, no gradients).

        Args:
            media: :class:`omnicore.data.media.Audio`, mono float32 samples ``[num_samples]`` in
                [-1, 1] at ``media.sample_rate`` Hz (any rate: it is resampled with soxr to
                ``sampling_rate``, 16 kHz).

        Returns:
            ``{"input_features": float32 [num_mel_bins, chunk_frames], "valid_frames": int64 []}``:
            Whisper's log-mel spectrogram of the clip padded with silence to ``chunk_seconds``, and
            the number of mel frames that cover real audio, ``ceil(num_samples_16k / hop_length)``.
            A clip longer than ``chunk_seconds`` (with ``long_audio="split"``) is cut into ``W``
            consecutive windows: ``input_features`` ``[W, num_mel_bins, chunk_frames]`` and
            ``valid_frames`` ``[W]`` (every window full but the last).

        Raises:
            ValueError: if the samples are not one-dimensional, the sample rate is not positive, or
                the clip is longer than ``chunk_seconds`` with ``long_audio="refuse"`` (the message
                gives its duration and the limit).
        """
        samples = np.asarray(media.samples)
        if samples.ndim != 1:
            raise ValueError(f"whisper encoder expects mono audio of shape [num_samples]; got shape {samples.shape}")
        if int(media.sample_rate) <= 0:
            raise ValueError(f"whisper encoder: sample_rate must be a positive number of Hz, got {media.sample_rate}")
        audio = resample(Audio(samples=samples.astype(np.float32, copy=False), sample_rate=int(media.sample_rate)), self.sampling_rate)
        wave = np.asarray(audio.samples, dtype=np.float32)
        if wave.shape[0] <= self.chunk_samples:
            feats, valid = self._window(wave)
            return {"input_features": feats, "valid_frames": torch.tensor(valid, dtype=torch.long)}
        if self.long_audio == "refuse":
            raise ValueError(
                f"audio is {wave.shape[0] / self.sampling_rate:.2f} s long, longer than the whisper encoder's window "
                f"chunk_seconds={self.chunk_seconds:g} s (long_audio: refuse); cut the clip, or set long_audio: split"
            )
        windows = [self._window(wave[i : i + self.chunk_samples]) for i in range(0, wave.shape[0], self.chunk_samples)]
        return {
            "input_features": torch.stack([f for f, _ in windows]),
            "valid_frames": torch.tensor([v for _, v in windows], dtype=torch.long),
        }

    def _window(self, wave: np.ndarray) -> tuple[torch.Tensor, int]:
        """Log-mel ``[num_mel_bins, chunk_frames]`` of at most ``chunk_samples`` samples padded with
        silence, and its valid frames ``ceil(len / hop_length)`` (0 for an empty clip)."""
        valid = min(-(-wave.shape[0] // self.hop_length), self.chunk_frames)
        if wave.shape[0] == 0:
            wave = np.zeros(1, dtype=np.float32)
        feats = self.feature_extractor(
            wave,
            sampling_rate=self.sampling_rate,
            padding="max_length",
            max_length=self.chunk_samples,
            truncation=True,
            return_tensors="np",
        )["input_features"][0]
        if feats.shape != (self.feature_extractor.feature_size, self.chunk_frames):  # pragma: no cover - guards transformers changes
            raise RuntimeError(
                f"unexpected log-mel shape {feats.shape}; expected ({self.feature_extractor.feature_size}, {self.chunk_frames})"
            )
        return torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32)), valid

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Placeholder tokens for one item: :func:`num_tokens_for_frames` of its ``valid_frames``,
        summed over its windows (a split long clip is one span of all its windows' tokens).

        Depends only on the valid (unpadded) audio length, never on the padding.
        """
        valid = torch.as_tensor(features["valid_frames"]).reshape(-1)
        return sum(num_tokens_for_frames(int(v), self.pool) for v in valid)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack items' windows in order: ``input_features`` ``[B, num_mel_bins, chunk_frames]``,
        ``valid_frames`` ``[B]``, where ``B`` counts windows (one per item, more for a split long clip).

        Raises:
            ValueError: if ``items`` is empty or the items' feature shapes differ.
        """
        if not items:
            raise ValueError("whisper encoder: collate() needs at least one item")
        shapes = {tuple(it["input_features"].shape[-2:]) for it in items}
        if len(shapes) != 1:
            raise ValueError(
                f"whisper encoder: items have different feature shapes {sorted(shapes)}; preprocess them with the same encoder"
            )
        return {
            "input_features": torch.cat([torch.as_tensor(it["input_features"]).reshape(-1, *next(iter(shapes))) for it in items]),
            "valid_frames": torch.cat([torch.as_tensor(it["valid_frames"], dtype=torch.long).reshape(-1) for it in items]),
        }


def checkpoint_config(folder: Path) -> WhisperConfig:
    """The ``WhisperConfig`` of a checkpoint folder, from its ``config.json`` alone (no weights).

    Raises:
        ValueError: naming the folder and what to put there, if it or its Whisper ``config.json`` is missing.
    """
    if not (folder / "config.json").is_file():
        raise ValueError(f"whisper encoder: {folder} has no config.json; {WHAT_TO_PUT}")
    try:
        return WhisperConfig.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ValueError(f"whisper encoder: cannot read {folder / 'config.json'} as a Whisper config: {exc}; {WHAT_TO_PUT}") from exc


def build_processor(options: dict[str, Any]) -> WhisperAudioProcessor:
    """The processor factory of ``encoder/whisper`` (``ComponentSpec.processor``): options to a
    :class:`WhisperAudioProcessor`, reading at most the checkpoint's ``config.json`` and
    ``preprocessor_config.json``.

    Raises:
        ValueError: ``options.config`` sets ``max_source_positions`` or contradicts the checkpoint's
            ``num_mel_bins``; the checkpoint folder has no Whisper ``config.json``; ``chunk_seconds``
            does not give an even whole number of mel frames; ``preprocessor_config.json`` has
            another ``feature_size`` than the model's ``num_mel_bins``.
        pydantic.ValidationError: if ``options`` has unknown keys or bad values.
    """
    opts = WhisperEncoderOptions.model_validate(dict(options or {}))
    if "max_source_positions" in opts.config:
        raise ValueError("whisper encoder: max_source_positions is set from chunk_seconds; remove it from options.config")
    fe_base = None
    if opts.checkpoint:
        ckpt = Path(opts.checkpoint).expanduser()
        config = checkpoint_config(ckpt)
        mels = opts.config.get("num_mel_bins", config.num_mel_bins)
        if mels != config.num_mel_bins:
            raise ValueError(
                f"whisper encoder: options.config['num_mel_bins'] = {mels!r} contradicts checkpoint {ckpt} "
                f"(num_mel_bins = {config.num_mel_bins!r}); drop it or use a matching checkpoint"
            )
        if (ckpt / "preprocessor_config.json").is_file():
            fe_base = WhisperFeatureExtractor.from_pretrained(str(ckpt))
    else:
        config = WhisperConfig(**opts.config)
    fe = make_feature_extractor(fe_base, num_mel_bins=int(config.num_mel_bins), chunk_seconds=opts.chunk_seconds)
    return WhisperAudioProcessor(fe, chunk_seconds=opts.chunk_seconds, pool=opts.pool, long_audio=opts.long_audio)


def make_feature_extractor(base: WhisperFeatureExtractor | None, *, num_mel_bins: int, chunk_seconds: float) -> WhisperFeatureExtractor:
    """A ``WhisperFeatureExtractor`` like ``base`` (or the defaults) that pads to ``chunk_seconds``."""
    kwargs: dict[str, Any] = {"feature_size": num_mel_bins}
    if base is not None:
        if int(base.feature_size) != num_mel_bins:
            raise ValueError(
                f"whisper encoder: preprocessor_config.json has feature_size={base.feature_size} but the model has "
                f"num_mel_bins={num_mel_bins}"
            )
        kwargs.update(
            sampling_rate=int(base.sampling_rate),
            hop_length=int(base.hop_length),
            n_fft=int(base.n_fft),
            padding_value=float(base.padding_value),
            dither=float(getattr(base, "dither", 0.0)),
        )
    sr = int(kwargs.get("sampling_rate", 16000))
    hop = int(kwargs.get("hop_length", 160))
    exact = chunk_seconds * sr / hop
    frames = int(round(exact))
    if abs(frames - exact) > 1e-6 or frames % 2 or frames < 2:
        step = 2 * hop / sr
        raise ValueError(
            f"whisper encoder: chunk_seconds={chunk_seconds} gives {exact:g} mel frames ({sr} Hz, hop {hop}); "
            f"it must be a positive multiple of {step:g} s so that the frames are an even whole number"
        )
    fe = WhisperFeatureExtractor(chunk_length=chunk_seconds, **kwargs)
    # WhisperFeatureExtractor computes these from an integer chunk_length; make them exact ints.
    fe.n_samples = frames * hop
    fe.nb_max_frames = frames
    return fe
