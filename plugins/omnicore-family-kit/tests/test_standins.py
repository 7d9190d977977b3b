"""The stand-in checkpoints of :mod:`omnicore_family_kit.standins`, checked with transformers' own
classes: each folder loads (model without missing or unexpected keys, the model's own processor),
the processor expands one image (one clip for Qwen2-Audio) into as many placeholder ids as the
model's features have rows, and the forward on those inputs gives finite logits."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from omnicore_family_kit.processors import load_processor
from omnicore_family_kit.standins import MODEL_TYPES, STANDINS, save_standin

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
NEEDS = {"smolvlm": "num2words"}
"""Packages a processor imports that transformers does not install."""

PLACEHOLDERS = {
    "llava": 16,  # (32 / 8)^2 patches; the class token is dropped ("default")
    "llava_next": 36,  # base 16 + one 32 px crop 16 + a newline per crop row 4
    "llava_onevision": 36,  # as llava_next (SigLIP: no class token, "full")
    "internvl": 4,  # 16 patches pixel-shuffled by 0.5 per side
    "idefics3": 4,  # 16 patches, scale factor 2 per side
    "smolvlm": 4,
    "gemma3": 4,  # 16 patches average-pooled to mm_tokens_per_image
    "paligemma": 16,
    "aya_vision": 4,  # 16 patches, downsample factor 2 per side
    "qwen2_vl": 4,  # 32 px resized to 56 px: 4 x 4 patches of 14 merged 2 x 2
    "qwen2_5_vl": 4,
    "qwen3_vl": 4,  # 32 px resized to 64 px: 4 x 4 patches of 16 merged 2 x 2
    "glm4v": 4,
    "minicpmv4_6": 4,  # 64 px: 8 x 8 patches of 8, merged 16x
    "qwen2_audio": 25,  # 1 s: 100 mel frames, conv stride 2, pooled by 2
}
"""Placeholder ids for one image of the type's ``image_size`` (or 1 s of audio), from the geometry."""


def _requirement(model_type: str) -> list:
    need = NEEDS.get(model_type)
    if need is None or importlib.util.find_spec(need) is not None:
        return []
    return [pytest.mark.skip(reason=f"{model_type}'s processor imports {need}, which is not installed")]


@pytest.fixture(scope="module", params=[pytest.param(t, marks=_requirement(t)) for t in MODEL_TYPES])
def loaded(request, tmp_path_factory):
    """``(model_type, folder, model, processor)``: the stand-in written once and loaded with
    transformers (image-text models through ``AutoModelForImageTextToText``)."""
    import transformers
    from transformers import AutoModelForImageTextToText

    model_type = request.param
    folder = save_standin(model_type, tmp_path_factory.mktemp(model_type))
    spec = STANDINS[model_type]
    auto = AutoModelForImageTextToText if spec.modality == "image" else getattr(transformers, spec.model)
    model, info = auto.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, f"{model_type}: keys the class does not expect or misses"
    return model_type, folder, model.eval(), load_processor(folder)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _inputs(model_type: str, processor, count: int = 1):
    """The processor's inputs for one user turn of ``count`` images (clips) and a question, rendered
    by the stand-in's chat template with the generation prompt."""
    spec = STANDINS[model_type]
    content = [{"type": spec.modality}] * count + [{"type": "text", "text": "What is it?"}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
    rng = np.random.default_rng(0)
    if spec.modality == "audio":
        clips = [(0.1 * rng.standard_normal(16000)).astype(np.float32) for _ in range(count)]
        return processor(text=[text], audio=clips, sampling_rate=16000, return_tensors="pt")
    from PIL import Image

    side = spec.image_size
    images = [Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(count)]
    return processor(text=[text], images=images, return_tensors="pt")


def _placeholder(model_type: str, model) -> int:
    return model.config.audio_token_id if STANDINS[model_type].modality == "audio" else model.config.image_token_id


@pytest.mark.slow
def test_folder_loads_with_the_model_types_own_classes(loaded):
    from transformers import AutoConfig, AutoProcessor

    model_type, folder, model, processor = loaded
    spec = STANDINS[model_type]
    assert AutoConfig.from_pretrained(folder).model_type == model_type
    assert type(model).__name__ == spec.model
    assert type(processor).__name__ == spec.processor
    assert (folder / "processor_config.json").is_file() and (folder / "chat_template.jinja").is_file()
    if spec.video is None or HAS_TORCHVISION:
        assert type(AutoProcessor.from_pretrained(folder)).__name__ == spec.processor
    else:  # the limit load_processor works around
        with pytest.raises(ImportError, match="[Tt]orchvision"):
            AutoProcessor.from_pretrained(folder)
    tokenizer = processor.tokenizer
    assert model.config.get_text_config().vocab_size >= len(tokenizer)
    for role, token in spec.roles.items():
        assert getattr(tokenizer, role) == token
    for name, token in spec.named.items():
        assert getattr(tokenizer, name) == token
        assert getattr(tokenizer, f"{name}_id") == tokenizer.convert_tokens_to_ids(token) >= 256


@pytest.mark.slow
def test_placeholders_match_feature_rows_and_forward_is_finite(loaded):
    import inspect

    model_type, _, model, processor = loaded
    spec = STANDINS[model_type]
    inputs = _inputs(model_type, processor)
    ids = inputs["input_ids"]
    with torch.no_grad():
        if spec.modality == "audio":
            frames = inputs["feature_attention_mask"].sum(-1)  # the tower: conv stride 2, then average pool 2
            rows = int((((frames - 1) // 2 + 1 - 2) // 2 + 1).sum())
        else:
            accepted = inspect.signature(model.model.get_image_features).parameters
            features = model.model.get_image_features(**{k: v for k, v in inputs.items() if k in accepted and k != "input_ids"})
            features = getattr(features, "pooler_output", features)
            parts = features if isinstance(features, (list, tuple)) else [features]
            rows = sum(p.reshape(-1, p.shape[-1]).shape[0] for p in parts)
        logits = model(**inputs).logits
    assert int((ids == _placeholder(model_type, model)).sum()) == rows == PLACEHOLDERS[model_type]
    if spec.modality == "image" and hasattr(processor, "_get_num_multimodal_tokens"):  # what vLLM-style callers ask
        side = spec.image_size
        assert processor._get_num_multimodal_tokens(image_sizes=[[side, side]]).num_image_tokens == [rows]
    assert logits.shape == (1, ids.shape[1], model.config.get_text_config().vocab_size)
    assert torch.isfinite(logits).all()


@pytest.mark.slow
def test_chat_template_keeps_strings_and_marks_each_image(loaded):
    model_type, _, model, processor = loaded
    plain = [{"role": "user", "content": "a {plain} string"}, {"role": "assistant", "content": "an answer"}]
    text = processor.apply_chat_template(plain, tokenize=False)
    assert "a {plain} string" in text and text.index("a {plain} string") < text.index("an answer")
    ids = _inputs(model_type, processor, count=2)["input_ids"]
    assert int((ids == _placeholder(model_type, model)).sum()) == 2 * PLACEHOLDERS[model_type]


def test_unknown_type_names_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="llava"):
        save_standin("no_such_model", tmp_path)


@pytest.mark.slow
def test_seed_sets_the_weights(tmp_path):
    from safetensors.torch import load_file

    weights = [load_file(save_standin("llava", tmp_path / str(i), seed=seed) / "model.safetensors") for i, seed in enumerate((0, 0, 1))]
    assert weights[0].keys() == weights[2].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])
