"""The data side of the Qwen2.5-Omni family: options, the checkpoint's own audio, image and video
processing, how many ``<|AUDIO|>`` / ``<|IMAGE|>`` / ``<|VIDEO|>`` tokens each item takes, and
where they sit (transformers' ``Qwen2_5OmniProcessor`` and the thinker's ``get_rope_index``).

Imports no model code: the factories read the checkpoint folder's ``config.json`` and
``preprocessor_config.json`` (or the nested ``processor_config.json``), never its weights, so data
workers build them from the options alone.

Token rules, as ``Qwen2_5OmniProcessor`` expands them:

* audio: a clip padded to the feature extractor's window has ``L`` valid mel frames; the tower's
  stride-2 convolution and width-2 pooling leave ``((L - 1) // 2 + 1 - 2) // 2 + 1`` rows, one
  ``<|AUDIO|>`` each, wrapped in ``<|audio_bos|>`` ... ``<|audio_eos|>``; laid out as text;
* image: patch grid ``(1, gh, gw)`` gives ``gh * gw / 4`` ``<|IMAGE|>`` tokens wrapped in
  ``<|vision_bos|>`` ... ``<|vision_eos|>``, on the mRoPE grid ``(1, gh / 2, gw / 2)``;
* video: patch grid ``(gt, gh, gw)`` gives ``gt * gh * gw / 4`` ``<|VIDEO|>`` tokens; frame group
  ``i`` sits at time ``floor(i * second_per_grid * 25)`` (``position_id_per_seconds``: 25 positions
  a second, one per 40 ms audio row). With its sound track (``use_audio_in_video``) the clip is
  written ``<|vision_bos|><|audio_bos|>``, then per 2-second chunk (``seconds_per_chunk``) its video
  tokens and its audio tokens, then ``<|audio_eos|><|vision_eos|>``; both streams start at the
  same position (TMRoPE), the audio rows coming from the audio encoder
  (:meth:`Qwen2_5OmniVisionProcessor.layout`, an :class:`omnicore.api.ItemLayout`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from omnicore.api import ItemLayout, Video
from omnicore_family_kit.audio_processors import WhisperClipProcessor
from omnicore_family_kit.audio_processors import load_feature_extractor as kit_load_feature_extractor
from omnicore_family_kit.checkpoint import checkpoint_folder as kit_checkpoint_folder
from omnicore_family_kit.media_processors import load_image_processor, load_video_processor, video_settings
from omnicore_family_kit.options import CheckpointOptions
from omnicore_family_qwen2_5_omni.plugin import MODEL_TYPES

AUDIO_PAD, IMAGE_PAD, VIDEO_PAD = "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>"
AUDIO_WRAP = ("<|audio_bos|>", "<|audio_eos|>")
VISION_WRAP = ("<|vision_bos|>", "<|vision_eos|>")
WHAT_TO_PUT = (
    "point options.checkpoint at a Qwen2.5-Omni folder as published (Qwen/Qwen2.5-Omni-7B, Qwen/Qwen2.5-Omni-3B, or what "
    "Qwen2_5OmniForConditionalGeneration / Qwen2_5OmniThinkerForConditionalGeneration.save_pretrained and the processor's "
    "save_pretrained write: config.json, model.safetensors, tokenizer files and preprocessor_config.json)"
)

LongAudio = Literal["refuse", "truncate"]
LONG_AUDIO = (
    "A clip (or a video's sound track) longer than the feature extractor's window (300 s as published): refuse = a bad "
    "sample naming its length and the limit; truncate = keep its first window, as Qwen2_5OmniProcessor does"
)
USE_AUDIO_IN_VIDEO = (
    "Read each clip's sound track (the file's first audio stream) and write it into the clip, time-aligned with its "
    "frames, as Qwen2_5OmniProcessor with load_audio_from_video=True and the thinker with use_audio_in_video=True do; "
    "a silent file is written as a plain clip. false: the frames only (transformers' default)"
)
VIDEO_FPS = (
    "Frames kept per second of video (transformers' Qwen2VLVideoProcessor.sample_frames: evenly spread, a multiple of "
    "the tubelet's 2 frames, at least min_frames); 2 as published: Qwen2_5OmniProcessor assumes every clip at 2 frames "
    "a second, which is also how far apart the frame groups are placed"
)


class Qwen2_5OmniFoundationOptions(CheckpointOptions):
    """Options of ``foundation/qwen2_5_omni``."""

    checkpoint: str = Field(
        description=(
            "A published Qwen2.5-Omni folder (config.json of Qwen2_5OmniForConditionalGeneration or of its thinker, "
            "safetensors, tokenizer and preprocessor_config.json), or a Hub name in the local cache (e.g. Qwen/Qwen2.5-Omni-7B)"
        )
    )
    use_audio_in_video: bool = Field(default=False, description=USE_AUDIO_IN_VIDEO)
    long_audio: LongAudio = Field(default="refuse", description=LONG_AUDIO)
    video_fps: float = Field(default=2.0, gt=0, description=VIDEO_FPS)
    speaker: str = Field(
        default="Chelsie",
        description="the voice `omnicore generate --speak` answers in: a speaker of the checkpoint's spk_dict.pt (Chelsie, Ethan as published)",
    )


class Qwen2_5OmniVisionOptions(CheckpointOptions):
    """Options of ``encoder/qwen2_5_omni_vision``."""

    checkpoint: str = Field(
        description=(
            "A published Qwen2.5-Omni folder (or a Hub name in the local cache); its thinker's vision tower with its merger "
            "is loaded, its image processor (and video processor) read"
        )
    )
    modality: Literal["image", "video"] = Field(
        default="image",
        description=(
            "what this entry's processor reads: image (PIL images, <|IMAGE|>) or video (omnicore.api.Video clips, <|VIDEO|>). "
            "The module encodes both; the video entry the foundation brings shares the image module (share: image)"
        ),
    )
    use_audio_in_video: bool = Field(default=False, description=USE_AUDIO_IN_VIDEO + " (video only; needs the audio encoder)")
    long_audio: LongAudio = Field(default="refuse", description=LONG_AUDIO + " (a video's sound track)")
    video_fps: float = Field(default=2.0, gt=0, description=VIDEO_FPS)


class Qwen2_5OmniAudioOptions(CheckpointOptions):
    """Options of ``encoder/qwen2_5_omni_audio``."""

    checkpoint: str = Field(
        description=(
            "A published Qwen2.5-Omni folder (or a Hub name in the local cache); its thinker's audio tower is loaded, its "
            "WhisperFeatureExtractor read"
        )
    )
    long_audio: LongAudio = Field(default="refuse", description=LONG_AUDIO)


def checkpoint_folder(checkpoint: str, what: str) -> Path:
    """``checkpoint`` as a Qwen2.5-Omni (whole or thinker) folder: :func:`omnicore_family_kit.checkpoint.checkpoint_folder` of
    :data:`MODEL_TYPES` (ValueError naming ``what``, ending with :data:`WHAT_TO_PUT`)."""
    return kit_checkpoint_folder(checkpoint, what, MODEL_TYPES, WHAT_TO_PUT)


def thinker_config(folder: Path) -> Any:
    """The checkpoint's ``Qwen2_5OmniThinkerConfig``: the whole config's ``thinker_config``, or the
    config itself in a thinker-only folder (``config.json`` only)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    return config.thinker_config if config.model_type == "qwen2_5_omni" else config


