"""The data side of the Qwen2-Audio family: options, the checkpoint's own log-mel features and
the number of ``<|AUDIO|>`` tokens per clip.

Imports no model code: :func:`build_processor` reads the checkpoint folder's feature extractor
(``preprocessor_config.json`` or ``processor_config.json``, through ``AutoFeatureExtractor``), never
its weights, so data workers build it from the options alone.

Token rule (transformers' ``Qwen2AudioProcessor`` and the model's ``feature_attention_mask`` path):
a clip padded to the extractor's fixed length has ``L`` valid mel frames (its attention mask's
sum, ``ceil(samples / hop_length)``); the tower's stride-2 convolution keeps ``(L - 1) // 2 + 1``
positions and its width-2 average pooling ``(positions - 2) // 2 + 1``, which is the number of
placeholder tokens, and of projected rows the model scatters into them
(:func:`omnicore_family_kit.audio_processors.num_tokens_for_frames`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from omnicore_family_kit.audio_processors import PLACEHOLDER, WRAP, WhisperClipProcessor, num_tokens_for_frames
from omnicore_family_kit.audio_processors import load_feature_extractor as kit_load_feature_extractor
from omnicore_family_kit.checkpoint import checkpoint_folder as kit_checkpoint_folder
from omnicore_family_kit.options import CheckpointOptions
from omnicore_family_qwen2_audio.plugin import MODEL_TYPES

__all__ = [
    "PLACEHOLDER",
    "WHAT_TO_PUT",
    "WRAP",
    "Qwen2AudioClipProcessor",
    "Qwen2AudioEncoderOptions",
    "Qwen2AudioFoundationOptions",
    "build_processor",
    "checkpoint_folder",
    "load_feature_extractor",
    "num_tokens_for_frames",
]

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


def checkpoint_folder(checkpoint: str, what: str) -> Path:
    """``checkpoint`` as a Qwen2-Audio folder: :func:`omnicore_family_kit.checkpoint.checkpoint_folder` of
    :data:`MODEL_TYPES` (ValueError naming ``what``, ending with :data:`WHAT_TO_PUT`)."""
    return kit_checkpoint_folder(checkpoint, what, MODEL_TYPES, WHAT_TO_PUT)


class Qwen2AudioClipProcessor(WhisperClipProcessor):
    """The :class:`omnicore.api.Processor` of the Qwen2-Audio encoder (picklable, no weights): the
    kit's :class:`~omnicore_family_kit.audio_processors.WhisperClipProcessor` (the checkpoint's
    ``WhisperFeatureExtractor`` as ``Qwen2AudioProcessor`` applies it, :func:`num_tokens_for_frames`
    tokens per clip), its messages naming Qwen2-Audio."""

    label = "qwen2_audio encoder"
    model_name = "Qwen2-Audio"


def load_feature_extractor(folder: Path, what: str) -> Any:
    """The checkpoint's own feature extractor (:func:`omnicore_family_kit.audio_processors.load_feature_extractor`;
    ValueError naming ``what`` when the folder has no feature-extractor files)."""
    return kit_load_feature_extractor(folder, what, WHAT_TO_PUT)


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
