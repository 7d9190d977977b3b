"""A tiny random Qwen2.5-Omni checkpoint in the published layout, for tests and recipes.

:func:`save_standin` writes what ``Qwen/Qwen2.5-Omni-7B`` holds, at toy size: the composite
``config.json`` of ``Qwen2_5OmniForConditionalGeneration`` and its safetensors as transformers'
``save_pretrained`` writes them (``thinker.audio_tower.*``, ``thinker.visual.*``,
``thinker.model.*``, ``thinker.lm_head.*``, ``talker.*``, ``token2wav.*``), the speakers of
``spk_dict.pt``, a tokenizer with the family's special tokens and the published chat template, and
one ``preprocessor_config.json`` holding the image processor's and the ``WhisperFeatureExtractor``'s
settings (the video processor reads it too), as the published folder does. With ``thinker_only``
it writes a ``Qwen2_5OmniThinkerForConditionalGeneration`` folder instead (``audio_tower.*``,
``visual.*``, ``model.*``, ``lm_head.*``). Nothing is downloaded; the weights are seeded random
values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
)
"""The Qwen2.5-Omni special tokens the stand-in tokenizer holds, in the published order (ids
151643 to 151656 there; here they follow the 256 bytes)."""

NAMED_TOKENS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}
"""The tokenizer's model-specific special tokens, which ``Qwen2_5OmniProcessor`` reads
(``tokenizer.image_token`` and so on), as the published ``tokenizer_config.json`` names them."""

CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}{% if add_audio_id %}Audio {{ audio_count.value }}: {% endif %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The chat template in the published Qwen2.5-Omni format (transformers' processor tests hold the
same text): a default system turn, string content as is, each image part as
``<|vision_bos|><|IMAGE|><|vision_eos|>``, each audio part as ``<|audio_bos|><|AUDIO|><|audio_eos|>``
and each video part as ``<|vision_bos|><|VIDEO|><|vision_eos|>`` (the processor expands the middle
token; with the sound track, into time-aligned chunks of video and audio tokens)."""


