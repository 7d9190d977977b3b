"""A tiny random CSM checkpoint in the published layout, for tests and recipes.

:func:`save_standin` writes what ``sesame/csm-1b`` holds, at toy size: the composite ``config.json``
of ``CsmForConditionalGeneration`` (backbone, depth decoder, Mimi codec) and its safetensors, as
transformers' ``save_pretrained`` writes them, a tokenizer with CSM's special tokens and its chat
template, and ``CsmProcessor`` with its ``EncodecFeatureExtractor``. Nothing is downloaded; the
weights are seeded random values. The codec keeps Mimi's published convolutions (24 kHz, 1920
samples a frame), so ``CsmProcessor``'s own frame count applies to it; its channels, codebooks and
transformer are small.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>")
"""CSM's special tokens (Llama 3's ``<|begin_of_text|>`` and ``<|end_of_text|>``; ``<|AUDIO|>`` and
``<|audio_eos|>`` where ``sesame/csm-1b`` has them, ids 128002 and 128003), after the 256 bytes here."""

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if not message['role'] is string or not message['role'].isdigit() %}"
    "{{- raise_exception(\"The role must be an integer or a stringified integer (e.g. '0') designating the speaker id\") }}"
    "{%- endif %}"
    "{%- set content = message['content'] %}"
    "{%- if content is string or content is not iterable %}{{- raise_exception('The content must be a list') }}{%- endif %}"
    "{%- set types = content | map(attribute='type') | list %}"
    "{%- if 'text' not in types %}{{- raise_exception(\"Each message must include one item of type 'text'\") }}{%- endif %}"
    "{%- if not loop.last and 'audio' not in types %}"
    "{{- raise_exception(\"Each message (except the last) must contain exactly one 'text' and one 'audio' item.\") }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{{- bos_token }}{{- '[' + message['role'] + ']' }}"
    "{%- for item in message['content'] %}{%- if item['type'] == 'text' %}{{- item['text'] }}{%- endif %}{%- endfor %}"
    "{{- eos_token }}"
    "{%- if message['content'] | selectattr('type', 'equalto', 'audio') | list %}{{- '<|AUDIO|><|audio_eos|>' }}{%- endif %}"
    "{%- endfor %}"
)
"""CSM's chat template, as ``sesame/csm-1b`` publishes it: each message is one speaker's segment,
its role the speaker id: ``<|begin_of_text|>[role]text<|end_of_text|>``, then
``<|AUDIO|><|audio_eos|>`` when it holds audio (``CsmProcessor`` repeats ``<|AUDIO|>`` once per
frame)."""


def standin_tokenizer() -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with :data:`SPECIAL_TOKENS` and
    :data:`CHAT_TEMPLATE` (bos ``<|begin_of_text|>``, eos and pad ``<|end_of_text|>``)."""
    from omnicore.api import byte_tokenizer

    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tok.bos_token, tok.eos_token, tok.pad_token = "<|begin_of_text|>", "<|end_of_text|>", "<|end_of_text|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_standin(
    folder: str | Path,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    num_codebooks: int = 4,
    codebook_entries: int = 16,
    depth_hidden_size: int = 16,
    depth_layers: int = 2,
    codec_hidden_size: int = 16,
    extra_vocab: int = 6,
    seed: int = 0,
) -> Path:
    """Write a tiny random ``CsmForConditionalGeneration`` with its tokenizer and processor into
    ``folder`` (created) and return it.

    The weights are N(0, 0.2^2), Mimi's codebooks N(0, 1); the codebook-0 head and the depth
    decoder's heads score the three ids past Mimi's entries 0 (zero rows).

    Args:
        hidden_size, num_layers, num_heads, num_kv_heads: the backbone's.
        num_codebooks: ``K``, Mimi's quantizers (published: 32).
        codebook_entries: each Mimi codebook's entries; CSM's codebook vocabulary is three more
            (published: 2048 and 2051, the last id ``codebook_pad_token_id``).
        depth_hidden_size, depth_layers: the depth decoder's.
        codec_hidden_size: Mimi's latent width (its transformer: one layer).
        extra_vocab: text embedding rows beyond the tokenizer (the published ``text_vocab_size``
            128256 exceeds Llama 3's tokenizer too).
        seed: seeds the weights.
    """
    import torch
    from transformers import CsmConfig, CsmForConditionalGeneration, CsmProcessor, EncodecFeatureExtractor

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = standin_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab = codebook_entries + 3
    codec = {
        "model_type": "mimi",
        "hidden_size": codec_hidden_size,
        "num_filters": 4,
        "codebook_size": codebook_entries,
        "codebook_dim": 8,
        "num_quantizers": num_codebooks,
        "vector_quantization_hidden_dimension": 8,
        "upsample_groups": codec_hidden_size,
        "num_hidden_layers": 1,
        "intermediate_size": 2 * codec_hidden_size,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": codec_hidden_size // 2,
        "sliding_window": 32,
        "max_position_embeddings": 256,
    }
    depth = {
        "num_codebooks": num_codebooks,
        "backbone_hidden_size": hidden_size,
        "vocab_size": vocab,
        "hidden_size": depth_hidden_size,
        "intermediate_size": 2 * depth_hidden_size,
        "num_hidden_layers": depth_layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": num_codebooks + 1,
    }
    config = CsmConfig(
        num_codebooks=num_codebooks,
        vocab_size=vocab,
        text_vocab_size=len(tok) + extra_vocab,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=2048,
        codebook_pad_token_id=vocab - 1,
        codebook_eos_token_id=0,
        bos_token_id=ids["<|begin_of_text|>"],
        eos_token_id=ids["<|end_of_text|>"],
        pad_token_id=ids["<|AUDIO|>"],
        audio_token_id=ids["<|AUDIO|>"],
        audio_eos_token_id=ids["<|audio_eos|>"],
        depth_decoder_config=depth,
        codec_config=codec,
    )
    torch.manual_seed(seed)
    model = CsmForConditionalGeneration(config).eval()
    with torch.no_grad():  # post_init's std 0.02 makes a near-constant toy; wider weights make the tests sharper
        for name, p in model.named_parameters():
            if p.ndim >= 2 and not name.startswith("codec_model."):
                p.normal_(0.0, 0.2)
        for name, b in model.codec_model.named_buffers():  # Mimi's codebooks are buffers (zeros as built)
            if name.endswith("codebook.embed_sum"):
                b.normal_(0.0, 1.0)
        # the three ids past Mimi's entries are never targets in training: their head rows score 0,
        # so a greedy frame holds codes the codec can decode (as a trained checkpoint's would)
        model.lm_head.weight[codebook_entries:] = 0.0
        model.depth_decoder.codebooks_head.weight[:, :, codebook_entries:] = 0.0
    model.save_pretrained(folder)
    fe = EncodecFeatureExtractor(feature_size=1, sampling_rate=config.codec_config.sampling_rate, padding_value=0.0)
    CsmProcessor(feature_extractor=fe, tokenizer=tok, chat_template=CHAT_TEMPLATE).save_pretrained(folder)
    return folder
