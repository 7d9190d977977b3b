"""A tiny random LLaVA checkpoint in the published layout, for tests and recipes.

:func:`save_standin` writes what a published LLaVA folder holds, at toy size: the composite
``config.json`` of ``LlavaForConditionalGeneration`` and its safetensors (as transformers'
``save_pretrained`` writes them), a tokenizer with ``<image>`` and a chat template, and
``LlavaProcessor``'s files (the tower's own image processor, ``patch_size``,
``vision_feature_select_strategy``, ``num_additional_image_tokens``). Two towers:

* ``tower="clip"``: the llava-1.5 recipe (``llava-hf/llava-1.5-7b-hf``): a CLIP vision tower
  (with its class token), features of the second-to-last layer with the class token dropped
  (``vision_feature_layer=-2``, ``"default"``), a Llama text model, ``CLIPImageProcessor``
  (shortest edge resize, centre crop), ``USER: ... ASSISTANT: ...</s>`` turns.
* ``tower="siglip"``: the SigLIP + Qwen2 recipe (``llava-hf/llava-interleave-qwen-0.5b-hf``): a
  SigLIP tower (no class token, no pooling head), every patch kept (``"full"``), a Qwen2 text model,
  ``SiglipImageProcessor`` (resize to a square), ChatML turns. Its features concatenate two layers
  (``vision_feature_layer=[-3, -1]``) so that the list form is exercised too.

Nothing is downloaded; the weights are seeded random values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

IMAGE_TOKEN = "<image>"

_CONTENT = (
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] | selectattr('type', 'equalto', 'image') -%}{{ '<image>\\n' }}{%- endfor -%}"
    "{%- for part in message['content'] | selectattr('type', 'equalto', 'text') -%}{{ part['text'] }}{%- endfor -%}"
    "{%- endif -%}"
)

CLIP_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] != 'system' -%}{{ message['role'].upper() + ': ' }}{%- endif -%}"
    + _CONTENT
    + "{%- if message['role'] == 'assistant' -%}{{ eos_token }}{%- else -%}{{ ' ' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%}"
)
"""The llava-1.5 turn format (``USER: <image>\\nWhat is it? ASSISTANT: answer</s>``) after the
BOS token. As the published template, list content renders every image (``<image>`` and a newline)
before the text; unlike it, string content is rendered as is and an assistant turn ends with the
EOS token (omnicore renders samples through string contents and stops at that token)."""

CHATML_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}" + _CONTENT + "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
"""The llava-interleave (Qwen2) turn format: ChatML, images first (``<image>`` and a newline)."""

TOWERS = ("clip", "siglip")


def standin_tokenizer(tower: str) -> Any:
    """A byte-level ``PreTrainedTokenizerFast`` holding ``<image>`` and the tower's recipe's special
    tokens and chat template: Llama's ``<unk>``, ``<s>``, ``</s>``, ``<pad>`` for ``clip``; Qwen2's
    ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` for ``siglip``.

    Raises:
        ValueError: ``tower`` is not one of :data:`TOWERS`.
    """
    from omnicore.api import byte_tokenizer

    tok = byte_tokenizer()
    if tower == "clip":
        tok.add_special_tokens({"additional_special_tokens": ["<unk>", "<s>", "</s>", IMAGE_TOKEN, "<pad>"]})
        tok.unk_token, tok.bos_token, tok.eos_token, tok.pad_token = "<unk>", "<s>", "</s>", "<pad>"
        tok.chat_template = CLIP_CHAT_TEMPLATE
    elif tower == "siglip":
        tok.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", IMAGE_TOKEN]})
        tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
        tok.chat_template = CHATML_CHAT_TEMPLATE
    else:
        raise ValueError(f"save_standin: tower={tower!r}; choose one of {', '.join(TOWERS)}")
    return tok


def save_standin(
    folder: str | Path,
    *,
    tower: str = "clip",
    image_size: int = 32,
    patch_size: int = 8,
    vision_width: int = 32,
    vision_layers: int = 3,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vision_feature_layer: int | list[int] | None = None,
    vision_feature_select_strategy: str | None = None,
    extra_vocab: int = 6,
    seed: int = 0,
) -> Path:
    """Write a tiny random ``LlavaForConditionalGeneration`` with its tokenizer and ``LlavaProcessor``
    into ``folder`` (created) and return it.

    Args:
        tower: ``"clip"`` (CLIP tower, Llama LM) or ``"siglip"`` (SigLIP tower, Qwen2 LM); see the
            module docstring.
        image_size, patch_size: the tower's input side and patch side in pixels (an image gives
            ``(image_size // patch_size) ** 2`` patches).
        vision_width, vision_layers: the tower's width and depth.
        hidden_size, num_layers, num_heads, num_kv_heads: the text model's.
        vision_feature_layer, vision_feature_select_strategy: the config's (None: the recipe's,
            ``-2``/``"default"`` for clip, ``[-3, -1]``/``"full"`` for siglip).
        extra_vocab: embedding rows beyond the tokenizer (published LLaVA's text vocabulary is
            larger than its tokenizer too).
        seed: seeds the weights.

    The text model does not tie its embeddings (as published).

    Raises:
        ValueError: ``tower`` is not one of :data:`TOWERS`.
    """
    import torch
    from transformers import (
        CLIPImageProcessorPil,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        SiglipImageProcessorPil,
    )

    folder = Path(folder)
    tok = standin_tokenizer(tower)
    folder.mkdir(parents=True, exist_ok=True)
    clip = tower == "clip"
    vision = {
        "model_type": "clip_vision_model" if clip else "siglip_vision_model",
        "hidden_size": vision_width,
        "intermediate_size": 2 * vision_width,
        "num_hidden_layers": vision_layers,
        "num_attention_heads": 2,
        "image_size": image_size,
        "patch_size": patch_size,
    }
    if not clip:
        vision["vision_use_head"] = False  # as llava-interleave's and llava-onevision's SigLIP
    special = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    text = {
        "model_type": "llama" if clip else "qwen2",
        "vocab_size": len(tok) + extra_vocab,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        **{k: v for k, v in special.items() if v is not None},
    }
    layer = vision_feature_layer if vision_feature_layer is not None else (-2 if clip else [-3, -1])
    strategy = vision_feature_select_strategy or ("default" if clip else "full")
    patches = (image_size // patch_size) ** 2
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=layer,
        vision_feature_select_strategy=strategy,
        image_seq_length=patches + (1 if clip else 0) - (1 if strategy == "default" else 0),
        projector_hidden_act="gelu",
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # post_init's std 0.02 makes a near-constant toy; wider weights make the tests sharper
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.2)
            elif p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    if clip:
        image_processor = CLIPImageProcessorPil(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})
    else:
        image_processor = SiglipImageProcessorPil(size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=patch_size,
        vision_feature_select_strategy=strategy,
        num_additional_image_tokens=1 if clip else 0,
        chat_template=tok.chat_template,
        image_token=IMAGE_TOKEN,
    )
    processor.save_pretrained(folder)
    return folder
