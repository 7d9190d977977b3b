"""The Whisper audio encoder for omnicore: ``encoder/whisper``.

Pipeline for one clip (:class:`WhisperAudioEncoder`):

1. ``preprocess`` (data workers, CPU, no gradients): resample to the feature extractor's rate
   (16 kHz for every published Whisper) with :func:`omnicore.data.media.resample`, then 80 (or
   ``num_mel_bins``) log-mel bins every ``hop_length`` samples (160 at 16 kHz: 100 frames per
   second) with transformers' ``WhisperFeatureExtractor``; every clip is padded with silence, or
   truncated, to ``chunk_seconds``. The number of *valid* (unpadded) mel frames is kept.
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

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from transformers import WhisperConfig, WhisperFeatureExtractor
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from omnicore.api import Audio, resample

PROJECTOR_FILE = "projector.safetensors"
"""File name of the projector weights (``weight`` ``[hidden_size, d_model]``, ``bias`` ``[hidden_size]``)."""
META_FILE = "omnicore_encoder.json"
"""File name of omnicore's small description of a saved encoder (chunk_seconds, pool, hidden_size)."""

_SHAPE_KEYS = ("d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "num_mel_bins")


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
            "even whole number of frames (a multiple of 0.02 s). Audio beyond it is dropped."
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
            Whisper's log-mel spectrogram of the clip padded with silence (or truncated) to
            ``chunk_seconds``, and the number of mel frames that cover real audio,
            ``min(ceil(num_samples_16k / hop_length), chunk_frames)``.

        Raises:
            ValueError: if the samples are not one-dimensional or the sample rate is not positive.
        """
        samples = np.asarray(media.samples)
        if samples.ndim != 1:
            raise ValueError(f"whisper encoder expects mono audio of shape [num_samples]; got shape {samples.shape}")
        if int(media.sample_rate) <= 0:
            raise ValueError(f"whisper encoder: sample_rate must be a positive number of Hz, got {media.sample_rate}")
        audio = resample(Audio(samples=samples.astype(np.float32, copy=False), sample_rate=int(media.sample_rate)), self.sampling_rate)
        wave = np.asarray(audio.samples, dtype=np.float32)
        if wave.shape[0] == 0:
            wave = np.zeros(1, dtype=np.float32)
            valid = 0
        else:
            valid = min(-(-wave.shape[0] // self.hop_length), self.chunk_frames)
        feats = self.feature_extractor(
            wave,
            sampling_rate=self.sampling_rate,
            padding="max_length",
            max_length=self.chunk_samples,
            truncation=True,
            return_tensors="np",
        )["input_features"][0]
        if feats.shape != (self.feature_extractor.feature_size, self.chunk_frames):  # pragma: no cover - guards transformers changes
            raise RuntimeError(f"unexpected log-mel shape {feats.shape}; expected ({self.feature_extractor.feature_size}, {self.chunk_frames})")
        return {
            "input_features": torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32)),
            "valid_frames": torch.tensor(valid, dtype=torch.long),
        }

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Placeholder tokens for one item: :func:`num_tokens_for_frames` of its ``valid_frames``.

        Depends only on the valid (unpadded) audio length, never on the padding.
        """
        return num_tokens_for_frames(int(features["valid_frames"]), self.pool)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack items in order: ``input_features`` ``[B, num_mel_bins, chunk_frames]``, ``valid_frames`` ``[B]``.

        Raises:
            ValueError: if ``items`` is empty or the items' feature shapes differ.
        """
        if not items:
            raise ValueError("whisper encoder: collate() needs at least one item")
        shapes = {tuple(it["input_features"].shape) for it in items}
        if len(shapes) != 1:
            raise ValueError(f"whisper encoder: items have different feature shapes {sorted(shapes)}; preprocess them with the same encoder")
        return {
            "input_features": torch.stack([torch.as_tensor(it["input_features"]) for it in items]),
            "valid_frames": torch.stack([torch.as_tensor(it["valid_frames"], dtype=torch.long).reshape(()) for it in items]),
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
        feature extractor), ``projector.safetensors`` (``weight`` ``[H, d_model]``, ``bias`` ``[H]``)
        and ``omnicore_encoder.json`` (``chunk_seconds``, ``pool``, ``hidden_size``).
        """
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.whisper.save_pretrained(str(out))
        self.feature_extractor.save_pretrained(str(out))
        save_file({k: v.detach().cpu().contiguous() for k, v in self.projector.state_dict().items()}, str(out / PROJECTOR_FILE))
        meta = {
            "format": "omnicore-audio-whisper",
            "format_version": 1,
            "chunk_seconds": self.chunk_seconds,
            "pool": self.pool,
            "hidden_size": self.hidden_size,
            "d_model": int(self.whisper.config.d_model),
        }
        (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


# ---- factory ---------------------------------------------------------------------------------


def build(options: dict[str, Any], *, hidden_size: int) -> WhisperAudioEncoder:
    """The registry's factory: ``build(options, hidden_size=H)`` -> :class:`WhisperAudioEncoder`.

    Args:
        options: a mapping valid for :class:`WhisperEncoderOptions` (validated again here).
        hidden_size: ``H``, the foundation's hidden size (width of the output rows).

    Raises:
        ValueError: if the checkpoint folder does not exist, holds no Whisper ``config.json`` or no
            Whisper encoder weights; if ``chunk_seconds`` does not give an even whole number of mel
            frames or needs more positions than the checkpoint has; if ``config`` contradicts the
            checkpoint's shapes; if a saved projector does not fit ``hidden_size``.
        pydantic.ValidationError: if ``options`` has unknown keys or bad values.
    """
    opts = WhisperEncoderOptions.model_validate(dict(options or {}))
    if int(hidden_size) <= 0:
        raise ValueError(f"whisper encoder: hidden_size must be positive, got {hidden_size}")
    ckpt = Path(opts.checkpoint).expanduser() if opts.checkpoint else None
    if ckpt is not None:
        _check_checkpoint_dir(ckpt)
        fe_base = WhisperFeatureExtractor.from_pretrained(str(ckpt)) if (ckpt / "preprocessor_config.json").is_file() else None
    else:
        fe_base = None

    # Configuration of the backbone.
    if ckpt is not None:
        config = WhisperConfig.from_pretrained(str(ckpt))
        ckpt_positions = int(config.max_source_positions)
        for key, value in opts.config.items():
            if key == "max_source_positions":
                raise ValueError("whisper encoder: max_source_positions is set from chunk_seconds; remove it from options.config")
            if key in _SHAPE_KEYS and getattr(config, key) != value:
                raise ValueError(
                    f"whisper encoder: options.config[{key!r}] = {value!r} contradicts checkpoint {ckpt} "
                    f"({key} = {getattr(config, key)!r}); drop it or use a matching checkpoint"
                )
            setattr(config, key, value)
    else:
        if "max_source_positions" in opts.config:
            raise ValueError("whisper encoder: max_source_positions is set from chunk_seconds; remove it from options.config")
        config = WhisperConfig(**opts.config)
        ckpt_positions = None

    feature_extractor = _make_feature_extractor(fe_base, num_mel_bins=int(config.num_mel_bins), chunk_seconds=opts.chunk_seconds)
    positions = feature_extractor.nb_max_frames // 2
    if ckpt_positions is not None and positions > ckpt_positions:
        max_s = ckpt_positions * 2 * feature_extractor.hop_length / feature_extractor.sampling_rate
        raise ValueError(
            f"whisper encoder: chunk_seconds={opts.chunk_seconds} needs {positions} encoder positions but checkpoint "
            f"{ckpt} has {ckpt_positions} (at most {max_s:g} s); lower chunk_seconds"
        )
    config.max_source_positions = positions

    whisper = WhisperEncoder(config)
    if ckpt is not None:
        _load_encoder_weights(whisper, ckpt)
    encoder = WhisperAudioEncoder(
        whisper, feature_extractor, hidden_size=int(hidden_size), chunk_seconds=opts.chunk_seconds, pool=opts.pool, freeze=opts.freeze
    )
    if ckpt is not None:
        _load_omnicore_extras(encoder, ckpt, opts)
    return encoder


def _check_checkpoint_dir(ckpt: Path) -> None:
    what = (
        "a folder written by WhisperAudioEncoder.save_pretrained, or a Hugging Face Whisper checkpoint "
        "(config.json with model_type 'whisper' plus model.safetensors) as WhisperModel.save_pretrained writes it"
    )
    if not ckpt.is_dir():
        raise ValueError(f"whisper encoder: checkpoint folder {ckpt} does not exist; point options.checkpoint at {what}")
    cfg_file = ckpt / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"whisper encoder: checkpoint folder {ckpt} has no config.json; it must hold {what}")
    try:
        model_type = json.loads(cfg_file.read_text()).get("model_type")
    except (OSError, ValueError) as exc:
        raise ValueError(f"whisper encoder: cannot read {cfg_file}: {exc}; the folder must hold {what}") from exc
    if model_type != "whisper":
        raise ValueError(
            f"whisper encoder: {cfg_file} is not a Whisper config (model_type={model_type!r}); the folder must hold {what}"
        )


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


def _read_state_dict(ckpt: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder: model.safetensors, sharded safetensors, or pytorch_model.bin."""
    from safetensors.torch import load_file

    single = ckpt / "model.safetensors"
    index = ckpt / "model.safetensors.index.json"
    binary = ckpt / "pytorch_model.bin"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(ckpt / shard)))
        return state
    if binary.is_file():
        return torch.load(str(binary), map_location="cpu", weights_only=True)
    raise ValueError(
        f"whisper encoder: checkpoint folder {ckpt} has config.json but no weights "
        "(model.safetensors, model.safetensors.index.json + shards, or pytorch_model.bin)"
    )


def _load_encoder_weights(whisper: WhisperEncoder, ckpt: Path) -> None:
    """Load the encoder part of any Whisper checkpoint into ``whisper`` (strict).

    ``WhisperEncoder.from_pretrained`` on a ``WhisperModel`` folder (keys ``encoder.*``) or a
    ``WhisperForConditionalGeneration`` folder (keys ``model.encoder.*``) finds none of its keys and
    leaves a randomly initialised encoder with only a warning, so the prefix is found here from the
    key of the first convolution (only the encoder has ``conv1``). Position embeddings longer than
    ``max_source_positions`` (a 30 s checkpoint used with shorter chunks) are cut to the first rows.
    """
    state = _read_state_dict(ckpt)
    conv_keys = [k for k in state if k == "conv1.weight" or k.endswith(".conv1.weight")]
    if len(conv_keys) != 1:
        raise ValueError(f"whisper encoder: no (or several) Whisper encoders in the weights of {ckpt} (keys ending in conv1.weight: {conv_keys})")
    prefix = conv_keys[0][: -len("conv1.weight")]
    enc_state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    pos_key = "embed_positions.weight"
    if pos_key in enc_state:
        enc_state[pos_key] = enc_state[pos_key][: whisper.config.max_source_positions]
    missing, unexpected = whisper.load_state_dict(enc_state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"whisper encoder: the encoder weights in {ckpt} (prefix {prefix!r}) do not match its config: "
            f"missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}"
        )


def _load_omnicore_extras(encoder: WhisperAudioEncoder, ckpt: Path, opts: WhisperEncoderOptions) -> None:
    """Restore the projector of a folder written by save_pretrained; check its chunk/pool settings."""
    from safetensors.torch import load_file

    meta_file = ckpt / META_FILE
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        for key, value in (("chunk_seconds", opts.chunk_seconds), ("pool", opts.pool)):
            if key in meta and meta[key] != value:
                warnings.warn(
                    f"whisper encoder: {ckpt} was saved with {key}={meta[key]!r} but options give {value!r}; "
                    "the options win (token counts and pooled rows differ from training)",
                    stacklevel=3,
                )
    proj_file = ckpt / PROJECTOR_FILE
    if proj_file.is_file():
        proj = load_file(str(proj_file))
        expected = tuple(encoder.projector.weight.shape)
        if tuple(proj.get("weight", torch.empty(0)).shape) != expected:
            raise ValueError(
                f"whisper encoder: {proj_file} holds a projector of shape {tuple(proj['weight'].shape)} but "
                f"hidden_size={encoder.hidden_size} needs {expected}; remove the file to start a fresh projector"
            )
        encoder.projector.load_state_dict(proj)
