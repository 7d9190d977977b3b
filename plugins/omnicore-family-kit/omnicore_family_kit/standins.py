"""Tiny random stand-in checkpoints of many transformers multimodal model types, for tests.

:func:`save_standin` writes, for one model type, what a published checkpoint folder holds, at toy
size: the composite ``...ForConditionalGeneration`` saved with ``save_pretrained`` (the published
key layout, seeded random weights), a byte-level tokenizer holding the model's special tokens and a
chat template in the model's published style, and the model's own processor class saved with
``save_pretrained`` (``processor_config.json``). Nothing is downloaded.

Each type is one :class:`Standin` row of :data:`STANDINS`: its special tokens, its turn format,
its config (text model, tower, token ids), and its processor's parts and arguments. One image of
:attr:`Standin.image_size` pixels gives a few (4 to 36) placeholder tokens.

transformers builds some processors' video processors on torchvision (``Qwen2VLVideoProcessor``,
``Glm4vVideoProcessor``, ...). Where torchvision is missing, :func:`load_processor` gives the
processor class a stand-in video processor holding the saved settings (images work, videos raise);
elsewhere it is ``AutoProcessor.from_pretrained``. Three types cannot be built at all without
torchvision and are left out: ``mistral3`` (``PixtralProcessor`` is marked as needing it, and its
module imports the torchvision image processor), ``lfm2_vl`` and ``cohere2_vision`` (their image
processors have no PIL backend).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnicore_family_kit.processors import processor_class_without_torchvision, video_processor

# -- turn formats -----------------------------------------------------------------------------------


def _lit(text: str) -> str:
    """``text`` for a Jinja template; as an expression where it starts with a newline, which
    transformers' ``trim_blocks`` would drop after a block tag."""
    return "{{ " + json.dumps(text) + " }}" if text.startswith("\n") else text


def chat_template(
    heads: dict[str, str],
    tails: dict[str, str],
    markers: dict[str, str],
    *,
    prologue: str = "",
    system: str | None = None,
    media_first: bool = False,
) -> str:
    """A Jinja chat template: ``prologue``, then per message ``heads[role]``, its content,
    ``tails[role]`` (roles ``system``, ``user``, ``assistant``); ``heads["assistant"]`` again when
    ``add_generation_prompt``.

    String content is written as is. In list content, a part of type ``t`` in ``markers`` is
    written as ``markers[t]`` (it may read the 1-based counters ``count.<t>``, as Qwen2-Audio's
    ``Audio {{ count.audio }}:``), a text part as its text; ``media_first`` writes every media part
    before the text parts (as LLaVA's published templates do). ``system``: the content of a system
    turn written before a first message that is not one (Qwen2-VL's default).
    """

    def role_switch(table: dict[str, str]) -> str:
        branches = [
            f"{'if' if i == 0 else 'elif'} message['role'] == '{role}' %}}{_lit(text)}{{%" for i, (role, text) in enumerate(table.items())
        ]
        return "{% " + " ".join(branches) + " endif %}"

    def parts(select: str) -> str:
        media = "".join(
            f"{{% elif part['type'] == '{kind}' %}}{{% set count.{kind} = count.{kind} + 1 %}}{_lit(marker)}"
            for kind, marker in markers.items()
        )
        return f"{{% for part in message['content']{select} %}}{{% if part['type'] == 'text' %}}{{{{ part['text'] }}}}{media}{{% endif %}}{{% endfor %}}"

    listed = parts(" if part['type'] != 'text'") + parts(" if part['type'] == 'text'") if media_first else parts("")
    first = ""
    if system is not None:
        first = f"{{% if loop.first and message['role'] != 'system' %}}{_lit(heads['system'] + system + tails['system'])}{{% endif %}}"
    counters = ", ".join(f"{kind}=0" for kind in markers)
    return (
        f"{prologue}{{% set count = namespace({counters}) %}}{{% for message in messages %}}{first}{role_switch(heads)}"
        f"{{% if message['content'] is string %}}{{{{ message['content'] }}}}{{% else %}}{listed}{{% endif %}}"
        f"{role_switch(tails)}{{% endfor %}}{{% if add_generation_prompt %}}{_lit(heads['assistant'])}{{% endif %}}"
    )


def _same(text: str) -> dict[str, str]:
    return {"system": text, "user": text, "assistant": text}


