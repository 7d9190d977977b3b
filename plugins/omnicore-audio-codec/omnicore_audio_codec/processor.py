"""The data side of ``decoder/encodec``: options, target waveforms, code counts and batching.

Imports no model code (only transformers' ``EncodecConfig``, a configuration class), so data workers
build :class:`CodecProcessor` with :func:`build_processor` from the options alone: a checkpoint
folder's ``config.json`` and the metadata of its ``omnicore_extra.safetensors`` are read, never its
weights. :class:`omnicore_audio_codec.decoder.EncodecAudioDecoder` holds the same processor and
delegates to it.

The code count (the one formula shared by data and model, see the decoder module for the layout):
``num_tokens = ceil(num_samples / hop_length) * n_q``, where ``hop_length`` is the product of the
codec's ``upsampling_ratios`` (EnCodec's encoder strides) and ``n_q`` the codebooks used at the
chosen bandwidth.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from omnicore.api import Audio, collate_waveforms, load_extra_weights, target_waveform

COMPONENT = "decoder/encodec"
"""The component name recorded with the LM adapter in ``omnicore_extra.safetensors``."""
CODEC_CONFIG_FILE = "config.json"
OUTPUT_RATE = 16_000
"""Sample rate in Hz of the :class:`omnicore.api.Audio` that ``decode`` returns."""
DEFAULT_MAX_SECONDS = 1.0
DEFAULT_NUM_QUANTIZERS = 2

DEFAULT_CONFIG: dict[str, Any] = {
    "sampling_rate": 16_000,
    "audio_channels": 1,
    "num_filters": 8,
    "hidden_size": 32,
    "codebook_size": 256,
    "upsampling_ratios": [8, 5, 4, 2],
    "num_lstm_layers": 1,
    "num_residual_layers": 1,
    "normalize": False,
}
"""The tiny from-scratch EnCodec used when ``options.config`` leaves a key out (0.67 M parameters):
16 kHz mono, hop 320 samples (50 frames per second), 32-d latents, codebooks of 256 entries;
``num_quantizers`` (default 2) sets ``target_bandwidths``. One second of audio is 50 x 2 = 100 codes."""

WHAT_TO_PUT = (
    "options.checkpoint must be a transformers EncodecModel folder (config.json with model_type 'encodec' + "
    "model.safetensors), as EncodecModel.save_pretrained, EncodecAudioDecoder.save_pretrained or "
    "`python -m omnicore_audio_codec.fit` write it (e.g. a local copy of facebook/encodec_24khz)"
)


class EncodecOptions(BaseModel):
    """Options of ``decoder/encodec`` (validated by the registry before the factory is called).

    Raises:
        pydantic.ValidationError: on unknown keys, or when both ``checkpoint`` and ``config`` are given.
    """

    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = Field(
        None,
        description=(
            "Local folder holding a transformers EncodecModel (config.json + model.safetensors), e.g. a copy of "
            "facebook/encodec_24khz, a folder written by `python -m omnicore_audio_codec.fit`, or one written by "
            "EncodecAudioDecoder.save_pretrained (then the LM adapter is restored too). None: build from 'config'."
        ),
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "EncodecConfig keyword arguments for a from-scratch codec; missing keys come from DEFAULT_CONFIG. "
            "The extra key num_quantizers (default 2) sets target_bandwidths to the one bandwidth that uses that many "
            "codebooks. audio_channels must be 1, normalize false and chunk_length_s unset."
        ),
    )
    bandwidth: float | None = Field(
        None,
        gt=0,
        description=(
            "Target bandwidth in kbps, one of the codec's target_bandwidths; it sets the codebooks used per frame "
            "(n_q = floor(bandwidth * 1000 / (log2(codebook_size) * frame_rate)), as EnCodec does). None: the one "
            "saved with the checkpoint's LM adapter, else the smallest of target_bandwidths (transformers' default)."
        ),
    )
    max_seconds: float | None = Field(
        None,
        gt=0,
        description=(
            "Every target clip is padded with silence to this many seconds, so every item has the same number of codes "
            "(generation writes exactly that many: dummy_codes()). None: the value saved with the checkpoint's LM "
            "adapter, else 1.0."
        ),
    )
    long_audio: Literal["refuse", "crop"] = Field(
        "refuse",
        description=(
            "A target clip longer than max_seconds: refuse = a bad sample naming its duration and max_seconds "
            "(data.on_error: skip counts it); crop = keep its first max_seconds."
        ),
    )
    freeze_codec: bool = Field(
        True,
        description="Keep the codec frozen (a fixed tokenizer during LM training); only the code embedding and the head train.",
    )
    codebooks: Literal["flat", "depth"] | None = Field(
        None,
        description=(
            "How a frame's n_q codes reach the LM. flat: one LM position per code, frame by frame (n_q positions a "
            "frame). depth: one LM position per frame (the sum of its codes' embeddings); the LM head scores codebook 0 "
            "and a depth decoder (omnicore.api.DepthOptions, option 'depth') the others. None: the layout saved with the "
            "checkpoint's LM adapter, else flat."
        ),
    )
    depth: dict[str, Any] | None = Field(
        None,
        description="Sizes of the depth decoder (codebooks: depth): omnicore.api.DepthOptions keys (layers, hidden_size, heads, ...).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> EncodecOptions:
        if self.checkpoint is not None and self.config:
            raise ValueError("give either 'checkpoint' (a folder to load) or 'config' (a codec to build), not both")
        return self


def bandwidth_for(num_quantizers: int, codebook_size: int, frame_rate: int) -> float:
    """The bandwidth in kbps at which EnCodec uses exactly ``num_quantizers`` codebooks:
    ``n_q * log2(codebook_size) * frame_rate / 1000``, nudged up by float steps until both of the
    library's formulas (``EncodecConfig.num_quantizers`` and the quantizer's
    ``get_num_quantizers_for_bandwidth``) give ``n_q`` back."""
    bits = math.ceil(math.log2(codebook_size))
    bw = num_quantizers * bits * frame_rate / 1000
    for _ in range(64):
        if int(1000 * bw // (frame_rate * bits)) == num_quantizers == math.floor(bw * 1000 / (bits * frame_rate)):
            return bw
        bw = math.nextafter(bw, math.inf)
    raise ValueError(f"no bandwidth gives {num_quantizers} codebooks of {codebook_size} at {frame_rate} frames/s")


def make_codec_config(config: dict[str, Any] | None = None) -> Any:
    """Complete user ``config`` into a transformers ``EncodecConfig`` (see :data:`DEFAULT_CONFIG`).

    ``num_quantizers`` (not an ``EncodecConfig`` key) sets ``target_bandwidths`` to
    ``[bandwidth_for(num_quantizers, ...)]``; it defaults to 2 unless ``target_bandwidths`` is given.

    Raises:
        ValueError: if both ``num_quantizers`` and ``target_bandwidths`` are given, ``num_quantizers`` < 1,
            or the config is not a mono, unnormalised, unchunked codec (:func:`check_codec_config`).
    """
    from transformers import EncodecConfig

    user = dict(config or {})
    n_q = user.pop("num_quantizers", None)
    if n_q is not None and "target_bandwidths" in user:
        raise ValueError("options.config: give num_quantizers or target_bandwidths, not both")
    if n_q is not None and int(n_q) < 1:
        raise ValueError(f"options.config.num_quantizers must be >= 1, got {n_q}")
    cfg = EncodecConfig(**{**DEFAULT_CONFIG, **user})
    if "target_bandwidths" not in user:
        cfg.target_bandwidths = [bandwidth_for(int(n_q or DEFAULT_NUM_QUANTIZERS), cfg.codebook_size, cfg.frame_rate)]
    check_codec_config(cfg, "options.config")
    return cfg


def check_codec_config(cfg: Any, where: str) -> None:
    """Raise ValueError (naming ``where``) unless ``cfg`` is a codec this decoder handles: one audio
    channel, ``normalize`` false (a per-clip scale would be a second, continuous output), no
    ``chunk_length_s`` (one frame sequence per clip), and a codebook size that is a power of 2."""
    problems = []
    if cfg.audio_channels != 1:
        problems.append(f"audio_channels={cfg.audio_channels} (must be 1: speech is mono here)")
    if cfg.normalize:
        problems.append("normalize=true (must be false: the per-clip scale it needs is not a code)")
    if cfg.chunk_length_s is not None:
        problems.append(f"chunk_length_s={cfg.chunk_length_s} (must be unset: one frame sequence per clip)")
    if cfg.codebook_size < 2 or cfg.codebook_size & (cfg.codebook_size - 1):
        problems.append(f"codebook_size={cfg.codebook_size} (must be a power of 2)")
    if problems:
        raise ValueError(f"{where}: this EnCodec cannot be used as an audio decoder: {'; '.join(problems)}")


def num_quantizers_at(cfg: Any, bandwidth: float | None) -> tuple[float, int]:
    """``(bandwidth, n_q)``: the bandwidth (``None``: the smallest target bandwidth) and the codebooks
    EnCodec uses at it, ``floor(bandwidth * 1000 / (log2(codebook_size) * frame_rate))`` (at least 1).

    Raises:
        ValueError: if ``bandwidth`` is not one of ``cfg.target_bandwidths``.
    """
    targets = [float(b) for b in cfg.target_bandwidths]
    bw = targets[0] if bandwidth is None else float(bandwidth)
    if bw not in targets:
        raise ValueError(f"options.bandwidth={bandwidth}: this codec supports the target bandwidths {targets} (kbps)")
    bits_per_frame = math.log2(cfg.codebook_size) * cfg.frame_rate
    return bw, int(max(1, math.floor(bw * 1000 / bits_per_frame)))


class CodecProcessor:
    """The :class:`omnicore.components.Processor` of ``decoder/encodec`` (picklable, no weights).

    Attributes:
        modality: ``"audio"``.
        sample_rate: the codec's rate in Hz; targets are resampled to it.
        hop_length: samples per frame (the product of the encoder strides).
        num_quantizers: n_q, codes per frame.
        codebooks: ``"flat"`` (n_q LM positions a frame) or ``"depth"`` (one; see :class:`EncodecOptions`).
        codes_per_token: the codes trained at each LM position: n_q with ``"depth"``, else 1.
        max_seconds: targets are padded with silence to ``max_samples = round(max_seconds * sample_rate)``.
        long_audio: ``"refuse"`` or ``"crop"`` (see :class:`EncodecOptions`).
    """

    modality = "audio"

    def __init__(
        self,
        *,
        sample_rate: int,
        hop_length: int,
        num_quantizers: int,
        max_seconds: float,
        long_audio: str = "refuse",
        codebooks: str = "flat",
    ) -> None:
        self.sample_rate = int(sample_rate)
        self.hop_length = int(hop_length)
        self.num_quantizers = int(num_quantizers)
        self.codebooks = codebooks
        self.codes_per_token = self.num_quantizers if codebooks == "depth" else 1
        self.max_seconds = float(max_seconds)
        self.long_audio = long_audio
        self.max_samples = max(1, round(self.max_seconds * self.sample_rate))

    def frames(self, num_samples: int) -> int:
        """EnCodec frames for ``num_samples`` samples: ``ceil(num_samples / hop_length)``."""
        return -(-int(num_samples) // self.hop_length)

    def preprocess(self, media: Audio) -> dict[str, torch.Tensor]:
        """One clip -> ``{"input_values": float32 [max_samples]}`` at :attr:`sample_rate`, in [-1, 1].

        The clip is resampled (soxr, :func:`omnicore.api.resample`), clipped to [-1, 1] and padded
        at the end with zeros (silence) to ``max_samples``.

        Raises:
            TypeError: if ``media`` is not an :class:`omnicore.api.Audio`.
            ValueError: if the samples are not 1-D, the rate is not positive, or the clip is longer
                than ``max_seconds`` with ``long_audio="refuse"`` (duration and limit named).
        """
        return target_waveform(media, self.sample_rate, self.max_seconds, self.long_audio, "encodec decoder")

    def num_tokens(self, features: dict[str, Any]) -> int:
        """LM positions of ``input_values`` ``[num_samples]``: ``ceil(num_samples / hop_length)``
        frames, times n_q when flattened."""
        return self.frames(features["input_values"].shape[-1]) * (self.num_quantizers if self.codebooks == "flat" else 1)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """``{"input_values": [B, L] (zero-padded to the longest), "num_samples": long [B]}``.

        Raises:
            ValueError: on an empty list.
        """
        return collate_waveforms(items, "encodec decoder")


def read_codec_config(folder: str | Path) -> Any:
    """The ``EncodecConfig`` of a checkpoint folder's ``config.json`` (no weights read).

    Raises:
        ValueError: naming the folder or file and what to put there, if it is missing, unreadable or
            not an EnCodec config, or the codec is not usable (:func:`check_codec_config`).
    """
    from transformers import EncodecConfig

    folder = Path(folder).expanduser()
    file = folder / CODEC_CONFIG_FILE
    if not folder.is_dir():
        raise ValueError(f"encodec decoder: checkpoint folder {folder} does not exist; {WHAT_TO_PUT}")
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"encodec decoder: cannot read {file}: {exc}; {WHAT_TO_PUT}") from exc
    if data.get("model_type") != "encodec":
        raise ValueError(f"encodec decoder: {file} has model_type {data.get('model_type')!r}, not 'encodec'; {WHAT_TO_PUT}")
    cfg = EncodecConfig.from_pretrained(str(folder), local_files_only=True)
    check_codec_config(cfg, str(file))
    return cfg


def layout_of(opts: EncodecOptions, meta: dict[str, Any] | None) -> str:
    """``"flat"`` or ``"depth"``: the option, else the layout saved with the LM adapter (a depth
    decoder records ``num_codebooks``), else flat."""
    if opts.codebooks is not None:
        return opts.codebooks
    return "depth" if (meta or {}).get("num_codebooks", 1) > 1 else "flat"


def resolve(opts: EncodecOptions) -> tuple[Any, dict[str, Any] | None, float, float]:
    """``(EncodecConfig, saved adapter meta or None, bandwidth, max_seconds)`` of validated options:
    an explicit option wins, then the value saved with a checkpoint's LM adapter, then the default."""
    meta = None
    if opts.checkpoint is None:
        cfg = make_codec_config(opts.config)
    else:
        cfg = read_codec_config(opts.checkpoint)
        meta = load_extra_weights(Path(opts.checkpoint).expanduser(), None, component=COMPONENT, required=False)
    saved = meta or {}
    bandwidth, _ = num_quantizers_at(cfg, opts.bandwidth if opts.bandwidth is not None else saved.get("bandwidth"))
    max_seconds = opts.max_seconds or saved.get("max_seconds") or DEFAULT_MAX_SECONDS
    return cfg, meta, bandwidth, float(max_seconds)


def processor_for(cfg: Any, bandwidth: float, max_seconds: float, long_audio: str, codebooks: str = "flat") -> CodecProcessor:
    """The :class:`CodecProcessor` of a resolved codec config."""
    _, n_q = num_quantizers_at(cfg, bandwidth)
    return CodecProcessor(
        sample_rate=cfg.sampling_rate,
        hop_length=cfg.hop_length,
        num_quantizers=n_q,
        max_seconds=max_seconds,
        long_audio=long_audio,
        codebooks=codebooks,
    )


def build_processor(options: dict[str, Any]) -> CodecProcessor:
    """The processor factory of ``decoder/encodec`` (``ComponentSpec.processor``): options to a
    :class:`CodecProcessor`, resolved as the decoder's factory resolves them (:func:`resolve`).

    Raises:
        ValueError: on a bad checkpoint folder or config, or a bandwidth the codec lacks.
        pydantic.ValidationError: on invalid options.
    """
    opts = EncodecOptions.model_validate(dict(options or {}))
    cfg, meta, bandwidth, max_seconds = resolve(opts)
    return processor_for(cfg, bandwidth, max_seconds, opts.long_audio, layout_of(opts, meta))
