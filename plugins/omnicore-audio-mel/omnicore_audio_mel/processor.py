"""The data side of ``decoder/mel_rvq``: its options, and target audio -> features, frames, batches.

No model code: a folder's ``config.json`` (:func:`omnicore_audio_mel.config.read_config`) and the
settings saved with an LM adapter are all it reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from omnicore.api import Audio, collate_waveforms, load_extra_weights, target_waveform
from omnicore_audio_mel.config import MelRVQConfig, read_config

COMPONENT = "decoder/mel_rvq"
"""The component name recorded with the LM adapter in ``omnicore_extra.safetensors``."""
OUTPUT_RATE = 16_000
"""Sample rate in Hz of the :class:`omnicore.api.Audio` that ``decode`` returns."""
DEFAULT_MAX_SECONDS = 1.0


class MelOptions(BaseModel):
    """Options of ``decoder/mel_rvq`` (validated by the registry before the factory is called).

    Raises:
        pydantic.ValidationError: on unknown keys, or when both ``checkpoint`` and ``config`` are given.
    """

    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = Field(
        None,
        description=(
            "Local MelRVQ folder (config.json + model.safetensors), as `python -m omnicore_audio_mel.fit` or "
            "MelAudioDecoder.save_pretrained (then the LM adapter is restored too) write it. None: build from 'config'."
        ),
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "MelRVQConfig keys of a from-scratch tokenizer whose codebooks are drawn by torch's RNG (for tests; "
            "fit a real one with `python -m omnicore_audio_mel.fit`); missing keys take MelRVQConfig's defaults."
        ),
    )
    num_codebooks: int | None = Field(
        None,
        ge=1,
        description=(
            "Codes per frame k: the first k of the tokenizer's K residual codebooks (a fit of K holds the fits of fewer). "
            "With k > 1 a frame is one LM position (the sum of its codes' embeddings), the LM head scores codebook 0 and "
            "a depth decoder the rest. None: the value saved with the checkpoint's LM adapter, else K."
        ),
    )
    depth: dict[str, Any] | None = Field(
        None,
        description="Sizes of the depth decoder (k > 1): omnicore.api.DepthOptions keys (layers, hidden_size, heads, ...).",
    )
    max_seconds: float | None = Field(
        None,
        gt=0,
        description=(
            "Every target clip is padded with silence to this many seconds, so every item has the same number of frames "
            "(generation writes that many: dummy_codes()). None: the value saved with the checkpoint's LM adapter, else 1.0."
        ),
    )
    long_audio: Literal["refuse", "crop"] = Field(
        "refuse",
        description=(
            "A target clip longer than max_seconds: refuse = a bad sample naming its duration and max_seconds "
            "(data.on_error: skip counts it); crop = keep its first max_seconds."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> MelOptions:
        if self.checkpoint is not None and self.config:
            raise ValueError("give either 'checkpoint' (a folder to load) or 'config' (a tokenizer to build), not both")
        return self


class MelProcessor:
    """The :class:`omnicore.components.Processor` of ``decoder/mel_rvq`` (picklable, no weights).

    Attributes:
        modality: ``"audio"``.
        config: the tokenizer's :class:`MelRVQConfig` (sample rate, STFT, stacking).
        num_codebooks: k, codes per frame; ``codes_per_token``: the same (every LM position is a frame).
        max_seconds: targets are padded with silence to ``max_samples = round(max_seconds * sample_rate)``.
        long_audio: ``"refuse"`` or ``"crop"`` (see :class:`MelOptions`).
    """

    modality = "audio"

    def __init__(self, config: MelRVQConfig, *, num_codebooks: int, max_seconds: float, long_audio: str = "refuse") -> None:
        self.config = config
        self.sample_rate = config.sample_rate
        self.num_codebooks = int(num_codebooks)
        self.codes_per_token = self.num_codebooks
        self.max_seconds = float(max_seconds)
        self.long_audio = long_audio
        self.max_samples = max(1, round(self.max_seconds * self.sample_rate))

    def frames(self, num_samples: int) -> int:
        """Code frames of ``num_samples`` samples (:meth:`MelRVQConfig.num_frames`)."""
        return self.config.num_frames(num_samples)

    def preprocess(self, media: Audio) -> dict[str, torch.Tensor]:
        """One clip -> ``{"input_values": float32 [max_samples]}`` at the tokenizer's rate, in [-1, 1]:
        resampled (soxr, :func:`omnicore.api.resample`), clipped and padded at the end with silence.

        Raises:
            TypeError: if ``media`` is not an :class:`omnicore.api.Audio`.
            ValueError: if the samples are not 1-D, the rate is not positive, or the clip is longer
                than ``max_seconds`` with ``long_audio="refuse"`` (duration and limit named).
        """
        return target_waveform(media, self.sample_rate, self.max_seconds, self.long_audio, "mel_rvq decoder")

    def num_tokens(self, features: dict[str, Any]) -> int:
        """LM positions of ``input_values`` ``[num_samples]``: its code frames (one position per frame)."""
        return self.frames(features["input_values"].shape[-1])

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """``{"input_values": [B, L] (zero-padded to the longest), "num_samples": long [B]}``.

        Raises:
            ValueError: on an empty list.
        """
        return collate_waveforms(items, "mel_rvq decoder")


def resolve(opts: MelOptions) -> tuple[MelRVQConfig, dict[str, Any] | None, int, float]:
    """``(tokenizer config, saved adapter meta or None, codes per frame k, max_seconds)`` of validated
    options: an explicit option wins, then the value saved with a checkpoint's LM adapter, then the default.

    Raises:
        ValueError: on a bad checkpoint folder or config (:func:`read_config`), or ``num_codebooks``
            above the tokenizer's K.
    """
    from pydantic import ValidationError

    meta = None
    if opts.checkpoint is None:
        try:
            config = MelRVQConfig.model_validate(opts.config)
        except ValidationError as exc:
            fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"options.config: {fields}") from exc
    else:
        config = read_config(opts.checkpoint)
        meta = load_extra_weights(Path(opts.checkpoint).expanduser(), None, component=COMPONENT, required=False)
    saved = meta or {}
    k = int(opts.num_codebooks or saved.get("codebooks_used") or config.num_codebooks)
    if k > config.num_codebooks:
        raise ValueError(f"options.num_codebooks={k}: the tokenizer has {config.num_codebooks} codebooks")
    max_seconds = opts.max_seconds or saved.get("max_seconds") or DEFAULT_MAX_SECONDS
    return config, meta, k, float(max_seconds)


def build_processor(options: dict[str, Any]) -> MelProcessor:
    """The processor factory of ``decoder/mel_rvq`` (``ComponentSpec.processor``): options to a
    :class:`MelProcessor`, resolved as the decoder's factory resolves them (:func:`resolve`).

    Raises:
        ValueError: on a bad checkpoint folder or config, or too many codebooks.
        pydantic.ValidationError: on invalid options.
    """
    opts = MelOptions.model_validate(dict(options or {}))
    config, _, k, max_seconds = resolve(opts)
    return MelProcessor(config, num_codebooks=k, max_seconds=max_seconds, long_audio=opts.long_audio)
