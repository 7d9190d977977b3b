"""The Whisper audio encoder for omnicore: ``encoder/whisper``.

Pipeline for one clip (:class:`WhisperAudioEncoder`):

1. ``preprocess`` (data workers, CPU, no gradients): resample to the feature extractor's rate
   (16 kHz for every published Whisper) with :func:`omnicore.data.media.resample`, then 80 (or
   ``num_mel_bins``) log-mel bins every ``hop_length`` samples (160 at 16 kHz: 100 frames per
   second) with transformers' ``WhisperFeatureExtractor``; every clip is padded with silence to
   ``chunk_seconds``. A longer clip is never truncated: with ``long_audio: split`` (the default) it
   becomes several consecutive windows, each encoded like a clip, whose tokens form one
   placeholder span; with ``long_audio: refuse`` it is a bad sample. The number of *valid*
   (unpadded) mel frames of each window is kept.
2. ``forward``: transformers' ``WhisperEncoder`` (two convolutions, the second of stride 2, then
   pre-norm transformer layers) over the whole padded chunk, average pooling of its output positions
   with stride ``pool``, a ``Linear(d_model, hidden_size)`` projector, and for each item only its
   first :meth:`~WhisperAudioEncoder.num_tokens` rows.

The one token-count formula, shared by the data side and the model (:func:`num_tokens_for_frames`)::

    valid_frames = min(ceil(num_samples_16k / hop_length), chunk_frames)   # mel frames, 100 per s
    encoder_positions = ceil(valid_frames / 2)                              # conv2 has stride 2
    num_tokens = max(1, ceil(encoder_positions / pool))

so with the defaults (``chunk_seconds=3``, ``pool=4``) a 1 s clip gives 100 frames, 50 positions
and 13 tokens; a clip of 3 s or longer gives the maximum, 38 tokens (80 ms of audio per token).

Padded positions are still seen by the encoder (Whisper has no attention mask; it was trained on
padded 30 s chunks) and the last kept pooling window of an item may straddle its end; the rows after
an item's ``num_tokens`` are dropped.

Source: A. Radford, J. W. Kim, T. Xu, G. Brockman, C. McLeavey, I. Sutskever, "Robust Speech
Recognition via Large-Scale Weak Supervision" (2022), arXiv:2212.04356; the implementation is
``transformers.models.whisper.modeling_whisper.WhisperEncoder`` and ``WhisperFeatureExtractor``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from transformers import WhisperConfig, WhisperFeatureExtractor
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from omnicore.api import Audio, load_extra_weights, load_hf_pretrained, resample, save_extra_weights

COMPONENT = "encoder/whisper"
"""The component name recorded with the projector in ``omnicore_extra.safetensors``."""
LEGACY_FILES = ("projector.safetensors", "omnicore_encoder.json")
"""What versions before the shared extra-weights format wrote instead (no longer read)."""
ENCODER_PREFIXES = ("model.encoder.", "encoder.")
"""Where published checkpoints keep the encoder: ``WhisperForConditionalGeneration`` under
``model.encoder.``, ``WhisperModel`` under ``encoder.``; a ``WhisperEncoder`` folder has no prefix."""

_SHAPE_KEYS = ("d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "num_mel_bins")
_WHAT_TO_PUT = (
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


def num_tokens_for_frames(valid_frames: int, pool: int) -> int:
    """Tokens for ``valid_frames`` unpadded mel frames: ``max(1, ceil(ceil(valid_frames / 2) / pool))``.

    ``ceil(valid_frames / 2)`` is the number of output positions of Whisper's second convolution
    (kernel 3, stride 2, padding 1) over the valid frames; ``ceil(. / pool)`` is the number of
    pooling windows (stride ``pool``, the last one possibly partial) that touch them. At least one
    token is always produced, so an empty clip still has a placeholder.
    """
    positions = -(-int(valid_frames) // 2)
    return max(1, -(-positions // int(pool)))


class WhisperAudioEncoder(nn.Module):
    """omnicore :class:`~omnicore.components.Encoder` for audio, built on Whisper's encoder.

    Attributes:
        modality: ``"audio"``.
        whisper: transformers' ``WhisperEncoder`` (``[B, num_mel_bins, chunk_frames]`` ->
            ``[B, chunk_frames / 2, d_model]``).
        projector: ``nn.Linear(d_model, hidden_size)``.
        feature_extractor: transformers' ``WhisperFeatureExtractor`` set to ``chunk_seconds``.
        chunk_seconds: seconds per chunk; ``chunk_frames`` mel frames (100 per second at 16 kHz);
            ``chunk_samples`` samples at ``sampling_rate`` Hz.
        pool: average-pooling stride over encoder positions.
        hidden_size: ``H``, the width of the output rows.

    Build it with :func:`build` (the registry's factory) rather than directly.
    """

    modality = "audio"

    def __init__(
        self,
        whisper: WhisperEncoder,
        feature_extractor: WhisperFeatureExtractor,
        *,
        hidden_size: int,
        chunk_seconds: float,
        pool: int,
        freeze: bool = False,
        long_audio: str = "split",
    ) -> None:
        super().__init__()
        self.whisper = whisper
        self.projector = nn.Linear(whisper.config.d_model, hidden_size)
        self.feature_extractor = feature_extractor
        self.hidden_size = int(hidden_size)
        self.chunk_seconds = float(chunk_seconds)
        self.pool = int(pool)
        self.sampling_rate = int(feature_extractor.sampling_rate)
        self.hop_length = int(feature_extractor.hop_length)
        self.chunk_frames = int(feature_extractor.nb_max_frames)
        self.chunk_samples = int(feature_extractor.n_samples)
        self.frozen = bool(freeze)
        self.long_audio = long_audio
        if freeze:
            self.whisper.requires_grad_(False)

    # ---- data side ---------------------------------------------------------------------------

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

    def dummy_batch(self) -> dict[str, torch.Tensor]:
        """A one-item batch of 0.5 s of silence at 16 kHz (7 tokens with ``pool=4``)."""
        return self.collate([self.preprocess(Audio(np.zeros(self.sampling_rate // 2, dtype=np.float32), self.sampling_rate))])

    # ---- model side --------------------------------------------------------------------------

    def batch_num_tokens(self, valid_frames: torch.Tensor) -> torch.Tensor:
        """Vectorised :func:`num_tokens_for_frames`: int64 ``[B]`` valid frames to int64 ``[B]`` tokens."""
        positions = torch.div(valid_frames + 1, 2, rounding_mode="floor")
        return torch.div(positions + self.pool - 1, self.pool, rounding_mode="floor").clamp_min(1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Encode a collated batch.

        Args:
            batch: from :meth:`collate`: ``input_features`` ``[B, num_mel_bins, chunk_frames]``,
                ``valid_frames`` ``[B]``.

        Returns:
            ``[sum_i num_tokens(item_i), hidden_size]``: each item's first ``num_tokens`` pooled and
            projected rows, concatenated in item order (dtype of the projector).
        """
        param = self.projector.weight
        feats = batch["input_features"].to(device=param.device, dtype=next(self.whisper.parameters()).dtype)
        if self.frozen:
            with torch.no_grad():
                hidden = self.whisper(input_features=feats).last_hidden_state  # [B, P, d_model]
        else:
            hidden = self.whisper(input_features=feats).last_hidden_state
        pooled = F.avg_pool1d(hidden.transpose(1, 2), kernel_size=self.pool, stride=self.pool, ceil_mode=True).transpose(1, 2)
        ntok = self.batch_num_tokens(batch["valid_frames"].to(device=pooled.device, dtype=torch.long))
        keep = torch.arange(pooled.shape[1], device=pooled.device)[None, :] < ntok[:, None]  # [B, P/pool]
        return self.projector(pooled[keep].to(param.dtype))

    # ---- checkpoints -------------------------------------------------------------------------

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write a folder that :func:`build` loads back with ``options["checkpoint"] = path``.

        Files: ``config.json`` + ``model.safetensors`` (the ``WhisperEncoder`` in transformers'
        format, ``WhisperEncoder.from_pretrained`` loads it), ``preprocessor_config.json`` (the
        feature extractor) and ``omnicore_extra.safetensors`` (:func:`omnicore.api.save_extra_weights`:
        the projector's ``weight`` ``[H, d_model]`` and ``bias`` ``[H]``, with ``chunk_seconds``,
        ``pool``, ``hidden_size`` and ``d_model`` recorded). Call it on an unsharded module.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.whisper.save_pretrained(str(out))
        self.feature_extractor.save_pretrained(str(out))
        save_extra_weights(
            out,
            self.projector,
            component=COMPONENT,
            chunk_seconds=self.chunk_seconds,
            pool=self.pool,
            hidden_size=self.hidden_size,
            d_model=int(self.whisper.config.d_model),
        )


# ---- factory ---------------------------------------------------------------------------------


def build(options: dict[str, Any], *, hidden_size: int) -> WhisperAudioEncoder:
    """The registry's factory: ``build(options, hidden_size=H)`` -> :class:`WhisperAudioEncoder`.

    With a checkpoint, the encoder is read by :func:`omnicore.api.load_hf_pretrained`
    (``WhisperEncoder.from_pretrained``, strict, the ``model.encoder.`` / ``encoder.`` prefix of a
    full model stripped), its position embeddings cut to ``chunk_seconds``, and the projector read
    from ``omnicore_extra.safetensors`` (:func:`omnicore.api.load_extra_weights`) when the folder has it.

    Args:
        options: a mapping valid for :class:`WhisperEncoderOptions` (validated again here).
        hidden_size: ``H``, the foundation's hidden size (width of the output rows).

    Returns:
        the encoder on CPU, float32, in training mode.

    Raises:
        ValueError: if the checkpoint folder does not exist, holds no Whisper ``config.json`` or no
            weights, or its weights lack an encoder tensor (named); if ``chunk_seconds`` does not give
            an even whole number of mel frames or needs more positions than the checkpoint has; if
            ``config`` contradicts the checkpoint's shapes; if a saved projector does not fit
            ``hidden_size`` (file and shapes named) or only an old ``projector.safetensors`` is there.
        pydantic.ValidationError: if ``options`` has unknown keys or bad values.
    """
    opts = WhisperEncoderOptions.model_validate(dict(options or {}))
    if int(hidden_size) <= 0:
        raise ValueError(f"whisper encoder: hidden_size must be positive, got {hidden_size}")
    if "max_source_positions" in opts.config:
        raise ValueError("whisper encoder: max_source_positions is set from chunk_seconds; remove it from options.config")
    ckpt = Path(opts.checkpoint).expanduser() if opts.checkpoint else None

    if ckpt is not None:
        overrides = {k: v for k, v in opts.config.items() if k not in _SHAPE_KEYS}
        whisper = load_hf_pretrained(
            WhisperEncoder, ckpt, config_overrides=overrides, prefixes=ENCODER_PREFIXES, what="whisper encoder", hint=_WHAT_TO_PUT
        )
        config = whisper.config
        for key in _SHAPE_KEYS:
            if key in opts.config and getattr(config, key) != opts.config[key]:
                raise ValueError(
                    f"whisper encoder: options.config[{key!r}] = {opts.config[key]!r} contradicts checkpoint {ckpt} "
                    f"({key} = {getattr(config, key)!r}); drop it or use a matching checkpoint"
                )
        fe_base = WhisperFeatureExtractor.from_pretrained(str(ckpt)) if (ckpt / "preprocessor_config.json").is_file() else None
    else:
        config = WhisperConfig(**opts.config)
        fe_base = None

    feature_extractor = _make_feature_extractor(fe_base, num_mel_bins=int(config.num_mel_bins), chunk_seconds=opts.chunk_seconds)
    positions = feature_extractor.nb_max_frames // 2
    if ckpt is not None:
        if positions > config.max_source_positions:
            max_s = config.max_source_positions * 2 * feature_extractor.hop_length / feature_extractor.sampling_rate
            raise ValueError(
                f"whisper encoder: chunk_seconds={opts.chunk_seconds} needs {positions} encoder positions but checkpoint "
                f"{ckpt} has {config.max_source_positions} (at most {max_s:g} s); lower chunk_seconds"
            )
        _keep_first_positions(whisper, positions)
    else:
        config.max_source_positions = positions
        whisper = WhisperEncoder(config)

    encoder = WhisperAudioEncoder(
        whisper,
        feature_extractor,
        hidden_size=int(hidden_size),
        chunk_seconds=opts.chunk_seconds,
        pool=opts.pool,
        freeze=opts.freeze,
        long_audio=opts.long_audio,
    )
    if ckpt is not None:
        meta = load_extra_weights(ckpt, encoder.projector, component=COMPONENT, required=False, legacy_files=LEGACY_FILES)
        for key, value in (("chunk_seconds", opts.chunk_seconds), ("pool", opts.pool)):
            if meta and key in meta and meta[key] != value:
                warnings.warn(
                    f"whisper encoder: {ckpt} was saved with {key}={meta[key]!r} but options give {value!r}; "
                    "the options win (token counts and pooled rows differ from training)",
                    stacklevel=2,
                )
    return encoder.train()  # from_pretrained leaves a loaded encoder in eval mode


def _keep_first_positions(whisper: WhisperEncoder, positions: int) -> None:
    """Cut the (fixed, sinusoidal) position embeddings to the first ``positions`` rows.

    A checkpoint made for 30 s chunks (1500 positions) serves shorter chunks this way; Whisper's
    encoder requires exactly ``2 * max_source_positions`` mel frames, so the config follows.
    """
    if whisper.config.max_source_positions == positions:
        return
    rows = whisper.embed_positions.weight.detach()[:positions].clone()
    whisper.embed_positions = nn.Embedding.from_pretrained(rows, freeze=True)
    whisper.config.max_source_positions = positions
    whisper.max_source_positions = positions


def _make_feature_extractor(base: WhisperFeatureExtractor | None, *, num_mel_bins: int, chunk_seconds: float) -> WhisperFeatureExtractor:
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
