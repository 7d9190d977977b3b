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
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import WhisperConfig, WhisperFeatureExtractor
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from omnicore.api import Audio, load_extra_weights, load_hf_pretrained, save_extra_weights
from omnicore_audio_whisper.augment import SpecAugmentOptions, spec_augment, window_generators
from omnicore_audio_whisper.processor import (
    SHAPE_KEYS,
    WHAT_TO_PUT,
    WhisperAudioProcessor,
    WhisperEncoderOptions,
    make_feature_extractor,
    num_tokens_for_frames,
)

__all__ = ["WhisperAudioEncoder", "WhisperAudioProcessor", "WhisperEncoderOptions", "build", "num_tokens_for_frames"]

COMPONENT = "encoder/whisper"
"""The component name recorded with the projector in ``omnicore_extra.safetensors``."""
LEGACY_FILES = ("projector.safetensors", "omnicore_encoder.json")
"""What versions before the shared extra-weights format wrote instead (no longer read)."""
ENCODER_PREFIXES = ("model.encoder.", "encoder.")
"""Where published checkpoints keep the encoder: ``WhisperForConditionalGeneration`` under
``model.encoder.``, ``WhisperModel`` under ``encoder.``; a ``WhisperEncoder`` folder has no prefix."""


class WhisperAudioEncoder(nn.Module):
    """omnicore :class:`~omnicore.components.Encoder` for audio, built on Whisper's encoder.

    Attributes:
        modality: ``"audio"``.
        whisper: transformers' ``WhisperEncoder`` (``[B, num_mel_bins, chunk_frames]`` ->
            ``[B, chunk_frames / 2, d_model]``).
        projector: ``nn.Linear(d_model, hidden_size)``.
        processor: the data side (:class:`~omnicore_audio_whisper.processor.WhisperAudioProcessor`),
            the same one ``build_processor`` makes from the same options.
        feature_extractor: its ``WhisperFeatureExtractor`` set to ``chunk_seconds``.
        chunk_seconds: seconds per chunk; ``chunk_frames`` mel frames (100 per second at 16 kHz);
            ``chunk_samples`` samples at ``sampling_rate`` Hz.
        pool: average-pooling stride over encoder positions.
        hidden_size: ``H``, the width of the output rows.
        spec_augment: the SpecAugment masks drawn per clip in training mode
            (:class:`~omnicore_audio_whisper.augment.SpecAugmentOptions`; none by default).

    Build it with :func:`build` (the registry's factory) rather than directly.
    """

    modality = "audio"

    def __init__(
        self,
        whisper: WhisperEncoder,
        processor: WhisperAudioProcessor,
        *,
        hidden_size: int,
        freeze: bool = False,
    ) -> None:
        super().__init__()
        self.whisper = whisper
        self.projector = nn.Linear(whisper.config.d_model, hidden_size)
        self.processor = processor
        self.feature_extractor = processor.feature_extractor
        self.hidden_size = int(hidden_size)
        self.chunk_seconds = processor.chunk_seconds
        self.pool = processor.pool
        self.sampling_rate = processor.sampling_rate
        self.hop_length = processor.hop_length
        self.chunk_frames = processor.chunk_frames
        self.chunk_samples = processor.chunk_samples
        self.frozen = bool(freeze)
        self.long_audio = processor.long_audio
        self.spec_augment = SpecAugmentOptions()
        if freeze:
            self.whisper.requires_grad_(False)

    def dummy_batch(self) -> dict[str, torch.Tensor]:
        """A one-item batch of 0.5 s of silence at 16 kHz (7 tokens with ``pool=4``)."""
        return self.processor.collate(
            [self.processor.preprocess(Audio(np.zeros(self.sampling_rate // 2, dtype=np.float32), self.sampling_rate))]
        )

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
            projected rows, concatenated in item order (dtype of the projector). In training mode the
            features first get :attr:`spec_augment`'s masks (:func:`~omnicore_audio_whisper.augment.spec_augment`;
            none by default).
        """
        param = self.projector.weight
        feats = batch["input_features"].to(device=param.device, dtype=next(self.whisper.parameters()).dtype)
        if self.training:
            feats = spec_augment(feats, batch["valid_frames"], self.spec_augment, window_generators(batch, feats.shape[0]))
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
        overrides = {k: v for k, v in opts.config.items() if k not in SHAPE_KEYS}
        whisper = load_hf_pretrained(
            WhisperEncoder, ckpt, config_overrides=overrides, prefixes=ENCODER_PREFIXES, what="whisper encoder", hint=WHAT_TO_PUT
        )
        config = whisper.config
        for key in SHAPE_KEYS:
            if key in opts.config and getattr(config, key) != opts.config[key]:
                raise ValueError(
                    f"whisper encoder: options.config[{key!r}] = {opts.config[key]!r} contradicts checkpoint {ckpt} "
                    f"({key} = {getattr(config, key)!r}); drop it or use a matching checkpoint"
                )
        fe_base = WhisperFeatureExtractor.from_pretrained(str(ckpt)) if (ckpt / "preprocessor_config.json").is_file() else None
    else:
        config = WhisperConfig(**opts.config)
        fe_base = None

    feature_extractor = make_feature_extractor(fe_base, num_mel_bins=int(config.num_mel_bins), chunk_seconds=opts.chunk_seconds)
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

    processor = WhisperAudioProcessor(feature_extractor, chunk_seconds=opts.chunk_seconds, pool=opts.pool, long_audio=opts.long_audio)
    encoder = WhisperAudioEncoder(whisper, processor, hidden_size=int(hidden_size), freeze=opts.freeze)
    encoder.spec_augment = opts.spec_augment
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