def load_feature_extractor(folder: Path, what: str) -> Any:
    """The checkpoint's own ``WhisperFeatureExtractor`` (:func:`omnicore_family_kit.audio_processors.load_feature_extractor`;
    ValueError naming ``what`` when the folder has no processor files)."""
    return kit_load_feature_extractor(folder, what, WHAT_TO_PUT)


def chunk_bounds(values: Any, per_chunk: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of ``values`` (non-decreasing) that ``Qwen2_5OmniProcessor`` and
    ``get_rope_index`` put in one chunk (their ``get_chunked_index``, step for step): a new chunk
    starts at each value that reaches the next multiple of ``per_chunk``, one multiple per value."""
    out, start, chunk = [], 0, 1
    for i, v in enumerate(values):
        if v >= chunk * per_chunk:
            out.append((start, i))
            start, chunk = i, chunk + 1
    out.append((start, len(values)))
    return out


class Qwen2_5OmniAudioProcessor(WhisperClipProcessor):
    """The :class:`omnicore.api.Processor` of ``encoder/qwen2_5_omni_audio`` (picklable, no weights):
    the kit's :class:`~omnicore_family_kit.audio_processors.WhisperClipProcessor` (the checkpoint's
    ``WhisperFeatureExtractor`` as ``Qwen2_5OmniProcessor`` applies it, tokens per clip by its
    ``_get_feat_extract_output_lengths``), its messages naming Qwen2.5-Omni."""

    label = "qwen2_5_omni audio"
    model_name = "Qwen2.5-Omni"


class Qwen2_5OmniVisionProcessor:
    """What the :class:`omnicore.api.Processor` of ``encoder/qwen2_5_omni_vision`` does for either
    modality (picklable, no weights); :class:`Qwen2_5OmniImageProcessor` places an image on its
    grid, :class:`Qwen2_5OmniVideoProcessor` lays a clip out itself.

    Attributes:
        modality: ``"image"`` or ``"video"``; placeholder: ``<|IMAGE|>`` or ``<|VIDEO|>``; wrap:
            ``(<|vision_bos|>, <|vision_eos|>)``.
        image_processor / video_processor: the checkpoint's (only the one of :attr:`modality` is set).
        audio: the :class:`Qwen2_5OmniAudioProcessor` of the clips' sound tracks
            (``use_audio_in_video``), else None; audio_track: whether clips come with it
            (:func:`omnicore.api.load_video` with ``audio=True``).
        merge_size, temporal_patch_size, patch_size: the tower's; fps: frames kept per second;
        position_id_per_seconds, seconds_per_chunk: the thinker config's (25 and 2 as published).
    """

    wrap = VISION_WRAP

    def __init__(
        self,
        modality: str,
        image_processor: Any = None,
        video_processor: Any = None,
        *,
        audio: Qwen2_5OmniAudioProcessor | None = None,
        fps: float = 2.0,
        position_id_per_seconds: float = 25,
        seconds_per_chunk: float = 2,
    ) -> None:
        if modality not in ("image", "video"):
            raise ValueError(f"qwen2_5_omni vision processor: modality must be 'image' or 'video', got {modality!r}")
        self.modality = modality
        self.placeholder = IMAGE_PAD if modality == "image" else VIDEO_PAD
        self.image_processor = image_processor
        self.video_processor = video_processor
        self.audio = audio
        self.audio_track = audio is not None
        source = image_processor if modality == "image" else video_processor
        self.merge_size = int(source.merge_size)
        self.temporal_patch_size = int(source.temporal_patch_size)
        self.patch_size = int(source.patch_size)
        self.fps = float(fps)
        self.position_id_per_seconds = position_id_per_seconds
        self.seconds_per_chunk = seconds_per_chunk

    def preprocess(self, media: Any) -> dict[str, Any]:
        """One item to the checkpoint processor's features.

        Args:
            media: a ``PIL.Image.Image`` (image) or an :class:`omnicore.api.Video` (video: uint8
                ``frames [T, H, W, 3]``, ``fps``, and with ``use_audio_in_video`` its ``audio``).

        Returns:
            image: ``{"pixel_values": float32 [gh * gw, 3 * 2 * 14 * 14], "image_grid_thw": int64 [3]}``;
            video: ``{"pixel_values_videos": float32 [gt * gh * gw, 1176], "video_grid_thw": int64
            [3], "video_second_per_grid": float64 []}`` (seconds per frame group: ``2 / sampled
            fps``), and ``"audio"``: the sound track's :class:`Qwen2_5OmniAudioProcessor` features
            when it has one and ``use_audio_in_video`` is set.

        Raises:
            TypeError: the medium is not a PIL image (image) or a Video (video).
            ValueError: the frames are not ``[T, H, W, 3]``, the processor refuses the item (an aspect
                ratio above 200, a clip too short to sample), or the sound track is refused (see
                :meth:`Qwen2_5OmniAudioProcessor.preprocess`).
        """
        if self.modality == "image":
            from PIL import Image

            if not isinstance(media, Image.Image):
                raise TypeError(f"qwen2_5_omni image processor expects a PIL image (omnicore.api.load_image), got {type(media).__name__}")
            out = self.image_processor(images=[media], return_tensors="pt")
            return {
                "pixel_values": out["pixel_values"].to(torch.float32).contiguous(),
                "image_grid_thw": out["image_grid_thw"][0].to(torch.long),
            }
        if not isinstance(media, Video):
            raise TypeError(
                f"qwen2_5_omni video processor expects an omnicore.api.Video (omnicore.api.load_video), got {type(media).__name__}"
            )
        frames = np.asarray(media.frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
            raise ValueError(f"video frames must be uint8 [T, H, W, 3] with T >= 1, got {frames.dtype} {tuple(frames.shape)}")
        meta = {"total_num_frames": len(frames), "fps": float(media.fps), "height": frames.shape[1], "width": frames.shape[2]}
        out = self.video_processor(
            videos=[frames], video_metadata=[meta], do_sample_frames=True, fps=self.fps, return_metadata=True, return_tensors="pt"
        )
        sampled_fps = float(out["video_metadata"][0].sampled_fps)
        features: dict[str, Any] = {
            "pixel_values_videos": out["pixel_values_videos"].to(torch.float32).contiguous(),
            "video_grid_thw": out["video_grid_thw"][0].to(torch.long),
            "video_second_per_grid": torch.tensor(self.temporal_patch_size / sampled_fps, dtype=torch.float64),
        }
        if self.audio is not None and media.audio is not None:
            features["audio"] = self.audio.preprocess(media.audio)
        return features

    def _grid_thw(self, features: dict[str, Any]) -> tuple[int, int, int]:
        """The patch grid ``(gt, gh, gw)`` of valid features; ValueError naming what is wrong otherwise."""
        pv_key, grid_key = ("pixel_values", "image_grid_thw") if self.modality == "image" else ("pixel_values_videos", "video_grid_thw")
        grid = features.get(grid_key) if isinstance(features, dict) else None
        pv = features.get(pv_key) if isinstance(features, dict) else None
        if grid is None or pv is None or tuple(torch.as_tensor(grid).shape) != (3,):
            raise ValueError(f"qwen2_5_omni {self.modality} features must hold {pv_key} and {grid_key} [3] (from preprocess)")
        gt, gh, gw = (int(v) for v in torch.as_tensor(grid))
        m = self.merge_size
        if pv.shape[0] != gt * gh * gw or gh % m or gw % m:
            raise ValueError(f"qwen2_5_omni {self.modality} features: {pv_key} {tuple(pv.shape)} does not fit {grid_key} {(gt, gh, gw)}")
        return gt, gh, gw

    def num_tokens(self, features: dict[str, Any]) -> int:
        """``<|IMAGE|>`` / ``<|VIDEO|>`` tokens (and merged rows) of one item: ``gt * gh * gw / 4``
        (the sound track's tokens are the audio encoder's, :meth:`layout`).

        Raises:
            ValueError: the features are not those :meth:`preprocess` makes.
        """
        gt, gh, gw = self._grid_thw(features)
        return gt * gh * gw // self.merge_size**2

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Concatenate items in order, under the thinker's input names: images ``pixel_values [sum
        gh*gw, D]`` and ``image_grid_thw [B, 3]``; clips ``pixel_values_videos [sum gt*gh*gw, D]``,
        ``video_grid_thw [B, 3]`` and ``video_second_per_grid [B]`` (a clip's sound track is the
        audio encoder's).

        Raises:
            ValueError: ``items`` is empty, or an item's features are invalid (its index named).
        """
        if not items:
            raise ValueError(f"qwen2_5_omni {self.modality} processor: collate() needs at least one item")
        for i, item in enumerate(items):
            try:
                self._grid_thw(item)
            except ValueError as exc:
                raise ValueError(f"item {i}: {exc}") from None
        if self.modality == "image":
            return {
                "pixel_values": torch.cat([torch.as_tensor(it["pixel_values"]) for it in items]),
                "image_grid_thw": torch.stack([torch.as_tensor(it["image_grid_thw"], dtype=torch.long) for it in items]),
            }
        return {
            "pixel_values_videos": torch.cat([torch.as_tensor(it["pixel_values_videos"]) for it in items]),
            "video_grid_thw": torch.stack([torch.as_tensor(it["video_grid_thw"], dtype=torch.long) for it in items]),
            "video_second_per_grid": torch.stack([torch.as_tensor(it["video_second_per_grid"], dtype=torch.float64) for it in items]),
        }


