"""A tiny random Qwen2-Audio checkpoint in the published layout, for tests and recipes.

:func:`save_standin` writes what ``Qwen/Qwen2-Audio-7B-Instruct`` holds, at toy size: the composite
``config.json`` of ``Qwen2AudioForConditionalGeneration`` and its safetensors (as transformers'
``save_pretrained`` writes them), a tokenizer with the family's special tokens and the published
chat template, and ``Qwen2AudioProcessor`` with its ``WhisperFeatureExtractor``. Nothing is
downloaded; the weights are seeded random values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")
"""The Qwen2-Audio special tokens the stand-in tokenizer holds (their ids follow the 256 bytes)."""

CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The chat template in the format Qwen/Qwen2-Audio-7B-Instruct publishes: a default system turn,
string content as is, and each audio part of list content as ``Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>``
plus a newline (``Qwen2AudioProcessor`` then repeats ``<|AUDIO|>`` once per output frame)."""


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
    d_model: int = 32,
    encoder_layers: int = 2,
    encoder_heads: int = 2,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    num_mel_bins: int = 128,
    max_seconds: int = 2,
    extra_vocab: int = 6,
    seed: int = 0,
) -> Path:
    """Write a tiny random ``Qwen2AudioForConditionalGeneration`` with its tokenizer and processor
    into ``folder`` (created) and return it.

    Args:
        d_model, encoder_layers, encoder_heads: the audio tower's width, depth and heads.
        hidden_size, num_layers, num_heads, num_kv_heads: the Qwen2 text model's.
        num_mel_bins: mel bins of the feature extractor and the tower (128 as published).
        max_seconds: the clip length every clip is padded to (whole seconds; published: 30). The
            tower's ``max_source_positions`` is ``max_seconds * 50`` (16 kHz, hop 160, stride 2).
        extra_vocab: embedding rows beyond the tokenizer (the published text vocabulary is
            larger than its tokenizer too).
        seed: seeds the weights.

    The text model does not tie its embeddings (as published).
    """
    import torch
    from transformers import (
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = standin_tokenizer()
    audio_id = tok.convert_tokens_to_ids("<|AUDIO|>")
    config = Qwen2AudioConfig(
        audio_config={
            "model_type": "qwen2_audio_encoder",
            "d_model": d_model,
            "encoder_layers": encoder_layers,
            "encoder_attention_heads": encoder_heads,
            "encoder_ffn_dim": 2 * d_model,
            "num_mel_bins": num_mel_bins,
            "max_source_positions": 50 * max_seconds,
        },
        text_config={
            "model_type": "qwen2",
            "vocab_size": len(tok) + extra_vocab,
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
            "bos_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
            "eos_token_id": tok.convert_tokens_to_ids("<|im_end|>"),
            "pad_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
        },
        audio_token_index=audio_id,
    )
    torch.manual_seed(seed)
    model = Qwen2AudioForConditionalGeneration(config).eval()
    with torch.no_grad():  # post_init's std 0.02 makes a near-constant toy; wider weights make the tests sharper
        for name, p in model.named_parameters():
            if p.ndim >= 2 and "embed_positions" not in name:
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    fe = WhisperFeatureExtractor(feature_size=num_mel_bins, chunk_length=max_seconds, return_attention_mask=True)
    processor = Qwen2AudioProcessor(feature_extractor=fe, tokenizer=tok, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(folder)
    return folder
