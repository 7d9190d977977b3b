"""Bidirectional media spans: Gemma 3's image-token attention, on packed rows.

``Gemma3ForConditionalGeneration`` lets the tokens of one image attend to each other in both
directions: its processor returns ``token_type_ids`` (its multimodal token types, 1 on the image's
placeholder tokens), the base model numbers each run of consecutive image tokens
(``get_block_sequence_ids_for_mask``) and builds one mask per layer type
(``create_masks_for_vision_model``, transformers 5.25 ``models/gemma3/modeling_gemma3.py``):

* full-attention layers: causal OR same image;
* sliding-window layers: (causal OR same image) AND the window (``kv > q - sliding_window``).

omnicore gives the core's media spans (``FoundationOptional.media_span_inputs``: per modality, one
id per run of consecutive placeholders, -1 elsewhere: transformers' ``block_sequence_ids``) and
:func:`span_masks` builds the same masks with transformers' own masking utilities for the packed
row, with one more AND: the packed sample (``find_packed_sequence_indices`` of the restarting
``position_ids``). Every mask function works on indices in the row, which is exact for packed
samples because positions continue by one inside a sample, so index differences inside a sample
are position differences. transformers' packed-row path is not used for this: it rewrites the
indices into positions before the OR with the image blocks (``remap_positions_for_packed_sequence``)
and the block ids are indexed by row index, so an ``or_mask_function`` over blocks would read the
wrong tokens after the first sample.

The masks are dense ``[B, 1, T, T]`` (sdpa: bool, eager: additive float, flex: a BlockMask) from the
mask interface of the language model's attention implementation, so only implementations that
apply such a mask serve them; kernels that split samples by ``cu_seqlens`` and take no mask
(``sdpa_varlen``, flash) are refused by the core when the model is built.
"""

from __future__ import annotations

from typing import Any

SPAN_LAYERS = frozenset({"full_attention", "sliding_attention"})
"""The ``layer_types`` :func:`span_masks` builds a mask for."""


def span_masks(
    config: Any, blocks: Any, position_ids: Any, inputs_embeds: Any, attention_mask: Any = None, cache: Any = None
) -> dict[str, Any]:
    """One attention mask per layer type of ``config`` (the text model's ``attention_mask`` dict):
    causal, bidirectional within each block, the packed samples apart, sliding layers windowed.

    Args:
        config: the language model's text config (its ``_attn_implementation`` picks the mask format;
            ``layer_types`` and ``sliding_window`` the masks).
        blocks: LongTensor ``[B, T]``, the block (image) of each token, -1 outside any.
        position_ids: ``[B, T]``, restarting at 0 at each packed sample (training rows; ignored
            with ``attention_mask`` or ``cache``, as transformers does).
        inputs_embeds: ``[B, T, H]`` (batch size, length, dtype and device of the masks).
        attention_mask: the 2-D padding mask ``[B, T]`` of a generation prefill, or None.
        cache: the prefill's cache, or None.

    Returns:
        ``{layer type: mask}`` for each layer type in ``config.layer_types`` (``full_attention``
        alone without them).

    Raises:
        ValueError: a layer type other than full and sliding attention.
    """
    from transformers.masking_utils import (
        and_masks,
        blockwise_overlay,
        create_causal_mask,
        find_packed_sequence_indices,
        packed_sequence_mask_function,
        sliding_window_overlay,
    )

    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds - SPAN_LAYERS:
        raise ValueError(f"bidirectional media spans: no mask for {', '.join(sorted(kinds - SPAN_LAYERS))} layers")
    same_sample = None
    if attention_mask is None and cache is None and position_ids is not None:
        samples = find_packed_sequence_indices(position_ids.expand(inputs_embeds.shape[0], -1))
        same_sample = None if samples is None else packed_sequence_mask_function(samples)
    if attention_mask is not None and attention_mask.shape[-1] > blocks.shape[-1]:  # keys beyond the queries: no block
        import torch.nn.functional as F

        blocks = F.pad(blocks, (0, attention_mask.shape[-1] - blocks.shape[-1]), value=-1)
    common = {"config": config, "inputs_embeds": inputs_embeds, "attention_mask": attention_mask, "cache": cache}
    out: dict[str, Any] = {}
    for kind in sorted(kinds):
        ands = [same_sample] if same_sample is not None else []
        layer = None
        if kind == "sliding_attention":
            ands.append(sliding_window_overlay(config.sliding_window))
            sliding = getattr(cache, "is_sliding", None) or []
            layer = sliding.index(True) if True in sliding else 0
        out[kind] = create_causal_mask(
            **common,
            position_ids=None,  # the packed samples are the AND above, on row indices (module docstring)
            or_mask_function=blockwise_overlay(blocks),
            and_mask_function=and_masks(*ands) if ands else None,
            layer_idx=layer,
        )
    return out


def span_modality(config: dict[str, Any], composite: Any, folder: Any) -> str | None:
    """The modality whose placeholder runs the class attends to bidirectionally, or None where the
    generic family's media spans cannot reproduce the class's ``token_type_ids`` mask.

    ``"image"`` when the class's base forward takes ``token_type_ids``, the checkpoint's processor
    returns them as its multimodal token types (``return_mm_token_type_ids``: 1 exactly on its
    ``image_token_ids``), those are the config's image placeholder alone, and the text model is
    causal with full and sliding layers only (Gemma 3). None otherwise: PaliGemma's
    ``token_type_ids`` mark a text prefix (and suffix) from the prompt, not the media tokens.

    Args:
        config: the checkpoint's ``config.json`` (a dict).
        composite: the composite class's instance (meta device is enough).
        folder: the checkpoint folder (its processor is loaded).
    """
    import inspect

    from omnicore_family_kit.generic.processor import placeholder_id
    from omnicore_family_kit.processors import load_hf_processor

    base = getattr(composite, "model", composite)
    try:
        takes = "token_type_ids" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        takes = False
    image = placeholder_id(config, "image")
    if not takes or image is None:
        return None
    text = composite.config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds - SPAN_LAYERS or getattr(text, "use_bidirectional_attention", False) or not getattr(text, "is_causal", True):
        return None
    try:
        processor = load_hf_processor(str(folder))
    except ValueError:
        return None
    if not getattr(processor, "return_mm_token_type_ids", False):
        return None
    return "image" if list(getattr(processor, "image_token_ids", None) or []) == [image] else None


class MediaSpanInputs:
    """``FoundationOptional.media_span_inputs`` of a class whose ``modality`` tokens attend to each
    other within one medium (:func:`span_modality`): the text model's ``attention_mask`` dict from
    :func:`span_masks`, or ``{}`` for a row without such tokens (the text model's own causal masks,
    which equal the class's there)."""

    def __init__(self, modality: str):
        self.modality = modality

    def __call__(
        self, config: Any, spans: dict[str, Any], position_ids: Any, inputs_embeds: Any, attention_mask: Any = None, cache: Any = None
    ) -> dict[str, Any]:
        blocks = spans.get(self.modality)
        if blocks is None or not bool((blocks >= 0).any()):
            return {}
        return {"attention_mask": span_masks(config, blocks, position_ids, inputs_embeds, attention_mask, cache)}