class Qwen2_5OmniImageProcessor(Qwen2_5OmniVisionProcessor):
    """The :class:`omnicore.api.Processor` of ``encoder/qwen2_5_omni_vision`` for images: an image's
    tokens sit on the LM's grid (:meth:`grid`), the core places them."""

    def __init__(self, image_processor: Any) -> None:
        super().__init__("image", image_processor)

    def grid(self, features: dict[str, Any]) -> tuple[int, int, int]:
        """An image's tokens on the LM's grid, ``(1, gh / 2, gw / 2)`` in raster order."""
        gt, gh, gw = self._grid_thw(features)
        return gt, gh // self.merge_size, gw // self.merge_size


class Qwen2_5OmniVideoProcessor(Qwen2_5OmniVisionProcessor):
    """The :class:`omnicore.api.Processor` of ``encoder/qwen2_5_omni_vision`` for clips: each clip is
    laid out by :meth:`layout` (its frames, and with ``use_audio_in_video`` its sound track)."""

    def __init__(self, video_processor: Any, **kwargs: Any) -> None:
        super().__init__("video", video_processor=video_processor, **kwargs)

    def layout(self, features: dict[str, Any]) -> ItemLayout:
        """How a clip is written and placed, as ``Qwen2_5OmniProcessor`` writes it and the thinker's
        ``get_rope_index`` places it (each step for step, both in the library's arithmetic).

        Frame group ``i`` sits at time ``floor(i * second_per_grid * 25)`` (float32), its tokens at
        ``(time, row, column)`` one past ``<|vision_bos|>``, and ``<|vision_eos|>`` one past the
        largest. With a sound track the clip is ``<|vision_bos|><|audio_bos|>`` (one position),
        then per 2-second chunk its video tokens and its audio tokens (the audio at ``start +
        index``, a time step each), then ``<|audio_eos|><|vision_eos|>`` at one past the last
        chunk's largest position; the text after the clip follows.

        Returns:
            an :class:`omnicore.api.ItemLayout`: the tokens, the items (the clip's features without
            ``"audio"``, then its sound track for the audio encoder), the positions.

        Raises:
            ValueError: the features are not those :meth:`preprocess` makes.
        """
        gt, gh, gw = self._grid_thw(features)
        h, w = gh // self.merge_size, gw // self.merge_size
        second = torch.as_tensor(features["video_second_per_grid"], dtype=torch.float64)
        times = (torch.arange(gt) * second.float() * self.position_id_per_seconds).long().tolist()  # get_rope_index
        video = [
            [1 + t for t in times for _ in range(h * w)],
            [1 + j for _ in range(gt) for j in range(h) for _ in range(w)],
            [1 + k for _ in range(gt * h) for k in range(w)],
        ]
        clip = {k: v for k, v in features.items() if k != "audio"}
        sound = features.get("audio")
        if sound is None or self.audio is None:
            end = max(max(r) for r in video) + 1
            rows = tuple(tuple([0, *r, end]) for r in video)
            tokens = (VISION_WRAP[0], ("video", gt * h * w), VISION_WRAP[1])
            return ItemLayout(tokens, (("video", clip),), rows, end + 1)  # type: ignore[arg-type]
        n_audio = self.audio.num_tokens(sound)
        per_chunk = int(self.position_id_per_seconds * self.seconds_per_chunk)
        # the tokens: Qwen2_5OmniProcessor.replace_video_with_audio_token (float64 times, not floored)
        seconds = float(features["video_second_per_grid"])
        token_times = np.repeat(np.arange(gt), h * w) * seconds * self.position_id_per_seconds
        v_chunks, a_chunks = chunk_bounds(token_times, per_chunk), chunk_bounds(np.arange(n_audio), per_chunk)
        tokens: list[Any] = [VISION_WRAP[0], AUDIO_WRAP[0]]
        for j in range(max(len(v_chunks), len(a_chunks))):
            if j < len(v_chunks):
                tokens.append(("video", v_chunks[j][1] - v_chunks[j][0]))
            if j < len(a_chunks):
                tokens.append(("audio", a_chunks[j][1] - a_chunks[j][0]))
        tokens += [AUDIO_WRAP[1], VISION_WRAP[1]]
        # the positions: get_rope_index with use_audio_in_video (chunks of the floored times)
        audio = [list(range(1, n_audio + 1))] * 3
        rows: list[list[int]] = [[0, 0], [0, 0], [0, 0]]
        last: list[list[int]] = []
        v_chunks, a_chunks = chunk_bounds([t - 1 for t in video[0]], per_chunk), chunk_bounds(range(n_audio), per_chunk)
        for j in range(max(len(v_chunks), len(a_chunks))):
            for source, bounds in ((video, v_chunks), (audio, a_chunks)):
                if j < len(bounds):
                    last = [r[bounds[j][0] : bounds[j][1]] for r in source]
                    for r, part in zip(rows, last, strict=True):
                        r.extend(part)
        end = max(max(r) for r in last) + 1
        for r in rows:
            r.extend([end, end])
        return ItemLayout(tuple(tokens), (("video", clip), ("audio", sound)), tuple(tuple(r) for r in rows), end + 1)  # type: ignore[arg-type]


