"""The data side of the CSM family: options, the checkpoint's token strings, and speech targets as
the checkpoint's Mimi codec counts their frames.

Imports no model code: :func:`build_processor` reads the checkpoint folder's ``config.json`` only
(the ``CsmConfig`` with its ``codec_config``), never its weights, so data workers build it from the
options alone.

A speech target of ``L`` samples at the codec's rate (24 kHz as published) is ``ceil(L / hop)``
Mimi frames, ``hop`` the codec's samples per frame (the product of its ``upsampling_ratios`` times
the ``latent_stride`` of its downsampling convolution: 1920 as published, 12.5 frames a second).
That is what ``MimiModel.get_encoded_length`` and ``CsmProcessor``'s count of ``<|AUDIO|>``
tokens give (every causal convolution of the encoder maps ``n`` samples to ``ceil(n / stride)``).
CSM follows the frames with one *audio end* frame whose ``K`` codes are all
``codebook_eos_token_id`` (0), at the position of ``<|audio_eos|>``: omnicore writes it as one more
frame placeholder, so a target takes ``ceil(L / hop) + 1`` placeholders (see README.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from omnicore.api import Audio, collate_waveforms, resample
from omnicore_family_csm.plugin import MODEL_TYPES
from omnicore_family_kit.checkpoint import checkpoint_folder as kit_checkpoint_folder
from omnicore_family_kit.options import CheckpointOptions

START = "<|end_of_text|>"
"""The token that ends a speaker's text in CSM's chat template and after which its audio starts:
the decoder's ``start`` token (a text target, and the token that opens the audio in generation)."""
PLACEHOLDER = "<|AUDIO|>"
"""CSM's audio token, written once per frame (``CsmProcessor.audio_token``)."""
AUDIO_EOS = "<|audio_eos|>"
"""CSM's token at the audio end frame; omnicore writes :data:`PLACEHOLDER` there (README.md)."""
WHAT_TO_PUT = (
    "point options.checkpoint at a CSM folder as published (sesame/csm-1b, or what CsmForConditionalGeneration.save_pretrained "
    "and CsmProcessor.save_pretrained write: config.json with model_type csm, model.safetensors, tokenizer and processor files)"
)


class CsmFoundationOptions(CheckpointOptions):
    """Options of ``foundation/csm``."""

    checkpoint: str = Field(
        description=(
            "A published CSM folder (config.json of CsmForConditionalGeneration with model_type csm, model.safetensors, "
            "tokenizer and processor files), or a Hub name in the local cache (e.g. sesame/csm-1b); its text embedding "
            "and backbone are loaded"
        )
    )


class CsmAudioOptions(CheckpointOptions):
    """Options of ``decoder/csm_audio``."""

    checkpoint: str = Field(
        description=(
            "A published CSM folder, or one written by this decoder's save_pretrained: its Mimi codec (codec_model), "
            "audio embedding (backbone_model.embed_tokens.embed_audio_tokens, tied to the depth decoder's), codebook-0 "
            "head (lm_head) and depth decoder (depth_decoder) are loaded"
        )
    )
    max_seconds: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds of speech one generated item holds at most: generation writes ceil(max_seconds x frame rate) frames "
            "plus the audio end frame, and decoding stops at the first audio end frame (all codes 0), as CSM's "
            "generate(output_audio=True) cuts its output"
        ),
    )


def checkpoint_folder(checkpoint: str, what: str) -> Path:
    """``checkpoint`` as a CSM folder: :func:`omnicore_family_kit.checkpoint.checkpoint_folder` of
    :data:`MODEL_TYPES` (ValueError naming ``what``, ending with :data:`WHAT_TO_PUT`)."""
    return kit_checkpoint_folder(checkpoint, what, MODEL_TYPES, WHAT_TO_PUT)


def read_config(folder: Path) -> Any:
    """The checkpoint's ``CsmConfig`` (``config.json`` only; its ``codec_config`` a ``MimiConfig``)."""
    from transformers import CsmConfig

    return CsmConfig.from_pretrained(str(folder))


def frame_size(codec_config: Any) -> int:
    """Samples per Mimi frame: ``prod(upsampling_ratios) x latent_stride`` (1920 as published)."""
    ratios = math.prod(int(r) for r in codec_config.upsampling_ratios)
    stride = int(codec_config.latent_stride) if codec_config.frame_rate != codec_config.encodec_frame_rate else 1
    return ratios * stride


