"""The model side of ``encoder/qwen2_audio_encoder``: the checkpoint's ``audio_tower`` (transformers'
``Qwen2AudioEncoder``: Whisper-style convolutions and layers, then width-2 average pooling) and its
``multi_modal_projector``, built with transformers' own classes and read from the checkpoint.

:meth:`Qwen2AudioTower.forward` is ``Qwen2AudioModel.forward``'s audio path in transformers 5.24
(it has no ``get_audio_features``): the valid length after the first stride-2 stage makes a
bidirectional attention mask for the tower, the projected rows are cut to each clip's
:func:`~omnicore_family_qwen2_audio.processor.num_tokens_for_frames` and concatenated in clip order,
as they are scattered into the ``<|AUDIO|>`` positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omnicore.api import Audio, on_meta, plan_checkpoint
from omnicore_family_qwen2_audio.loading import TOWER
from omnicore_family_qwen2_audio.processor import Qwen2AudioClipProcessor, build_processor, checkpoint_folder


def _audio_lengths(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per clip: positions after the stride-2 convolution, and output rows after pooling."""
    valid = mask.sum(-1)
    after_conv = (valid - 1) // 2 + 1
    return after_conv, (after_conv - 2) // 2 + 1


class Qwen2AudioTower(nn.Module):
    """Qwen2-Audio's audio tower plus projector: log-mel clips to LM-wide rows.

    Args:
        config: the checkpoint's ``Qwen2AudioConfig`` (its ``audio_config`` builds the tower, its
            ``text_config.hidden_size`` the projector's width).
        processor: the :class:`~omnicore_family_qwen2_audio.processor.Qwen2AudioClipProcessor` of
            the same checkpoint.

    Attributes:
        audio_tower: transformers' ``Qwen2AudioEncoder``; multi_modal_projector:
            ``Qwen2AudioMultiModalProjector`` (names as in the published checkpoint).
        modality: ``"audio"``; modalities: ``("audio",)``.
    """

    modality = "audio"
    modalities = ("audio",)

    def __init__(self, config: Any, processor: Qwen2AudioClipProcessor) -> None:
        super().__init__()
        from transformers.models.qwen2_audio.modeling_qwen2_audio import Qwen2AudioEncoder, Qwen2AudioMultiModalProjector

        self.config = config
        self.audio_tower = Qwen2AudioEncoder(config.audio_config)
        self.multi_modal_projector = Qwen2AudioMultiModalProjector(config)
        self.processor = processor

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Encode collated clips.

        Args:
            batch: ``{"input_features": [B, num_mel_bins, max_frames], "feature_attention_mask":
                [B, max_frames]}`` (:meth:`Qwen2AudioClipProcessor.collate`).

        Returns:
            ``[sum over clips of num_tokens, hidden_size]`` rows in clip order, in the projector's dtype.
        """
        from transformers.masking_utils import create_bidirectional_mask

        weight = self.multi_modal_projector.linear.weight
        feats = batch["input_features"].to(weight.device)
        mask = batch["feature_attention_mask"].to(weight.device)
        after_conv, rows = _audio_lengths(mask)
        positions = (feats.shape[-1] - 2) // 2 + 1
        valid = (torch.arange(positions, device=feats.device)[None, :] < after_conv[:, None]).long()
        attn = create_bidirectional_mask(
            config=self.audio_tower.config,
            inputs_embeds=torch.zeros(feats.shape[0], positions, 1, dtype=weight.dtype, device=feats.device),
            attention_mask=valid,
        )
        hidden = self.audio_tower(feats, attention_mask=attn).last_hidden_state
        projected = self.multi_modal_projector(hidden)
        keep = torch.arange(projected.shape[1], device=feats.device)[None, :] < rows[:, None]
        return projected[keep]

    def dummy_batch(self) -> dict[str, Any]:
        """One 0.1 s silent clip, through the processor (a few tokens)."""
        rate = self.processor.sampling_rate
        return self.processor.collate([self.processor.preprocess(Audio(samples=np.zeros(rate // 10, dtype=np.float32), sample_rate=rate))])

    def save_pretrained(self, path: str) -> None:
        """Write ``path`` as a Qwen2-Audio folder holding only this part: the composite
        ``config.json``, ``model.safetensors`` with ``audio_tower.*`` and ``multi_modal_projector.*``
        (the published names; :func:`omnicore_family_kit.export.save_part`) and the feature
        extractor; the factory loads it back."""
        from transformers import Qwen2AudioForConditionalGeneration

        from omnicore_family_kit.export import save_part

        save_part(self, TOWER, self.config, Path(path), model_class=Qwen2AudioForConditionalGeneration)
        self.processor.feature_extractor.save_pretrained(path)


def read_config(folder: Path) -> Any:
    """The checkpoint's ``Qwen2AudioConfig`` (``config.json`` only)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder))


def build(options: dict[str, Any], *, hidden_size: int) -> Qwen2AudioTower:
    """The encoder factory: the tower and projector on the meta device, with the plan that reads
    them from the checkpoint after sharding (``omnicore_pending_load``).

    Raises:
        ValueError: the folder is not a Qwen2-Audio checkpoint; its text hidden size is not the
            foundation's ``hidden_size`` (the projector feeds that LM); LoadError when the
            checkpoint's tensors do not fit.
    """
    what = "model.encoders.audio.options.checkpoint"
    processor = build_processor(options)
    folder = checkpoint_folder(options["checkpoint"], what)
    config = read_config(folder)
    width = int(config.text_config.hidden_size)
    if width != int(hidden_size):
        raise ValueError(
            f"{what}: {folder}'s projector feeds a hidden size of {width}, but the foundation's is {hidden_size}; "
            "use the foundation of the same checkpoint (foundation/qwen2_audio)"
        )
    with on_meta():
        module = Qwen2AudioTower(config, processor)
    module.omnicore_pending_load = plan_checkpoint(module, folder, renames=TOWER.renames(), other_parts=TOWER.other_parts(), what=what)
    return module