def build_audio_processor(options: dict[str, Any]) -> Qwen2_5OmniAudioProcessor:
    """The processor factory of ``encoder/qwen2_5_omni_audio``: reads the checkpoint's
    ``config.json`` and feature extractor only.

    Raises:
        ValueError: the folder is not a Qwen2.5-Omni checkpoint, or has no processor files.
        pydantic.ValidationError: unknown option keys or bad values.
    """
    opts = Qwen2_5OmniAudioOptions.model_validate(dict(options or {}))
    what = "model.encoders.audio.options.checkpoint"
    folder = checkpoint_folder(opts.checkpoint, what)
    return Qwen2_5OmniAudioProcessor(load_feature_extractor(folder, what), long_audio=opts.long_audio)


def build_vision_processor(options: dict[str, Any]) -> Qwen2_5OmniVisionProcessor:
    """The processor factory of ``encoder/qwen2_5_omni_vision``: reads the checkpoint's
    ``config.json`` and processor files only.

    Raises:
        ValueError: the folder is not a Qwen2.5-Omni checkpoint, or has no processor files.
        pydantic.ValidationError: unknown option keys or bad values.
    """
    opts = Qwen2_5OmniVisionOptions.model_validate(dict(options or {}))
    what = f"model.encoders.{opts.modality}.options.checkpoint"
    folder = checkpoint_folder(opts.checkpoint, what)
    if opts.modality == "image":
        return Qwen2_5OmniImageProcessor(load_image_processor(folder, what, WHAT_TO_PUT))
    thinker = thinker_config(folder)
    audio = Qwen2_5OmniAudioProcessor(load_feature_extractor(folder, what), long_audio=opts.long_audio) if opts.use_audio_in_video else None
    return Qwen2_5OmniVideoProcessor(
        load_video_processor(folder, video_settings(folder, what, WHAT_TO_PUT)),
        audio=audio,
        fps=opts.video_fps,
        position_id_per_seconds=thinker.position_id_per_seconds,
        seconds_per_chunk=thinker.seconds_per_chunk,
    )