def standin_tokenizer() -> Any:
    """A byte-level BPE tokenizer with :data:`SPECIAL_TOKENS`, the named tokens of
    :data:`NAMED_TOKENS` and :data:`CHAT_TEMPLATE` (eos ``<|im_end|>``, pad ``<|endoftext|>``, as
    the published tokenizer)."""
    from transformers import PreTrainedTokenizerFast

    from omnicore.api import byte_tokenizer

    base = byte_tokenizer()
    base.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tok = PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer, extra_special_tokens=list(SPECIAL_TOKENS), model_specific_special_tokens=dict(NAMED_TOKENS)
    )
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _widen(model: Any) -> None:
    """post_init's std 0.02 makes a near-constant toy; wider weights make the tests sharper."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2 and "positional_embedding" not in name:
                p.normal_(0.0, 0.2)


def save_standin(
    folder: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vision_width: int = 32,
    vision_depth: int = 2,
    audio_width: int = 32,
    audio_layers: int = 2,
    audio_window: int = 25,
    max_seconds: int = 4,
    min_pixels: int = 56 * 56,
    max_pixels: int = 112 * 112,
    extra_vocab: int = 8,
    thinker_only: bool = False,
    seed: int = 0,
) -> Path:
    """Write a tiny random ``Qwen2_5OmniForConditionalGeneration`` (or its thinker alone) with its
    tokenizer, processor files and speakers into ``folder`` (created) and return it.

    Args:
        hidden_size, num_layers, num_heads, num_kv_heads: the thinker's text model (head dim
            ``hidden_size / num_heads``, a multiple of 16; ``mrope_section`` in the published ratio
            2:3:3, ``[16, 24, 24]`` for head dim 128).
        vision_width, vision_depth: the vision tower's (patch 14, merged 2 x 2, tubelets of 2
            frames, windows of 56 pixels; its last block attends the whole image as published).
        audio_width, audio_layers, audio_window: the audio tower's; it attends within chunks of
            ``2 * audio_window`` mel frames (published ``n_window`` 100: 2 s).
        max_seconds: the clip length the feature extractor pads every clip to (published 300).
        min_pixels, max_pixels: the image and video processor's bounds (4 to 16 tokens a frame).
        extra_vocab: embedding rows beyond the tokenizer (the published vocabulary is larger too);
            the talker's text tokens and the speaker's start token are among them.
        thinker_only: write a ``Qwen2_5OmniThinkerForConditionalGeneration`` folder.
        seed: seeds the weights.

    Raises:
        ValueError: ``hidden_size / num_heads`` is not a multiple of 16, or ``extra_vocab`` under 4.

    The thinker does not tie its embeddings (as published).
    """
    import torch
    from transformers import (
        Qwen2_5OmniConfig,
        Qwen2_5OmniForConditionalGeneration,
        Qwen2_5OmniThinkerForConditionalGeneration,
        Qwen2VLImageProcessorPil,
        WhisperFeatureExtractor,
    )

    head_dim = hidden_size // num_heads
    if head_dim % 16 or extra_vocab < 4:
        raise ValueError(
            f"save_standin: hidden_size / num_heads = {head_dim} must be a multiple of 16 and extra_vocab ({extra_vocab}) at least 4"
        )
    unit = head_dim // 16
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = standin_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab = len(tok) + extra_vocab
    tts_pad, tts_start, tts_end, speaker_bos = len(tok), len(tok) + 1, len(tok) + 2, len(tok) + 3
    media_ids = {
        "audio_token_index": ids["<|AUDIO|>"],
        "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"],
        "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"],
        "vision_start_token_id": ids["<|vision_bos|>"],
        "vision_end_token_id": ids["<|vision_eos|>"],
    }
    thinker = {
        "audio_config": {
            "d_model": audio_width,
            "encoder_layers": audio_layers,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 2 * audio_width,
            "num_mel_bins": 128,
            "max_source_positions": 2 * audio_window,
            "n_window": audio_window,
            "output_dim": hidden_size,
        },
        "vision_config": {
            "depth": vision_depth,
            "hidden_size": vision_width,
            "intermediate_size": 2 * vision_width,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "out_hidden_size": hidden_size,
            "fullatt_block_indexes": [vision_depth - 1],
        },
        "text_config": {
            "vocab_size": vocab,
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2 * unit, 3 * unit, 3 * unit]},
            "tie_word_embeddings": False,
            "bos_token_id": ids["<|im_start|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        "position_id_per_seconds": 25,
        "seconds_per_chunk": 2,
        "user_token_id": tok.convert_tokens_to_ids("u"),
        "bos_token_id": ids["<|im_start|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        **media_ids,
    }
    codec = 64  # talker codec entries; the last four its control codes (published 8448, 8292-8296)
    talker = {
        "vocab_size": codec,
        "embedding_size": hidden_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
        "tts_codec_pad_token_id": codec - 4,
        "tts_codec_start_token_id": codec - 3,
        "tts_codec_end_token_id": codec - 2,
        "tts_codec_mask_token_id": codec - 1,
        "tts_text_pad_token_id": tts_pad,
        "tts_text_start_token_id": tts_start,
        "tts_text_end_token_id": tts_end,
        **media_ids,
    }
    token2wav = {
        "dit_config": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "head_dim": 16,
            "emb_dim": 16,
            "num_embeds": codec,
            "mel_dim": 16,
            "enc_emb_dim": 8,
            "enc_dim": 8,
            "enc_channels": [8, 8, 8, 8, 24],
            "enc_attention_channels": 4,
            "enc_se_channels": 4,
            "look_ahead_layers": [1],
            "look_backward_layers": [0],
        },
        "bigvgan_config": {
            "mel_dim": 16,
            "upsample_initial_channel": 16,
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
            "upsample_rates": [4, 4],
            "upsample_kernel_sizes": [8, 8],
        },
    }
    config = Qwen2_5OmniConfig(thinker_config=thinker, talker_config=talker, token2wav_config=token2wav)
    torch.manual_seed(seed)
    if thinker_only:
        model = Qwen2_5OmniThinkerForConditionalGeneration(config.thinker_config).eval()
    else:
        model = Qwen2_5OmniForConditionalGeneration(config).eval()
    _widen(model)
    model.save_pretrained(folder)
    if not thinker_only:  # what Qwen2_5OmniForConditionalGeneration.from_pretrained reads (it requires the file)
        g = torch.Generator().manual_seed(seed + 1)
        speaker = {"bos_token": speaker_bos, "cond": torch.randn(8, generator=g), "ref_mel": torch.randn(1, 24, 16, generator=g)}
        torch.save({"Chelsie": speaker}, folder / "spk_dict.pt")
    tok.save_pretrained(folder)
    image = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, merge_size=2, temporal_patch_size=2)
    audio = WhisperFeatureExtractor(feature_size=128, chunk_length=max_seconds, return_attention_mask=True)
    settings = {**audio.to_dict(), **image.to_dict()}
    settings.update(
        {
            "image_processor_type": "Qwen2VLImageProcessor",
            "feature_extractor_type": "WhisperFeatureExtractor",
            "processor_class": "Qwen2_5OmniProcessor",
            "min_pixels": min_pixels,
            "max_pixels": max_pixels,
        }
    )
    settings.pop("mel_filters", None)  # recomputed from feature_size, as the published file has none
    (folder / "preprocessor_config.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return folder
