"""The data side of ``encoder/generic_encoder``: the checkpoint's own processor writes each item.

Every transformers multimodal processor turns a prompt holding a *marker* (``<image>`` for LLaVA,
``<start_of_image>`` for Gemma 3, ``<|vision_start|><|image_pad|><|vision_end|>`` for Qwen2-VL)
and the media into input ids where the marker is expanded into the item's tokens (placeholders,
and whatever the model writes around and between them: row and column tokens, begin and end
tokens, tile separators), plus the tensors the model's ``get_*_features`` takes. This module calls
the processor on the marker alone with one item: the ids it returns are the item's tokens, written
as they are (:meth:`GenericItemProcessor.layout`), and its tensors are the item's features. So the
ids omnicore trains on are the processor's for any model whose expansion of one item does not
depend on the text around it (the parity suite checks it per model type), and the number of
placeholders is the processor's own count, not a formula of ours.

The marker is what the checkpoint's chat template writes for one item of the modality (the text it
adds for a ``{"type": "image"}`` part, whitespace stripped), else the processor's own token
attribute (``image_token``, ``video_token``, ``audio_token``); option ``marker`` overrides it. The
placeholder (the token whose positions take the encoder's rows) is the config's
``image_token_id`` (``image_token_index``, ``video_token_id``, ``audio_token_id``).

Reads no weights; picklable (the transformers processor is loaded again in each data worker). For
a model with 3-D rotary positions (mRoPE) each item's positions come from the model class's own
``get_rope_index`` (:mod:`.rope`), called without building the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnicore.api import Audio, ItemLayout, Video, resample
from omnicore_family_kit.processors import load_hf_processor

TOKEN_ID_KEYS = {
    "image": ("image_token_id", "image_token_index"),
    "video": ("video_token_id", "video_token_index"),
    "audio": ("audio_token_id", "audio_token_index"),
}
"""``config.json`` fields naming each modality's placeholder id, in the order tried."""
FEATURES_BY_MODALITY = {"image": "get_image_features", "video": "get_video_features", "audio": "get_audio_features"}
"""The composite class's method that encodes each modality (transformers 5's multimodal interface)."""
TOKEN_ATTRS = {"image": "image_token", "video": "video_token", "audio": "audio_token"}
"""The processor attribute naming each modality's token (the marker's fallback)."""
TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})
"""Processor outputs that describe the text, not the item: not features."""
ITEM_IDS = "item_ids"
"""The feature holding the item's token ids as the processor wrote them (not collated)."""
_OPEN, _CLOSE = "\ue000", "\ue001"


def read_config_json(folder: Path) -> dict[str, Any]:
    """``config.json`` of ``folder`` as a dict."""
    return json.loads((Path(folder) / "config.json").read_text())


def placeholder_id(config: dict[str, Any], modality: str) -> int | None:
    """The placeholder id of ``modality`` from a ``config.json`` dict (its text config's too), or None."""
    for scope in (config, config.get("text_config") or {}):
        for key in TOKEN_ID_KEYS[modality]:
            if isinstance(scope.get(key), int):
                return int(scope[key])
    return None


def template_marker(processor: Any, modality: str) -> str | None:
    """What the processor's chat template writes for one item of ``modality`` (with the whitespace
    it writes around the item, so that a sample trains on the template's own text), found by
    rendering a user turn with the item and one with empty text and taking the tokens that differ; None when
    the template renders no such part or fails."""
    render = getattr(processor, "apply_chat_template", None)
    if not callable(render) or not getattr(processor, "chat_template", None):
        return None
    try:
        with_item = render([{"role": "user", "content": [{"type": modality}]}], tokenize=False)
        without = render([{"role": "user", "content": [{"type": "text", "text": ""}]}], tokenize=False)
    except Exception:  # a template that refuses the probe (raise_exception): fall back to the token
        return None
    tok = processor.tokenizer
    x, y = tok(with_item, add_special_tokens=False)["input_ids"], tok(without, add_special_tokens=False)["input_ids"]
    i = 0  # the diff is taken over tokens, so that it never cuts a special token in two
    while i < min(len(x), len(y)) and x[i] == y[i]:
        i += 1
    j = 0
    while j < min(len(x), len(y)) - i and x[-1 - j] == y[-1 - j]:
        j += 1
    marker = tok.decode(x[i : len(x) - j], clean_up_tokenization_spaces=False)
    return marker if marker.strip() else None