class CsmSpeechProcessor:
    """The :class:`omnicore.api.Processor` of ``decoder/csm_audio`` (picklable, no weights).

    Args:
        sample_rate: the codec's rate in Hz (24000 as published); targets are resampled to it.
        hop: samples per frame (:func:`frame_size`).
        num_codebooks: ``K``, codes per frame (the codec's ``num_quantizers``).
        eos_code: ``codebook_eos_token_id``, every code of the audio end frame.
        max_seconds: seconds of one generated item (:class:`CsmAudioOptions`).

    Attributes:
        modality: ``"audio"``.
        start, placeholder: :data:`START` and :data:`PLACEHOLDER`, the checkpoint's own tokens
            (``Processor.start`` / ``placeholder``).
        codes_per_token: ``K``: the codes trained at each frame placeholder (codebook 0 by the
            backbone's head, the others by the depth decoder).
        max_frames: frames of one generated item, the audio end frame included.
    """

    modality = "audio"
    start = START
    placeholder = PLACEHOLDER

    def __init__(self, *, sample_rate: int, hop: int, num_codebooks: int, eos_code: int, max_seconds: float = 10.0) -> None:
        self.sample_rate = int(sample_rate)
        self.hop = int(hop)
        self.num_codebooks = int(num_codebooks)
        self.codes_per_token = self.num_codebooks
        self.eos_code = int(eos_code)
        self.max_seconds = float(max_seconds)
        self.max_frames = self.frames(round(self.max_seconds * self.sample_rate)) + 1

    def frames(self, num_samples: int) -> int:
        """Mimi frames of ``num_samples`` samples: ``ceil(num_samples / hop)``."""
        return -(-int(num_samples) // self.hop)

    def preprocess(self, media: Audio) -> dict[str, torch.Tensor]:
        """One clip to ``{"input_values": float32 [num_samples]}`` at :attr:`sample_rate`: the samples
        ``CsmProcessor``'s feature extractor hands the codec (no normalisation, no padding).

        Args:
            media: :class:`omnicore.api.Audio`, mono float32 samples in [-1, 1] at
                ``media.sample_rate`` Hz (resampled with soxr to :attr:`sample_rate`).

        Raises:
            TypeError: ``media`` is not an ``Audio``.
            ValueError: the samples are not one-dimensional, or the clip is empty.
        """
        if not isinstance(media, Audio):
            raise TypeError(f"csm_audio decoder: preprocess expects an omnicore.api.Audio, got {type(media).__name__}")
        samples = np.asarray(media.samples, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"csm_audio decoder expects mono audio of shape [num_samples]; got shape {samples.shape}")
        wave = resample(Audio(samples=samples, sample_rate=int(media.sample_rate)), self.sample_rate).samples
        if len(wave) == 0:
            raise ValueError("csm_audio decoder: the target clip is empty")
        return {"input_values": torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))}

    def num_tokens(self, features: dict[str, Any]) -> int:
        """Frame placeholders of one target: its Mimi frames plus the audio end frame."""
        return self.frames(int(features["input_values"].shape[-1])) + 1

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """``{"input_values": [B, L] (zero-padded to the longest), "num_samples": long [B]}``; each
        item is encoded alone, at its own length (the decoder's ``encode``).

        Raises:
            ValueError: ``items`` is empty.
        """
        return collate_waveforms(items, "csm_audio decoder")


def processor_for(config: Any, max_seconds: float) -> CsmSpeechProcessor:
    """The :class:`CsmSpeechProcessor` of a ``CsmConfig``.

    Raises:
        ValueError: the codec's ``num_quantizers`` is not the checkpoint's ``num_codebooks``.
    """
    codec = config.codec_config
    if int(codec.num_quantizers) != int(config.num_codebooks):
        raise ValueError(
            f"the checkpoint's codec has {codec.num_quantizers} quantizers but the model {config.num_codebooks} codebooks; "
            "CSM encodes with all of them"
        )
    return CsmSpeechProcessor(
        sample_rate=int(codec.sampling_rate),
        hop=frame_size(codec),
        num_codebooks=int(config.num_codebooks),
        eos_code=int(config.codebook_eos_token_id),
        max_seconds=max_seconds,
    )


def build_processor(options: dict[str, Any]) -> CsmSpeechProcessor:
    """The processor factory of ``decoder/csm_audio``: reads the checkpoint's ``config.json`` only.

    Raises:
        ValueError: the folder is not a CSM checkpoint, or its codec and model disagree on the codebooks.
        pydantic.ValidationError: unknown option keys or bad values.
    """
    opts = CsmAudioOptions.model_validate(dict(options or {}))
    folder = checkpoint_folder(opts.checkpoint, "model.decoders.audio.options.checkpoint")
    return processor_for(read_config(folder), opts.max_seconds)