def _chatml(markers: dict[str, str], **kw: Any) -> str:
    heads = {r: f"<|im_start|>{r}\n" for r in ("system", "user", "assistant")}
    return chat_template(heads, _same("<|im_end|>\n"), markers, **kw)


CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_VISION_TOKENS = (
    *CHATML_TOKENS,
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
QWEN_ROLES = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
QWEN_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
IDEFICS3_TOKENS = (
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
)

# -- sizes ------------------------------------------------------------------------------------------

WIDTH = 32
"""Width of every text model and tower (mRoPE text models: 64, for a head dim of 16)."""


def _text(model_type: str, vocab: int, ids: dict[str, int], **over: Any) -> dict[str, Any]:
    """A 2-layer text model config of ``vocab`` rows, width :data:`WIDTH`, 4 heads and 2 KV heads
    (head dim 8), with the token ``ids`` (``bos_token_id``, ...) and ``over`` on top."""
    base = {
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": WIDTH,
        "intermediate_size": 2 * WIDTH,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
    }
    return {**base, **ids, **over}


def _tower(model_type: str, image: int, patch: int, **over: Any) -> dict[str, Any]:
    """A 2-layer ViT config of width :data:`WIDTH` and 2 heads for ``image``-pixel images cut into
    ``patch``-pixel patches, with ``over`` on top."""
    base = {
        "model_type": model_type,
        "hidden_size": WIDTH,
        "intermediate_size": 2 * WIDTH,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": image,
        "patch_size": patch,
    }
    return {**base, **over}


def _mrope(section: list[int] | None = None, **rope: Any) -> dict[str, Any]:
    """Width 64 with 4 heads (head dim 16) and the 3-D rotary sections ``section`` (T, H, W) over
    the rotary frequencies (8; 4 with GLM-4V's ``partial_rotary_factor`` 0.5 in ``rope``, the other
    ``rope_parameters``). None: Qwen2-VL's split (published ``[16, 24, 24]`` of 64), ``[2, 3, 3]``."""
    half = 8
    section = section or [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    parameters = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section, **rope}
    return {"hidden_size": 64, "intermediate_size": 128, "rope_parameters": parameters}


SLIDING = {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]}
"""One sliding-window layer and one global layer (Gemma3's and Cohere2's pattern, in 2 layers)."""


# -- the table --------------------------------------------------------------------------------------

Ids = Callable[[str], int]
"""token -> its id in the stand-in tokenizer."""


@dataclass(frozen=True)
class Standin:
    """One model type's stand-in.

    Attributes:
        model: the transformers class saved (``LlavaForConditionalGeneration``).
        tokens: the special tokens, in id order after the 256 byte symbols.
        roles: the tokenizer's ``bos_token`` / ``eos_token`` / ``pad_token`` / ``unk_token``.
        named: the tokenizer's model-specific named tokens (``image_token``, ``boi_token``, ...)
            that the processor reads as attributes.
        template: the chat template.
        config: ``(id, vocab) -> kwargs`` of ``AutoConfig.for_model(model_type, ...)``.
        parts: the processor's sub-processors: ``name -> (transformers class, kwargs)``.
        processor: the processor class and ``processor_kwargs`` its extra arguments.
        video: the video processor's class name and the settings it is saved with (None: the
            processor holds none).
        image_size: the side of the square image the tests use (4 to 36 placeholders).
        modality: ``"image"`` or ``"audio"``.
    """

    model: str
    tokens: tuple[str, ...]
    roles: dict[str, str]
    template: str
    config: Callable[[Ids, int], dict[str, Any]]
    parts: dict[str, tuple[str, dict[str, Any]]]
    processor: str
    processor_kwargs: dict[str, Any] = field(default_factory=dict)
    named: dict[str, str] = field(default_factory=dict)
    video: tuple[str, dict[str, Any]] | None = None
    image_size: int = 32
    modality: str = "image"


def _ids(t: Ids, **tokens: str) -> dict[str, int]:
    return {k: t(v) for k, v in tokens.items()}


def _qwen_ids(t: Ids) -> dict[str, int]:
    return _ids(t, bos_token_id="<|endoftext|>", eos_token_id="<|im_end|>", pad_token_id="<|endoftext|>")


