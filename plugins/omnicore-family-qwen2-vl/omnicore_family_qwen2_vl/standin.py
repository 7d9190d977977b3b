"""A tiny random Qwen2-VL or Qwen2.5-VL checkpoint in the published layout, for tests and recipes.

:func:`save_standin` writes what ``Qwen/Qwen2-VL-2B-Instruct`` (or ``Qwen/Qwen2.5-VL-3B-Instruct``)
holds, at toy size: the composite ``config.json`` of ``Qwen2VLForConditionalGeneration`` (or
``Qwen2_5_VLForConditionalGeneration``) and its safetensors as transformers' ``save_pretrained``
writes them (``visual.*``, ``model.*``, ``lm_head.*``), a tokenizer with the family's special
tokens and the published chat template, the image processor's ``preprocessor_config.json`` and the
video processor's ``video_preprocessor_config.json`` (small ``min_pixels`` / ``max_pixels``).
Nothing is downloaded; the weights are seeded random values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FAMILIES = ("qwen2_vl", "qwen2_5_vl")

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""The Qwen2-VL special tokens the stand-in tokenizer holds, in the published order (their ids
follow the 256 bytes)."""

CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The chat template in the format the Qwen2-VL and Qwen2.5-VL instruct checkpoints publish: a
default system turn, string content as is, each image part of list content as
``<|vision_start|><|image_pad|><|vision_end|>`` and each video part with ``<|video_pad|>`` (the
processor then repeats the pad once per merged patch)."""


def standin_tokenizer() -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with :data:`SPECIAL_TOKENS` and :data:`CHAT_TEMPLATE`
    (eos ``<|im_end|>``, pad ``<|endoftext|>``, as the published instruct tokenizer)."""
    from omnicore.api import byte_tokenizer

    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_standin(
    folder: str | Path,
    *,
    family: str = "qwen2_vl",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vision_width: int = 32,
    vision_depth: int = 2,
    vision_heads: int = 2,
    patch_size: int = 14,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 16,
    extra_vocab: int = 6,
    seed: int = 0,
) -> Path:
    """Write a tiny random ``Qwen2VLForConditionalGeneration`` (``family="qwen2_vl"``) or
    ``Qwen2_5_VLForConditionalGeneration`` (``"qwen2_5_vl"``) with its tokenizer and processor files
    into ``folder`` (created) and return it.

    Args:
        family: ``qwen2_vl`` or ``qwen2_5_vl``.
        hidden_size, num_layers, num_heads, num_kv_heads: the text model's; its
            ``mrope_section`` is derived to sum to ``head_dim / 2`` (published: ``[16, 24, 24]``
            for head dim 128).
        vision_width, vision_depth, vision_heads: the vision tower's width (``embed_dim`` /
            ``hidden_size``), depth and heads; its merger maps to ``hidden_size``. Qwen2.5-VL's
            tower attends in windows of 2 x 2 merged patches except in its last block.
        patch_size: pixels per patch side (14 as published; merged 2 x 2, tubelets of 2 frames).
        min_pixels, max_pixels: the image and video processors' pixel bounds (published:
            3136 and 12845056); the defaults give 4 to 16 tokens per image or frame group.
        extra_vocab: embedding rows beyond the tokenizer (the published vocabulary is larger
            than its tokenizer too).
        seed: seeds the weights.

    Raises:
        ValueError: ``family`` is not one of :data:`FAMILIES`, or ``hidden_size / num_heads`` is
            not a multiple of 8 (the mRoPE sections need one).

    The text model does not tie its embeddings (as Qwen2-VL-7B; the 2B ties them).
    """
    import torch
    from transformers import Qwen2VLImageProcessorPil

    if family not in FAMILIES:
        raise ValueError(f"save_standin: family must be one of {FAMILIES}, got {family!r}")
    head_dim = hidden_size // num_heads
    if head_dim % 8:
        raise ValueError(f"save_standin: hidden_size / num_heads = {head_dim} must be a multiple of 8 for the mRoPE sections")
    half = head_dim // 2
    section = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]  # [16, 24, 24] for head dim 128
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = standin_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = {
        "vocab_size": len(tok) + extra_vocab,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": section},
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    common = {
        "depth": vision_depth,
        "num_heads": vision_heads,
        "patch_size": patch_size,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    tokens = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig as Config
        from transformers import Qwen2VLForConditionalGeneration as Model

        vision = dict(common, embed_dim=vision_width, hidden_size=hidden_size, mlp_ratio=2)
        processor_class = "Qwen2VLProcessor"
    else:
        from transformers import Qwen2_5_VLConfig as Config
        from transformers import Qwen2_5_VLForConditionalGeneration as Model

        vision = dict(
            common,
            hidden_size=vision_width,
            intermediate_size=2 * vision_width,
            out_hidden_size=hidden_size,
            window_size=4 * patch_size,
            fullatt_block_indexes=[vision_depth - 1],
            tokens_per_second=2,
        )
        processor_class = "Qwen2_5_VLProcessor"
    config = Config(vision_config=vision, text_config=text, tie_word_embeddings=False, **tokens)
    torch.manual_seed(seed)
    model = Model(config).eval()
    with torch.no_grad():  # post_init's std 0.02 makes a near-constant toy; wider weights make the tests sharper
        for _, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    image = Qwen2VLImageProcessorPil(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=patch_size, merge_size=2, temporal_patch_size=2
    )
    image.save_pretrained(folder)
    _add_keys(folder / "preprocessor_config.json", {"processor_class": processor_class, "min_pixels": min_pixels, "max_pixels": max_pixels})
    video = {  # what Qwen2VLVideoProcessor(...).save_pretrained writes (it needs torchvision to be built)
        "video_processor_type": "Qwen2VLVideoProcessor",
        "processor_class": processor_class,
        "do_resize": True,
        "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(image.image_mean),
        "image_std": list(image.image_std),
        "do_convert_rgb": True,
        "patch_size": patch_size,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_frames": 4,
        "max_frames": 768,
        "do_sample_frames": False,
        "cap_pixels_per_frame": False,
    }
    (folder / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    return folder


def _add_keys(path: Path, keys: dict[str, Any]) -> None:
    data = json.loads(path.read_text())
    data.update(keys)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
