"""The whole family through omnicore's run path (one foundation entry) against transformers'
``Qwen2AudioForConditionalGeneration`` and ``Qwen2AudioProcessor`` on the same clips (fp32):
input ids, logits (text only, one clip, two clips), a packed row, the loss on the assistant
tokens, and the export read back by ``from_pretrained``.

Samples write the published template's ``Audio N: `` prefix and the newline after each clip as
text parts (omnicore renders the text around media itself; see README.md).
"""

from __future__ import annotations

import json
import wave

import numpy as np
import pytest
import torch

from omnicore.api import load_audio
from omnicore.testing import ChatProcessor, Config, build_omni_model, collate, isolated_registry, read_jsonl

IGNORE = -100
CLIPS = {"a.wav": 5600, "b.wav": 30001}


def _write_wav(path, n, seed):
    samples = (0.2 * np.random.default_rng(seed).standard_normal(n)).clip(-1, 1)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((samples * 32767).astype("<i2").tobytes())


SAMPLES = [
    (
        [{"type": "text", "text": "Say hi"}],
        "hi there",
    ),
    (
        [{"type": "text", "text": "Audio 1: "}, {"type": "audio", "path": "a.wav"}, {"type": "text", "text": "\nWhat is it?"}],
        "noise",
    ),
    (
        [
            {"type": "text", "text": "Audio 1: "},
            {"type": "audio", "path": "b.wav"},
            {"type": "text", "text": "\nAudio 2: "},
            {"type": "audio", "path": "a.wav"},
            {"type": "text", "text": "\nWhich is longer?"},
        ],
        "the first",
    ),
]


def _hf_messages(user, answer):
    """The same conversation as transformers' processors take it (the template writes ``Audio N: ``)."""
    content = [{"type": "audio", "audio_url": p["path"]} for p in user if p["type"] == "audio"]
    texts = [p["text"] for p in user if p["type"] == "text"]
    content.append({"type": "text", "text": texts[-1].split("\n")[-1] if len(texts) > 1 else texts[0]})
    return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


@pytest.fixture(scope="module")
def run(standin, tmp_path_factory):
    """``(model, tokenizer, encoded samples, data folder)`` built from the one foundation entry."""
    import omnicore_family_qwen2_audio.plugin as plugin

    data = tmp_path_factory.mktemp("data")
    for i, (name, n) in enumerate(CLIPS.items()):
        _write_wav(data / name, n, seed=i)
    with open(data / "train.jsonl", "w") as f:
        for user, answer in SAMPLES:
            f.write(json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}) + "\n")
    registry = isolated_registry([(plugin, "omnicore-family-qwen2-audio")], builtins=True)
    cfg = Config.model_validate(
        {
            "run": {"output_dir": str(data / "run")},
            "model": {"foundation": {"name": "qwen2_audio", "options": {"checkpoint": str(standin)}}},
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
    clips = [load_audio(data / p["path"]).samples for p in user if p["type"] == "audio"]
    return hf_processor(text=text, audio=clips or None, sampling_rate=16000, return_tensors="pt")


def _logits(model, encoded):
    mb = collate(encoded, model.encoder_processors(), {})
    with torch.no_grad():
        return model(mb, return_logits=True)


def test_one_entry_brings_the_audio_encoder_and_keeps_the_vocabulary(run, standin):
    from transformers import AutoTokenizer

    model, tok, _, _, _ = run
    assert list(model.encoders) == ["audio"] and type(model.encoders["audio"]).__name__ == "Qwen2AudioTower"
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(standin).get_vocab()
    assert sorted(model.part_names) == ["audio_tower", "language_model", "multi_modal_projector"]


@pytest.mark.parametrize("k", [0, 1, 2], ids=["text", "one_clip", "two_clips"])
def test_ids_and_logits_equal_transformers(run, hf_model, hf_processor, k):
    model, _, encoded, data, _ = run
    inputs = _hf_inputs(hf_processor, data, k)
    assert encoded[k].input_ids == inputs["input_ids"][0].tolist()
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


def test_loss_equals_transformers_loss_on_the_assistant_tokens(run, hf_model, hf_processor):
    model, tok, encoded, data, _ = run
    k = 2
    inputs = _hf_inputs(hf_processor, data, k)
    ids = inputs["input_ids"][0].tolist()
    header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    start = max(i for i in range(len(ids)) if ids[i : i + len(header)] == header) + len(header)
    end = ids.index(tok.convert_tokens_to_ids("<|im_end|>"), start) + 1  # the answer and its end of turn
    hf_labels = torch.full((1, len(ids)), IGNORE)
    hf_labels[0, start:end] = torch.tensor(ids[start:end])
    assert [IGNORE] + encoded[k].labels[:-1] == hf_labels[0].tolist()
    out = _logits(model, [encoded[k]])
    with torch.no_grad():
        want = hf_model(**inputs, labels=hf_labels).loss
    torch.testing.assert_close(out.loss_sum / out.n_targets, want, atol=1e-5, rtol=0)


def test_export_is_read_back_by_from_pretrained_with_the_same_logits(run, standin, hf_model, tmp_path):
    from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

    model, tok, encoded, data, registry = run
    foundation = registry.build("foundation", "qwen2_audio", {"checkpoint": str(standin)})
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # "trained": every part moves
            model.lm.model.layers[0].mlp.up_proj.weight.add_(0.05)
            model.lm.lm_head.weight.mul_(1.1)
            model.encoders["audio"].audio_tower.layers[1].fc1.weight.add_(0.05)
            model.encoders["audio"].multi_modal_projector.linear.bias.add_(0.1)
        foundation.export_pretrained(model, tok, tmp_path / "hf")
        back = Qwen2AudioForConditionalGeneration.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
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