def _qwen_vl(
    model: str,
    processor: str,
    video: str,
    text_type: str,
    vision: dict[str, Any],
    *,
    patch: int,
    system: str | None = None,
    mean_std: float | None = None,
    rope: dict[str, Any] | None = None,
    **text: Any,
) -> Standin:
    """A Qwen-VL stand-in: Qwen's special tokens and ChatML turns (``system``: the default system
    turn), an mRoPE text model of type ``text_type`` (``text``: its extra kwargs), a 2-layer tower
    of ``patch``-pixel patches merged 2 x 2 (``vision``: its width kwargs), images resized to at
    least 4 x 4 patches (4 tokens). ``mean_std``: the image processor's mean and std per channel
    (Qwen3-VL's 0.5; None: the class default, CLIP's). ``rope``: the text model's width and rotary
    parameters (None: :func:`_mrope`'s default)."""
    side = 4 * patch
    stats = {} if mean_std is None else {"image_mean": [mean_std] * 3, "image_std": [mean_std] * 3}
    pixels = {"shortest_edge": side * side, "longest_edge": 4 * side * side}
    return Standin(
        model=model,
        tokens=QWEN_VISION_TOKENS,
        roles=QWEN_ROLES,
        template=_chatml({"image": QWEN_IMAGE, "video": QWEN_VIDEO}, system=system),
        config=lambda t, v: {
            "text_config": _text(text_type, v, _qwen_ids(t), **(rope or _mrope()), **text),
            "vision_config": {"depth": 2, "num_heads": 2, "patch_size": patch, **vision},
            **_ids(
                t,
                image_token_id="<|image_pad|>",
                video_token_id="<|video_pad|>",
                vision_start_token_id="<|vision_start|>",
                vision_end_token_id="<|vision_end|>",
            ),
        },
        parts={"image_processor": ("Qwen2VLImageProcessorPil", {"size": pixels, "patch_size": patch, **stats})},
        processor=processor,
        video=(video, {"size": pixels, "patch_size": patch, "temporal_patch_size": 2, "merge_size": 2, **stats}),
    )


_CLIP_PROC = ("CLIPImageProcessorPil", {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}})
_PINPOINTS = [[32, 32], [32, 64], [64, 32]]

