"""The model side of ``encoder/qwen2_5_omni_audio`` and ``encoder/qwen2_5_omni_vision``: the
checkpoint's thinker towers, built with transformers' own classes (``Qwen2_5OmniAudioEncoder``,
``Qwen2_5OmniVisionEncoder``) and read from the checkpoint.

:meth:`Qwen2_5OmniAudioTower.forward` is the thinker's ``get_audio_features``: the valid mel frames
of each clip (its ``feature_attention_mask``) joined along time, the tower attending within
chunks of ``2 * n_window`` frames, average-pooled by 2 and projected to the LM's width: one row
per ``<|AUDIO|>`` token, clips in order. :meth:`Qwen2_5OmniVisionTower.forward` is its
``get_image_features`` / ``get_video_features``: the merger's rows (already at the LM's width),
items in order. One vision module encodes both images and clips (``modalities``); the video entry
the foundation brings shares it (``model.encoders.video.share: image``), as the thinker has one
tower. A clip's sound track reaches the audio module as an audio item of its own
(:meth:`~omnicore_family_qwen2_5_omni.processor.Qwen2_5OmniVisionProcessor.layout`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omnicore.api import Audio, on_meta, plan_checkpoint
from omnicore_family_kit.keymap import KeyMap
from omnicore_family_qwen2_5_omni.loading import AUDIO, VISION, in_thinker
from omnicore_family_qwen2_5_omni.processor import (
    Qwen2_5OmniAudioProcessor,
    Qwen2_5OmniVisionProcessor,
    build_audio_processor,
    build_vision_processor,
    checkpoint_folder,
    thinker_config,
)


class _ThinkerPart(nn.Module):
    """What both towers share: the thinker config, the source folder, the part's key map (``keys``,
    :mod:`omnicore_family_qwen2_5_omni.loading`) and ``save_pretrained``."""

    keys: KeyMap

    def __init__(self, config: Any, source: Path) -> None:
        super().__init__()
        self.config = config
        self.source = Path(source)

    def save_pretrained(self, path: str) -> None:
        """Write ``path`` as a thinker folder holding only this part: the thinker's ``config.json``
        (``qwen2_5_omni_thinker``), ``model.safetensors`` with this tower under the names the
        thinker's ``save_pretrained`` writes (``audio_tower.*`` or ``visual.*``;
        :func:`omnicore_family_kit.export.save_part`) and the source's processor files; the factory
        loads it back."""
        from transformers import Qwen2_5OmniThinkerForConditionalGeneration

        from omnicore_family_kit.export import save_part

        save_part(
            self, in_thinker(self.keys), self.config, Path(path), model_class=Qwen2_5OmniThinkerForConditionalGeneration, source=self.source
        )


class Qwen2_5OmniAudioTower(_ThinkerPart):
    """The thinker's audio tower: log-mel clips to LM-wide rows.

    Args:
        config: the checkpoint's ``Qwen2_5OmniThinkerConfig`` (its ``audio_config`` builds the tower,
            whose ``output_dim`` is the LM's width).
        processor: the :class:`~omnicore_family_qwen2_5_omni.processor.Qwen2_5OmniAudioProcessor`
            of the same checkpoint.
        source: the checkpoint folder.

    Attributes:
        audio_tower: transformers' ``Qwen2_5OmniAudioEncoder`` (the thinker's name for it); its
            ``audio_bos_eos_token`` embedding, which its forward never reads, is frozen.
        modality: ``"audio"``; modalities: ``("audio",)``.
    """

    modality = "audio"
    modalities = ("audio",)
    keys = AUDIO

    def __init__(self, config: Any, processor: Qwen2_5OmniAudioProcessor, source: Path) -> None:
        super().__init__(config, source)
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder

        self.audio_tower = Qwen2_5OmniAudioEncoder._from_config(config.audio_config)
        # read by no forward of transformers' (the checkpoint holds it): frozen, so that no rank waits
        # for its gradient; the export writes it back as read
        self.audio_tower.audio_bos_eos_token.weight.requires_grad_(False)
        self.processor = processor
        self._dummy: dict[str, Any] | None = None

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Encode collated clips (the thinker's ``get_audio_features``).

        Args:
            batch: ``{"input_features": [B, num_mel_bins, max_frames], "feature_attention_mask":
                [B, max_frames]}`` (:meth:`Qwen2_5OmniAudioProcessor.collate`).

        Returns:
            ``[sum over clips of num_tokens, hidden_size]`` rows in clip order, in the tower's dtype.
        """
        weight = self.audio_tower.conv1.weight
        feats = batch["input_features"].to(weight.device)
        mask = batch["feature_attention_mask"].to(weight.device)
        lengths = mask.sum(-1)
        valid = feats.permute(0, 2, 1)[mask.bool()].permute(1, 0)  # [num_mel_bins, sum of valid frames]
        after_cnn, _ = self.audio_tower._get_feat_extract_output_lengths(lengths)
        return self.audio_tower(valid, feature_lens=lengths, aftercnn_lens=after_cnn).last_hidden_state

    def dummy_batch(self) -> dict[str, Any]:
        """One 0.1 s silent clip, through the processor (a few tokens; computed once)."""
        if self._dummy is None:
            rate = self.processor.sampling_rate
            self._dummy = self.processor.collate(
                [self.processor.preprocess(Audio(samples=np.zeros(rate // 10, dtype=np.float32), sample_rate=rate))]
            )
        return self._dummy


class Qwen2_5OmniVisionTower(_ThinkerPart):
    """The thinker's vision tower with its merger: patches of images and clips to LM-wide rows.

    Args:
        config: the checkpoint's ``Qwen2_5OmniThinkerConfig`` (its ``vision_config`` builds the tower).
        processor: the :class:`~omnicore_family_qwen2_5_omni.processor.Qwen2_5OmniVisionProcessor`
            of the same checkpoint (its modality is this module's).
        source: the checkpoint folder.

    Attributes:
        visual: transformers' ``Qwen2_5OmniVisionEncoder`` (``visual.patch_embed``,
            ``visual.blocks``, ``visual.merger``: the thinker's names).
        modality: the processor's (``"image"`` by default); modalities: ``("image", "video")``.
    """

    modalities = ("image", "video")
    keys = VISION

    def __init__(self, config: Any, processor: Qwen2_5OmniVisionProcessor, source: Path) -> None:
        super().__init__(config, source)
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniVisionEncoder

        self.visual = Qwen2_5OmniVisionEncoder._from_config(config.vision_config)
        self.processor = processor
        self.modality = processor.modality

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Encode collated images or clips.

        Args:
            batch: images ``{"pixel_values": [N, 3 * 2 * P * P], "image_grid_thw": [B, 3]}`` or clips
                ``{"pixel_values_videos": [N, 3 * 2 * P * P], "video_grid_thw": [B, 3], ...}``
                (:meth:`Qwen2_5OmniVisionProcessor.collate`).

        Returns:
            ``[sum over items of gt * gh * gw / 4, hidden_size]`` rows in item order, in the tower's dtype.

        Raises:
            ValueError: the batch holds neither kind of pixels.
        """
        if "pixel_values" in batch:
            pixels, grid = batch["pixel_values"], batch["image_grid_thw"]
        elif "pixel_values_videos" in batch:
            pixels, grid = batch["pixel_values_videos"], batch["video_grid_thw"]
        else:
            raise ValueError(
                f"qwen2_5_omni vision encoder: the batch holds neither pixel_values nor pixel_values_videos (keys {sorted(batch)})"
            )
        weight = self.visual.patch_embed.proj.weight
        grid = torch.as_tensor(grid).reshape(-1, 3).to(weight.device)
        return self.visual(pixels.to(weight.device, weight.dtype), grid_thw=grid).pooler_output

    def dummy_batch(self) -> dict[str, Any]:
        """One all-zero item of one merge block (one token) of this module's modality, collated."""
        p = self.processor
        m, width = p.merge_size, 3 * p.temporal_patch_size * p.patch_size**2
        if p.modality == "image":
            item = {"pixel_values": torch.zeros(m * m, width), "image_grid_thw": torch.tensor([1, m, m])}
        else:
            item = {
                "pixel_values_videos": torch.zeros(m * m, width),
                "video_grid_thw": torch.tensor([1, m, m]),
                "video_second_per_grid": torch.tensor(1.0, dtype=torch.float64),
            }
        return p.collate([item])


def _built(module: _ThinkerPart, folder: Path, what: str, hidden_size: int, width: int) -> Any:
    """``module`` with its load plan (its :attr:`~_ThinkerPart.keys`), after checking that its rows
    are the foundation's width."""
    if width != int(hidden_size):
        raise ValueError(
            f"{what}: {folder}'s thinker feeds a hidden size of {width}, but the foundation's is {hidden_size}; "
            "use the foundation of the same checkpoint (foundation/qwen2_5_omni)"
        )
    keys = module.keys
    module.omnicore_pending_load = plan_checkpoint(module, folder, renames=keys.renames(), other_parts=keys.other_parts(), what=what)
    return module


def build_audio(options: dict[str, Any], *, hidden_size: int) -> Qwen2_5OmniAudioTower:
    """The factory of ``encoder/qwen2_5_omni_audio``: the audio tower on the meta device, with the
    plan that reads it from the checkpoint after sharding (``omnicore_pending_load``).

    Raises:
        ValueError: the folder is not a Qwen2.5-Omni checkpoint, or the tower's ``output_dim`` is
            not the foundation's ``hidden_size``; LoadError when the checkpoint's tensors do not fit.
    """
    what = "model.encoders.audio.options.checkpoint"
    processor = build_audio_processor(options)
    folder = checkpoint_folder(options["checkpoint"], what)
    config = thinker_config(folder)
    with on_meta():
        module = Qwen2_5OmniAudioTower(config, processor, folder)
    return _built(module, folder, what, hidden_size, int(config.audio_config.output_dim))


def build_vision(options: dict[str, Any], *, hidden_size: int) -> Qwen2_5OmniVisionTower:
    """The factory of ``encoder/qwen2_5_omni_vision``: the vision tower with its merger on the meta
    device, with the plan that reads it from the checkpoint after sharding.

    Raises:
        ValueError: the folder is not a Qwen2.5-Omni checkpoint, or the merger's ``out_hidden_size``
            is not the foundation's ``hidden_size``; LoadError when the tensors do not fit.
    """
    processor = build_vision_processor(options)
    what = f"model.encoders.{processor.modality}.options.checkpoint"
    folder = checkpoint_folder(options["checkpoint"], what)
    config = thinker_config(folder)
    with on_meta():
        module = Qwen2_5OmniVisionTower(config, processor, folder)
    return _built(module, folder, what, hidden_size, int(config.vision_config.out_hidden_size))
