"""The whole family through omnicore's run path (one foundation entry) against transformers'
``LlavaForConditionalGeneration`` and ``LlavaProcessor`` on the same images (fp32), for both
stand-ins: input ids, logits (text only, one image, two images), a packed row, the loss on the
assistant tokens, and the export read back by ``from_pretrained``.

The stand-ins' templates render every image of a message (``<image>`` and a newline) before its
text; samples write that newline as text after each image part (omnicore renders the text around
media itself; see README.md).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from omnicore.api import load_image
from omnicore.testing import ChatProcessor, Config, build_omni_model, collate, isolated_registry, read_jsonl

IGNORE = -100
IMAGES = {"a.png": (40, 52), "b.png": (70, 33)}
SAMPLES = [
    ([{"type": "text", "text": "Say hi"}], "hi there"),
    ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "\nWhat is it?"}], "noise"),
    (
        [
            {"type": "image", "path": "b.png"},
            {"type": "text", "text": "\n"},
            {"type": "image", "path": "a.png"},
            {"type": "text", "text": "\nWhich is wider?"},
        ],
        "the first",
    ),
]
HEADERS = {"clip": "ASSISTANT: ", "siglip": "<|im_start|>assistant\n"}
"""The text before an assistant turn's content in each stand-in's template."""


def _hf_messages(user, answer):
    """The same conversation as transformers' processor takes it (images first, then the text)."""
    content = [{"type": "image"} for p in user if p["type"] == "image"]
    content.append({"type": "text", "text": [p["text"] for p in user if p["type"] == "text"][-1].lstrip("\n")})
    return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


@pytest.fixture(scope="module")
def run(standin, tmp_path_factory):
    """``(model, tokenizer, encoded samples, data folder, registry)`` built from the one foundation entry."""
    import omnicore_family_llava.plugin as plugin

    data = tmp_path_factory.mktemp("data")
    for i, (name, (w, h)) in enumerate(IMAGES.items()):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(data / name)
    with open(data / "train.jsonl", "w") as f:
        for user, answer in SAMPLES:
            f.write(json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}) + "\n")
    registry = isolated_registry([(plugin, "omnicore-family-llava")], builtins=True)
    cfg = Config.model_validate(
        {
            "run": {"output_dir": str(data / "run")},
            "model": {"foundation": {"name": "llava", "options": {"checkpoint": str(standin)}}},
            "data": {"train": str(data / "train.jsonl")},
        }
    )
    torch.manual_seed(0)
    model, tok = build_omni_model(cfg, registry)
    model.eval()
    proc = ChatProcessor.for_model(tok, model, cfg.data)
    encoded = [proc.encode(s) for s in read_jsonl(data / "train.jsonl")]
    return model, tok, encoded, data, registry


def _hf_inputs(hf_processor, data, k):
    user, answer = SAMPLES[k]
    text = hf_processor.apply_chat_template(_hf_messages(user, answer), tokenize=False)
    images = [load_image(data / p["path"]) for p in user if p["type"] == "image"]
    return hf_processor(text=text, images=images or None, return_tensors="pt")


def _logits(model, encoded):
    mb = collate(encoded, model.encoder_processors(), {})
    with torch.no_grad():
        return model(mb, return_logits=True)


def test_one_entry_brings_the_image_encoder_and_keeps_the_vocabulary(run, standin):
    from transformers import AutoTokenizer

    model, tok, _, _, _ = run
    assert list(model.encoders) == ["image"] and type(model.encoders["image"]).__name__ == "LlavaVisionTower"
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(standin).get_vocab()
    assert sorted(model.part_names) == ["language_model", "multi_modal_projector", "vision_tower"]


@pytest.mark.parametrize("k", [0, 1, 2], ids=["text", "one_image", "two_images"])
def test_ids_and_logits_equal_transformers(run, hf_model, hf_processor, k):
    model, _, encoded, data, _ = run
    inputs = _hf_inputs(hf_processor, data, k)
    assert encoded[k].input_ids == inputs["input_ids"][0].tolist()
    assert int((inputs["input_ids"] == hf_model.config.image_token_id).sum()) == 16 * [0, 1, 2][k]  # 16 rows per image
    with torch.no_grad():
        want = hf_model(**inputs).logits[0]
    torch.testing.assert_close(_logits(model, [encoded[k]]).logits[0], want, atol=1e-5, rtol=0)


def test_packed_row_equals_each_sample_alone(run):
    model, _, encoded, _, _ = run
    packed = _logits(model, encoded).logits[0]
    start = 0
    for e in encoded:
        alone = _logits(model, [e]).logits[0]
        torch.testing.assert_close(packed[start : start + len(e.input_ids)], alone, atol=1e-5, rtol=0)
        start += len(e.input_ids)
    assert start == packed.shape[0]


def test_loss_equals_transformers_loss_on_the_assistant_tokens(run, hf_model, hf_processor, tower):
    model, tok, encoded, data, _ = run
    k = 2
    inputs = _hf_inputs(hf_processor, data, k)
    ids = inputs["input_ids"][0].tolist()
    header = tok.encode(HEADERS[tower], add_special_tokens=False)
    start = max(i for i in range(len(ids)) if ids[i : i + len(header)] == header) + len(header)
    end = ids.index(tok.convert_tokens_to_ids(hf_processor.tokenizer.eos_token), start) + 1  # the answer and its end of turn
    hf_labels = torch.full((1, len(ids)), IGNORE)
    hf_labels[0, start:end] = torch.tensor(ids[start:end])
    assert [IGNORE] + encoded[k].labels[:-1] == hf_labels[0].tolist()
    out = _logits(model, [encoded[k]])
    with torch.no_grad():
        want = hf_model(**inputs, labels=hf_labels).loss
    torch.testing.assert_close(out.loss_sum / out.n_targets, want, atol=1e-5, rtol=0)


def _keys(folder):
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_export_is_read_back_by_from_pretrained_with_the_same_logits(run, standin, hf_model, tmp_path):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model, tok, encoded, data, registry = run
    foundation = registry.build("foundation", "llava", {"checkpoint": str(standin)})
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # "trained": every part moves
            model.lm.model.layers[0].mlp.up_proj.weight.add_(0.05)
            model.lm.lm_head.weight.mul_(1.1)
            model.encoders["image"].vision_tower.encoder.layers[0].mlp.fc1.weight.add_(0.05)
            model.encoders["image"].multi_modal_projector.linear_1.bias.add_(0.1)
        foundation.export_pretrained(model, tok, tmp_path / "hf")
        assert _keys(tmp_path / "hf") == _keys(standin)  # the names LlavaForConditionalGeneration.save_pretrained writes
        back = LlavaForConditionalGeneration.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
        proc = AutoProcessor.from_pretrained(tmp_path / "hf")
        for k in (0, 2):
            inputs = _hf_inputs(proc, data, k)
            assert inputs["input_ids"][0].tolist() == encoded[k].input_ids
            with torch.no_grad():
                want = back(**inputs).logits[0]
            torch.testing.assert_close(_logits(model, [encoded[k]]).logits[0], want, atol=1e-5, rtol=0)
            with torch.no_grad():  # the trained change is in the export (the stand-in gives other logits)
                assert not torch.allclose(hf_model(**inputs).logits[0], want, atol=1e-3)
    finally:
        model.load_state_dict(state)