STANDINS: dict[str, Standin] = {
    "llava": Standin(
        model="LlavaForConditionalGeneration",
        tokens=("<unk>", "<s>", "</s>", "<pad>", "<image>"),
        roles={"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"},
        template=chat_template(
            {"system": "", "user": "USER: ", "assistant": "ASSISTANT:"},
            {"system": " ", "user": " ", "assistant": "</s>"},
            {"image": "<image>\n"},
            prologue="{{ bos_token }}",
            media_first=True,
        ),
        config=lambda t, v: {
            "text_config": _text("llama", v, _ids(t, bos_token_id="<s>", eos_token_id="</s>", pad_token_id="<pad>")),
            "vision_config": _tower("clip_vision_model", 32, 8),
            "image_token_id": t("<image>"),
            "image_seq_length": 16,
        },
        parts={"image_processor": _CLIP_PROC},
        processor="LlavaProcessor",
        processor_kwargs={"patch_size": 8, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1},
    ),
    "llava_next": Standin(
        model="LlavaNextForConditionalGeneration",
        tokens=("<unk>", "<s>", "</s>", "<pad>", "<image>"),
        roles={"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"},
        template=chat_template(
            {"system": "", "user": "[INST] ", "assistant": ""},
            {"system": "\n", "user": " [/INST]", "assistant": "</s>"},
            {"image": "<image>\n"},
            prologue="{{ bos_token }}",
            media_first=True,
        ),
        config=lambda t, v: {
            "text_config": _text("mistral", v, _ids(t, bos_token_id="<s>", eos_token_id="</s>", pad_token_id="<pad>")),
            "vision_config": _tower("clip_vision_model", 32, 8),
            "image_token_id": t("<image>"),
            "image_grid_pinpoints": _PINPOINTS,
            "image_seq_length": 16,
        },
        parts={
            "image_processor": (
                "LlavaNextImageProcessorPil",
                {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}, "image_grid_pinpoints": _PINPOINTS},
            )
        },
        processor="LlavaNextProcessor",
        processor_kwargs={"patch_size": 8, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1},
    ),
    "llava_onevision": Standin(
        model="LlavaOnevisionForConditionalGeneration",
        tokens=(*CHATML_TOKENS, "<image>", "<video>"),
        roles=QWEN_ROLES,
        template=_chatml({"image": "<image>\n", "video": "<video>\n"}, media_first=True),
        config=lambda t, v: {
            "text_config": _text("qwen2", v, _qwen_ids(t)),
            "vision_config": _tower("siglip_vision_model", 32, 8, vision_use_head=False),
            "image_token_id": t("<image>"),
            "video_token_id": t("<video>"),
            "image_grid_pinpoints": _PINPOINTS,
            "vision_feature_layer": -1,
        },
        parts={
            "image_processor": (
                "LlavaOnevisionImageProcessorPil",
                {"size": {"height": 32, "width": 32}, "image_grid_pinpoints": _PINPOINTS},
            )
        },
        processor="LlavaOnevisionProcessor",
        processor_kwargs={"num_image_tokens": 16, "vision_feature_select_strategy": "full"},
        video=("LlavaOnevisionVideoProcessor", {"size": {"height": 32, "width": 32}}),
    ),
    "internvl": Standin(
        model="InternVLForConditionalGeneration",
        tokens=(*CHATML_TOKENS, "<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
        roles=QWEN_ROLES,
        named={"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"},
        template=_chatml({"image": "<IMG_CONTEXT>\n", "video": "<video>\n"}),
        config=lambda t, v: {
            "text_config": _text("qwen2", v, _qwen_ids(t)),
            "vision_config": _tower("internvl_vision", 32, 8),
            "image_token_id": t("<IMG_CONTEXT>"),
            "image_seq_length": 4,
            "downsample_ratio": 0.5,
        },
        parts={"image_processor": ("GotOcr2ImageProcessorPil", {"size": {"height": 32, "width": 32}, "crop_to_patches": False})},
        processor="InternVLProcessor",
        processor_kwargs={"image_seq_length": 4},
        video=("InternVLVideoProcessor", {"size": {"height": 32, "width": 32}}),
    ),
    "idefics3": Standin(
        model="Idefics3ForConditionalGeneration",
        tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", *IDEFICS3_TOKENS),
        roles={"bos_token": "<|begin_of_text|>", "eos_token": "<end_of_utterance>", "pad_token": "<|finetune_right_pad_id|>"},
        template=chat_template(
            {"system": "System:", "user": "User:", "assistant": "Assistant:"},
            _same("<end_of_utterance>\n"),
            {"image": "<image>"},
            prologue="<|begin_of_text|>",
        ),
        config=lambda t, v: {
            "text_config": _text(
                "llama",
                v,
                _ids(t, bos_token_id="<|begin_of_text|>", eos_token_id="<end_of_utterance>", pad_token_id="<|finetune_right_pad_id|>"),
            ),
            "vision_config": _tower("idefics3_vision", 32, 8),
            "image_token_id": t("<image>"),
            "scale_factor": 2,
        },
        parts={
            "image_processor": (
                "Idefics3ImageProcessorPil",
                {"do_image_splitting": False, "size": {"longest_edge": 32}, "max_image_size": {"longest_edge": 32}},
            )
        },
        processor="Idefics3Processor",
        processor_kwargs={"image_seq_len": 4},
    ),
    "smolvlm": Standin(
        model="SmolVLMForConditionalGeneration",
        tokens=("<|im_start|>", "<|im_end|>", "<|endoftext|>", *IDEFICS3_TOKENS, "<video>"),
        roles={"bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>", "pad_token": "<|endoftext|>"},
        named={
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
            "video_token": "<video>",
        },
        template=chat_template(
            {"system": "System:", "user": "User:", "assistant": "Assistant:"},
            _same("<end_of_utterance>\n"),
            {"image": "<image>"},
            prologue="<|im_start|>",
        ),
        config=lambda t, v: {
            "text_config": _text(
                "llama", v, _ids(t, bos_token_id="<|im_start|>", eos_token_id="<end_of_utterance>", pad_token_id="<|endoftext|>")
            ),
            "vision_config": _tower("smolvlm_vision", 32, 8),
            "image_token_id": t("<image>"),
            "scale_factor": 2,
        },
        parts={
            "image_processor": (
                "SmolVLMImageProcessorPil",
                {"do_image_splitting": False, "size": {"longest_edge": 32}, "max_image_size": {"longest_edge": 32}},
            )
        },
        processor="SmolVLMProcessor",
        processor_kwargs={"image_seq_len": 4},
        video=("SmolVLMVideoProcessor", {"size": {"longest_edge": 32}, "max_image_size": {"longest_edge": 32}, "fps": 1, "num_frames": 64}),
    ),
    "gemma3": Standin(
        model="Gemma3ForConditionalGeneration",
        tokens=(
            "<pad>",
            "<eos>",
            "<bos>",
            "<unk>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ),
        roles={"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"},
        named={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
        template=chat_template(
            {"system": "<start_of_turn>user\n", "user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"},
            _same("<end_of_turn>\n"),
            {"image": "<start_of_image>"},
            prologue="{{ bos_token }}",
        ),
        config=lambda t, v: {
            "text_config": _text(
                "gemma3_text",
                v,
                _ids(t, bos_token_id="<bos>", eos_token_id="<eos>", pad_token_id="<pad>"),
                head_dim=8,
                query_pre_attn_scalar=8,
                **SLIDING,
            ),
            "vision_config": _tower("siglip_vision_model", 32, 8, vision_use_head=False),
            "mm_tokens_per_image": 4,
            "boi_token_index": t("<start_of_image>"),
            "eoi_token_index": t("<end_of_image>"),
            "image_token_index": t("<image_soft_token>"),
        },
        parts={"image_processor": ("Gemma3ImageProcessorPil", {"size": {"height": 32, "width": 32}})},
        processor="Gemma3Processor",
        processor_kwargs={"image_seq_length": 4},
    ),
    "paligemma": Standin(
        model="PaliGemmaForConditionalGeneration",
        tokens=("<pad>", "<eos>", "<bos>", "<unk>", "<image>"),
        roles={"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"},
        named={"image_token": "<image>"},
        template=chat_template(_same(""), {"system": "\n", "user": "\n", "assistant": "<eos>"}, {"image": "<image>"}),
        config=lambda t, v: {
            "text_config": _text("gemma", v, _ids(t, bos_token_id="<bos>", eos_token_id="<eos>", pad_token_id="<pad>"), head_dim=8),
            "vision_config": _tower("siglip_vision_model", 32, 8, vision_use_head=False, projection_dim=WIDTH),
            "image_token_index": t("<image>"),
            "projection_dim": WIDTH,
        },
        parts={"image_processor": ("SiglipImageProcessorPil", {"size": {"height": 32, "width": 32}, "image_seq_length": 16})},
        processor="PaliGemmaProcessor",
    ),
    "aya_vision": Standin(
        model="AyaVisionForConditionalGeneration",
        tokens=(
            "<PAD>",
            "<UNK>",
            "<BOS_TOKEN>",
            "<|END_OF_TURN_TOKEN|>",
            "<|START_OF_TURN_TOKEN|>",
            "<|USER_TOKEN|>",
            "<|CHATBOT_TOKEN|>",
            "<|SYSTEM_TOKEN|>",
            "<image>",
            "<|START_OF_IMG|>",
            "<|END_OF_IMG|>",
            "<|IMG_PATCH|>",
            "<|IMG_LINE_BREAK|>",
            "TILE",
            "TILE_GLOBAL",
        ),
        roles={"pad_token": "<PAD>", "unk_token": "<UNK>", "bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"},
        template=chat_template(
            {r: f"<|START_OF_TURN_TOKEN|><|{r.upper()}_TOKEN|>" for r in ("system", "user")}
            | {"assistant": "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
            _same("<|END_OF_TURN_TOKEN|>"),
            {"image": "<image>"},
            prologue="{{ bos_token }}",
        ),
        config=lambda t, v: {
            "text_config": _text(
                "cohere2",
                v,
                _ids(t, bos_token_id="<BOS_TOKEN>", eos_token_id="<|END_OF_TURN_TOKEN|>", pad_token_id="<PAD>"),
                **SLIDING,
            ),
            "vision_config": _tower("siglip_vision_model", 32, 8, vision_use_head=False),
            "image_token_id": t("<|IMG_PATCH|>"),
            "downsample_factor": 2,
            "adapter_layer_norm_eps": 1e-5,
        },
        parts={"image_processor": ("GotOcr2ImageProcessorPil", {"size": {"height": 32, "width": 32}, "crop_to_patches": False})},
        processor="AyaVisionProcessor",
        processor_kwargs={"patch_size": 8, "img_size": 32, "downsample_factor": 2},
    ),
    "qwen2_vl": _qwen_vl(
        "Qwen2VLForConditionalGeneration",
        "Qwen2VLProcessor",
        "Qwen2VLVideoProcessor",
        "qwen2_vl_text",
        {"embed_dim": WIDTH, "hidden_size": 64, "mlp_ratio": 2},
        patch=14,
        system="You are a helpful assistant.",
    ),
    "qwen2_5_vl": _qwen_vl(
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen2_5_VLProcessor",
        "Qwen2VLVideoProcessor",
        "qwen2_5_vl_text",
        {"hidden_size": WIDTH, "intermediate_size": 2 * WIDTH, "out_hidden_size": 64, "window_size": 56, "fullatt_block_indexes": [1]},
        patch=14,
        system="You are a helpful assistant.",
    ),
    "qwen3_vl": _qwen_vl(
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLProcessor",
        "Qwen3VLVideoProcessor",
        "qwen3_vl_text",
        {
            "hidden_size": WIDTH,
            "intermediate_size": 2 * WIDTH,
            "out_hidden_size": 64,
            "num_position_embeddings": 16,
            "deepstack_visual_indexes": [0],
        },
        patch=16,
        mean_std=0.5,
        rope=_mrope([4, 2, 2], mrope_interleaved=True),  # published: [24, 20, 20] of 64, interleaved
        head_dim=16,
    ),
    "glm4v": Standin(
        model="Glm4vForConditionalGeneration",
        tokens=(
            "<|endoftext|>",
            "[gMASK]",
            "<sop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|begin_of_image|>",
            "<|end_of_image|>",
            "<|image|>",
            "<|begin_of_video|>",
            "<|end_of_video|>",
            "<|video|>",
        ),
        roles={"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        template=chat_template(
            {r: f"<|{r}|>\n" for r in ("system", "user", "assistant")},
            _same(""),
            {"image": "<|begin_of_image|><|image|><|end_of_image|>", "video": "<|begin_of_video|><|video|><|end_of_video|>"},
            prologue="[gMASK]<sop>",
        ),
        config=lambda t, v: {
            "text_config": _text(
                "glm4v_text",
                v,
                _ids(t, bos_token_id="<|endoftext|>", eos_token_id="<|endoftext|>", pad_token_id="<|endoftext|>"),
                **_mrope([2, 1, 1], partial_rotary_factor=0.5),  # published: [8, 12, 12] of 32
            ),
            "vision_config": {
                "depth": 2,
                "hidden_size": WIDTH,
                "intermediate_size": 2 * WIDTH,
                "out_hidden_size": 64,
                "num_heads": 2,
                "patch_size": 14,
                "image_size": 56,
            },
            **_ids(
                t,
                image_token_id="<|image|>",
                video_token_id="<|video|>",
                image_start_token_id="<|begin_of_image|>",
                image_end_token_id="<|end_of_image|>",
                video_start_token_id="<|begin_of_video|>",
                video_end_token_id="<|end_of_video|>",
            ),
        },
        parts={
            "image_processor": ("Glm4vImageProcessorPil", {"size": {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}, "patch_size": 14})
        },
        processor="Glm4vProcessor",
        video=(
            "Glm4vVideoProcessor",
            {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "size": {"shortest_edge": 3136, "longest_edge": 12544}},
        ),
    ),
    "minicpmv4_6": Standin(
        model="MiniCPMV4_6ForConditionalGeneration",
        tokens=(*QWEN_VISION_TOKENS, "<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>"),
        roles=QWEN_ROLES,
        named={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "image_start_token": "<image>",
            "image_end_token": "</image>",
            "slice_start_token": "<slice>",
            "slice_end_token": "</slice>",
            "image_id_start_token": "<image_id>",
            "image_id_end_token": "</image_id>",
        },
        template=_chatml({"image": "<|image_pad|>", "video": "<|video_pad|>"}),
        config=lambda t, v: {
            "text_config": _text(
                "qwen3_5_text",
                v,
                _qwen_ids(t),
                head_dim=8,
                linear_key_head_dim=8,
                linear_value_head_dim=8,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                layer_types=["linear_attention", "full_attention"],
            ),
            "vision_config": _tower("minicpmv4_6_vision", 64, 8),
            "image_size": 64,
            "insert_layer_id": 0,
            **_ids(t, image_token_id="<|image_pad|>", video_token_id="<|video_pad|>"),
        },
        parts={
            "image_processor": (
                "MiniCPMV4_6ImageProcessorPil",
                {"scale_resolution": 64, "patch_size": 8, "slice_mode": False, "max_slice_nums": 1},
            )
        },
        processor="MiniCPMV4_6Processor",
        video=("MiniCPMV4_6VideoProcessor", {"scale_resolution": 64, "patch_size": 8, "slice_mode": False, "downsample_mode": "16x"}),
        image_size=64,
    ),
    "qwen2_audio": Standin(
        model="Qwen2AudioForConditionalGeneration",
        tokens=(*CHATML_TOKENS, "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"),
        roles=QWEN_ROLES,
        template=_chatml(
            {"audio": "Audio {{ count.audio }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"}, system="You are a helpful assistant."
        ),
        config=lambda t, v: {
            "text_config": _text("qwen2", v, _qwen_ids(t)),
            "audio_config": {
                "model_type": "qwen2_audio_encoder",
                "d_model": WIDTH,
                "encoder_layers": 2,
                "encoder_attention_heads": 2,
                "encoder_ffn_dim": 2 * WIDTH,
                "num_mel_bins": 128,
                "max_source_positions": 100,
            },
            "audio_token_id": t("<|AUDIO|>"),
        },
        parts={"feature_extractor": ("WhisperFeatureExtractor", {"feature_size": 128, "chunk_length": 2, "return_attention_mask": True})},
        processor="Qwen2AudioProcessor",
        modality="audio",
    ),
}

MODEL_TYPES: tuple[str, ...] = tuple(STANDINS)
"""The model types :func:`save_standin` writes."""


# -- building ---------------------------------------------------------------------------------------


def _standin(model_type: str) -> Standin:
    if model_type not in STANDINS:
        raise ValueError(f"save_standin: model_type {model_type!r} has no stand-in; choose one of {', '.join(MODEL_TYPES)}")
    return STANDINS[model_type]


def standin_tokenizer(model_type: str) -> Any:
    """The byte-level ``PreTrainedTokenizerFast`` of ``model_type``'s stand-in: the 256 byte
    symbols (ids 0-255), then :attr:`Standin.tokens` as special tokens, its role and named tokens
    and its chat template.

    Raises:
        ValueError: ``model_type`` is not in :data:`MODEL_TYPES`.
    """
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    from omnicore.api import byte_tokenizer

    spec = _standin(model_type)
    backend = byte_tokenizer().backend_tokenizer
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec.tokens])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, extra_special_tokens=list(spec.tokens), **spec.roles, **spec.named)
    tok.chat_template = spec.template
    return tok