class GenericItemProcessor:
    """The :class:`omnicore.api.Processor` of one modality of a checkpoint served by the generic
    family.

    Args:
        checkpoint: the checkpoint folder (config.json, tokenizer and processor files).
        modality: ``"image"``, ``"video"`` or ``"audio"``.
        marker: the text expanded into one item (default: see the module docstring).

    Attributes:
        placeholder: the token string whose positions take the encoder's rows.
        marker: the text the processor expands.

    Raises:
        ValueError: the config names no placeholder id for the modality, the processor cannot be
            built, or it takes no such medium (naming the folder and what to set).
    """

    def __init__(self, checkpoint: str | Path, modality: str, marker: str | None = None) -> None:
        self.folder = str(Path(checkpoint).expanduser())
        self.modality = modality
        config = read_config_json(Path(self.folder))
        pid = placeholder_id(config, modality)
        if pid is None:
            raise ValueError(
                f"{self.folder}/config.json names no {modality} placeholder ({' or '.join(TOKEN_ID_KEYS[modality])}): "
                f"the model type {config.get('model_type')!r} takes no {modality} through the generic family"
            )
        self.placeholder_id = pid
        hf = self.hf
        self.placeholder = str(hf.tokenizer.convert_ids_to_tokens(pid))
        self.marker = marker or template_marker(hf, modality) or getattr(hf, TOKEN_ATTRS[modality], None) or self.placeholder
        from omnicore_family_kit.generic.rope import folder_config, rule_class

        self.rope = rule_class(folder_config(self.folder)) is not None
        """Whether the model computes 3-D rotary positions (its ``get_rope_index``): :meth:`layout`
        then gives each item's, by that rule."""

    @property
    def hf(self) -> Any:
        """The checkpoint's transformers processor (loaded once per process)."""
        return load_hf_processor(self.folder)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def preprocess(self, media: Any) -> dict[str, Any]:
        """One item through the checkpoint's processor, on the marker alone.

        Args:
            media: a ``PIL.Image.Image`` (image), an :class:`omnicore.api.Video` (video) or an
                :class:`omnicore.api.Audio` (audio, resampled to the feature extractor's rate).

        Returns:
            the processor's tensors for the item under the names the model's ``get_*_features``
            takes (``pixel_values``, ``image_sizes``, ``image_grid_thw``, ...), with their batch
            dim of one item, plus :data:`ITEM_IDS` (LongTensor ``[n]``: the item's token ids).

        Raises:
            ValueError: the processor's ids hold no placeholder (the marker is not what it expands).
        """
        kwargs: dict[str, Any] = {"text": [self.marker], "return_tensors": "pt"}
        if self.modality == "image":
            kwargs["images"] = [media.convert("RGB") if hasattr(media, "convert") else media]
        elif self.modality == "video":
            assert isinstance(media, Video)
            kwargs["videos"] = [media.frames]
        else:
            assert isinstance(media, Audio)
            rate = int(getattr(self.hf.feature_extractor, "sampling_rate", media.sample_rate))
            wave = resample(media, rate).samples if media.sample_rate != rate else media.samples
            kwargs["audio"] = [wave.numpy() if hasattr(wave, "numpy") else wave]
            kwargs["sampling_rate"] = rate
        out = self.hf(**kwargs, add_special_tokens=False)
        ids = out["input_ids"][0].long()
        if int((ids == self.placeholder_id).sum()) == 0:
            raise ValueError(
                f"{self.folder}: the processor wrote no {self.placeholder!r} for {self.marker!r}; set the {self.modality} "
                "encoder's options.marker to the text its processor expands"
            )
        features = {k: v for k, v in out.items() if k not in TEXT_KEYS and hasattr(v, "shape")}
        features[ITEM_IDS] = ids
        return features

    def num_tokens(self, features: dict[str, Any]) -> int:
        """The item's placeholders: the processor's own count."""
        return int((features[ITEM_IDS] == self.placeholder_id).sum())

    def layout(self, features: dict[str, Any]) -> ItemLayout:
        """The item's tokens as the processor wrote them: each non-placeholder token by its string,
        each run of placeholders as ``(modality, count)``; the item's features fill them. For a
        model with 3-D rotary positions (:attr:`rope`), the item's positions and where the text
        after it resumes, by the model's own ``get_rope_index``
        (:func:`omnicore_family_kit.generic.rope.item_positions`).

        Raises:
            ValueError: the model's ``get_rope_index`` cannot lay out the item (see ``item_positions``).
        """
        tokens: list[Any] = []
        convert = self.hf.tokenizer.convert_ids_to_tokens
        ids = features[ITEM_IDS].tolist()
        for i in ids:
            if i == self.placeholder_id:
                if tokens and isinstance(tokens[-1], tuple):
                    tokens[-1] = (self.modality, tokens[-1][1] + 1)
                else:
                    tokens.append((self.modality, 1))
            else:
                tokens.append(str(convert(int(i))))
        if not self.rope:
            return ItemLayout(tokens=tuple(tokens), items=((self.modality, features),))
        from omnicore_family_kit.generic.rope import item_positions

        rows, advance = item_positions(self.hf, self.folder, ids, features)
        return ItemLayout(tokens=tuple(tokens), items=((self.modality, features),), positions=rows, advance=advance)  # type: ignore[arg-type]

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Batch items as the processor batches several: each tensor concatenated along its first
        dim (the processor's batch or patch dim); a tensor whose later dims differ between items
        (LLaVA-NeXT's tiles) is zero-padded along them first, as the processor pads."""
        import torch

        out: dict[str, Any] = {}
        keys = [k for k in items[0] if k != ITEM_IDS]
        for key in keys:
            values = [torch.as_tensor(item[key]) for item in items]
            if values[0].ndim == 0:
                out[key] = torch.stack(values)
                continue
            shape = [max(v.shape[d] for v in values) for d in range(1, values[0].ndim)]
            padded = []
            for v in values:
                if list(v.shape[1:]) != shape:
                    pad: list[int] = []
                    for d in reversed(range(1, v.ndim)):
                        pad += [0, shape[d - 1] - v.shape[d]]
                    v = torch.nn.functional.pad(v, pad)
                padded.append(v)
            out[key] = torch.cat(padded, dim=0)
        return out


def build_processor(options: dict[str, Any]) -> GenericItemProcessor:
    """The processor factory of ``encoder/generic_encoder`` (``ComponentSpec.processor``).

    Raises:
        ValueError: see :class:`GenericItemProcessor`.
    """
    from omnicore_family_kit.generic.options import AutoEncoderOptions

    opts = AutoEncoderOptions.model_validate(dict(options or {}))
    return GenericItemProcessor(opts.checkpoint, opts.modality, opts.marker)
