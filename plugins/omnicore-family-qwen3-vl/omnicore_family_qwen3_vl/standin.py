"""A tiny random Qwen3-VL checkpoint in the published layout, for tests and recipes.

:func:`save_standin` writes what ``Qwen/Qwen3-VL-2B-Instruct`` holds, at toy size: the composite
``config.json`` of ``Qwen3VLForConditionalGeneration`` and its safetensors as transformers'
``save_pretrained`` writes them (``model.visual.*``, ``model.language_model.*``, ``lm_head.*``), a
tokenizer with the family's special tokens and a chat template in the published format, the image
processor's ``preprocessor_config.json`` and the video processor's
``video_preprocessor_config.json`` (small pixel bounds). Nothing is downloaded; the weights are
seeded random values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
"""The Qwen3-VL vision and chat special tokens the stand-in tokenizer holds, in the published order
(their ids follow the 256 bytes)."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A chat template in the Qwen3-VL instruct format: no default system turn, string content as is,
each image part as ``<|vision_start|><|image_pad|><|vision_end|>`` and each video part with
``<|video_pad|>`` (the processor replaces that wrapper by one timestamped run per frame group)."""


def standin_tokenizer() -> Any:
    """A byte-level BPE tokenizer with :data:`SPECIAL_TOKENS` and :data:`CHAT_TEMPLATE` (eos
    ``<|im_end|>``, pad ``<|endoftext|>``, as the published instruct tokenizer)."""
    from omnicore.api import byte_tokenizer

    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_standin(
    folder: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 3,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vision_width: int = 32,
    vision_depth: int = 3,
    vision_heads: int = 2,
    deepstack_indexes: tuple[int, ...] = (0, 1),
    patch_size: int = 16,
    num_position_embeddings: int = 16,
    min_pixels: int = 64 * 64,
    max_pixels: int = 32 * 32 * 16,
    video_max_pixels: int = 32 * 32 * 2 * 16,
    extra_vocab: int = 6,
    seed: int = 0,
) -> Path:
    """Write a tiny random ``Qwen3VLForConditionalGeneration`` with its tokenizer and processor
    files into ``folder`` (created) and return it.

    Args:
        hidden_size, num_layers, num_heads, num_kv_heads: the text model's (head dim
            ``hidden_size / num_heads``; ``mrope_section`` derived to sum to half of it, published
            ``[24, 20, 20]`` for head dim 128).
        vision_width, vision_depth, vision_heads: the vision tower's; its mergers map to ``hidden_size``.
        deepstack_indexes: the tower blocks whose outputs feed the LM's first layers (published
            ``[5, 11, 17]`` of 24 blocks); fewer than ``num_layers``.
        patch_size: pixels per patch side (16 as published; merged 2 x 2, tubelets of 2 frames).
        num_position_embeddings: the learned position grid (a square; 2304 = 48 x 48 published).
        min_pixels, max_pixels: the image processor's bounds (4 to 16 tokens per image).
        video_max_pixels: the video processor's bound over a whole clip (``min_pixels`` its lower one).
        extra_vocab: embedding rows beyond the tokenizer (the published vocabulary is larger too).
        seed: seeds the weights.

    Raises:
        ValueError: ``hidden_size / num_heads`` is not a multiple of 8 (the mRoPE sections need one).

    The text model does not tie its embeddings (as Qwen3-VL-8B; the 2B ties them).
    """
    import torch
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    head_dim = hidden_size // num_heads
    if head_dim % 8:
        raise ValueError(f"save_standin: hidden_size / num_heads = {head_dim} must be a multiple of 8 for the mRoPE sections")
    half = head_dim // 2
    section = [half - 2 * (5 * half // 16), 5 * half // 16, 5 * half // 16]  # [24, 20, 20] for head dim 128
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
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": section, "mrope_interleaved": True},
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    vision = {
        "depth": vision_depth,
        "hidden_size": vision_width,
        "intermediate_size": 2 * vision_width,
        "num_heads": vision_heads,
        "patch_size": patch_size,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": hidden_size,
        "num_position_embeddings": num_position_embeddings,
        "deepstack_visual_indexes": list(deepstack_indexes),
    }
    tokens = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    config = Qwen3VLConfig(vision_config=vision, text_config=text, tie_word_embeddings=False, **tokens)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # post_init's std 0.02 makes a near-constant toy; wider weights make the tests sharper
        for _, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    mean, std = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
    image = Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=patch_size,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=mean,
        image_std=std,
    )
    image.save_pretrained(folder)
    data = json.loads((folder / "preprocessor_config.json").read_text())
    data.update({"processor_class": "Qwen3VLProcessor", "min_pixels": min_pixels, "max_pixels": max_pixels})
    (folder / "preprocessor_config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    video = {  # what Qwen3VLVideoProcessor(...).save_pretrained writes (it needs torchvision to be built)
        "video_processor_type": "Qwen3VLVideoProcessor",
        "processor_class": "Qwen3VLProcessor",
        "do_resize": True,
        "size": {"shortest_edge": min_pixels, "longest_edge": video_max_pixels},
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": mean,
        "image_std": std,
        "do_convert_rgb": True,
        "patch_size": patch_size,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_frames": 4,
        "max_frames": 768,
        "do_sample_frames": True,
        "fps": 2,
        "cap_pixels_per_frame": False,
    }
    (folder / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    return folder