def save_standin(model_type: str, folder: str | Path, *, seed: int = 0) -> Path:
    """Write ``model_type``'s tiny random checkpoint into ``folder`` (created) and return it.

    The folder holds ``config.json`` and ``model.safetensors`` of :attr:`Standin.model`, the
    tokenizer (:func:`standin_tokenizer`) and the processor's files. The weights are seeded
    (``seed``) normal values of std 0.2 (wider than ``post_init``'s, so features differ per input).

    Raises:
        ValueError: ``model_type`` is not in :data:`MODEL_TYPES`.
        ImportError: from transformers, where the processor needs a package that is missing
            (``smolvlm``: num2words).
    """
    import torch
    import transformers
    from transformers import AutoConfig

    spec = _standin(model_type)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = standin_tokenizer(model_type)
    parts = {name: getattr(transformers, cls)(**kwargs) for name, (cls, kwargs) in spec.parts.items()}
    if spec.video is not None:
        parts["video_processor"] = video_processor(*spec.video)
    processor_class = processor_class_without_torchvision(spec.processor, spec.video is not None)
    processor = processor_class(tokenizer=tok, chat_template=spec.template, **parts, **spec.processor_kwargs)
    # some processors add tokens to the tokenizer (PaliGemma's location tokens): size the vocabulary after
    vocab = len(tok) + 6  # embedding rows beyond the tokenizer, as published vocabularies have
    config = AutoConfig.for_model(model_type, **spec.config(tok.convert_tokens_to_ids, vocab))
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2 and p.requires_grad:  # frozen tables (Whisper's sinusoids) stay as built
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
