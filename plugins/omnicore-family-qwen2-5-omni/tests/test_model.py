"""The whole family through omnicore's run path (one foundation entry, hf_inputs) against transformers'
``Qwen2_5OmniThinkerForConditionalGeneration`` and ``Qwen2_5OmniProcessor`` on the same images,
clips and sound (fp32): input ids, logits (text only, an image, audio, a silent clip, a clip with
its sound track, and all at once), the 3-D positions against ``get_rope_index``, a packed row, the
loss on the assistant tokens and greedy generation.

The clip with sound (6 frames at 2 fps, 3 s of sound) is written as its processor writes it with
``load_audio_from_video``: ``<|vision_bos|><|audio_bos|>``, then 2-second chunks of video tokens
(frame groups at 0, 1 and 2 s) and audio tokens (25 a second) in turn, then
``<|audio_eos|><|vision_eos|>``: two chunks each, so the interleave and the time-aligned positions
(TMRoPE) are both exercised; its audio rows come from the audio encoder.
"""

from __future__ import annotations

import json

import pytest
import torch

from omnicore.testing import collate, generate_batch, read_jsonl

IGNORE = -100

SAMPLES = [
    ([{"type": "text", "text": "Say hi"}], "hi there"),
    ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "What is it?"}], "noise"),
    ([{"type": "audio", "path": "s.wav"}, {"type": "text", "text": "What is said?"}], "a tone"),
    ([{"type": "video", "path": "c.mkv"}, {"type": "text", "text": "What happens?"}], "it flickers"),
    ([{"type": "video", "path": "d.mkv"}, {"type": "text", "text": "What happens?"}], "it hums"),
    (
        [
            {"type": "audio", "path": "t.wav"},
            {"type": "text", "text": "then"},
            {"type": "image", "path": "b.png"},
            {"type": "video", "path": "d.mkv"},
            {"type": "text", "text": "."},
        ],
        "all of it",
    ),
]
NAMES = ["text", "image", "audio", "silent_video", "video_with_audio", "audio_image_video"]


@pytest.fixture(scope="session")
def data(tmp_path_factory, image, wave, frames, video_file):
    """The data folder: two PNG images, two WAV clips, a silent clip and a clip with a sound track
    (lossless), and train.jsonl of :data:`SAMPLES`."""
    import soundfile as sf

    folder = tmp_path_factory.mktemp("data")
    image(60, 45, seed=1).save(folder / "a.png")
    image(100, 120, seed=2).save(folder / "b.png")
    sf.write(folder / "s.wav", wave(1.3, seed=1), 16000, subtype="FLOAT")
    sf.write(folder / "t.wav", wave(0.7, seed=2), 16000, subtype="FLOAT")
    video_file(folder / "c.mkv", frames(4, 50, 80, seed=3), fps=2)
    video_file(folder / "d.mkv", frames(6, 56, 56, seed=4), fps=2, wave=wave(3.0, seed=3))
    with open(folder / "train.jsonl", "w") as f:
        for user, answer in SAMPLES:
            f.write(json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}) + "\n")
    return folder


@pytest.fixture
def run(standin, data, omni_run):
    """``(model, tokenizer, encoded samples, registry, chat processor)`` from the one foundation entry
    (``use_audio_in_video: true``)."""
    model, tok, proc, registry = omni_run(standin, data, use_audio_in_video=True)
    return model, tok, [proc.encode(s) for s in read_jsonl(data / "train.jsonl")], registry, proc


@pytest.fixture
def hf_inputs(hf_call):
    """``(hf_processor, data, k, prompt_only=False) ->`` transformers' processor outputs of sample
    ``k`` and whether a clip carries sound (conftest's ``hf_inputs_for``)."""
    return lambda hf_processor, data, k, *, prompt_only=False: hf_call(hf_processor, data, *SAMPLES[k], prompt_only=prompt_only)


def _logits(model, encoded):
    mb = collate(encoded, model.encoder_processors(), {})
    with torch.no_grad():
        return model(mb, return_logits=True)


def test_one_entry_brings_both_towers(run, standin):
    from transformers import AutoTokenizer

    model, tok, _, _, _ = run
    assert list(model.encoders) == ["image", "audio"]
    assert type(model.encoders["image"]).__name__ == "Qwen2_5OmniVisionTower"
    assert type(model.encoders["audio"]).__name__ == "Qwen2_5OmniAudioTower"
    assert model.shared["video"][0] == "image" and model.shared["video"][1].placeholder == "<|VIDEO|>"
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(standin).get_vocab()
    assert sorted(model.part_names) == ["audio_tower", "language_model", "merger", "visual"]
    assert type(model.lm.model).__name__ == "Qwen2_5OmniThinkerTextModel"


@pytest.mark.parametrize("k", range(len(SAMPLES)), ids=NAMES)
def test_ids_and_logits_equal_transformers(run, hf_thinker, hf_processor, data, k, hf_inputs):
    model, _, encoded, _, _ = run
    inputs, with_sound = hf_inputs(hf_processor, data, k)
    assert encoded[k].input_ids == inputs["input_ids"][0].tolist()
    with torch.no_grad():
        want = hf_thinker(**inputs, use_audio_in_video=with_sound).logits[0]
    torch.testing.assert_close(_logits(model, [encoded[k]]).logits[0], want, atol=1e-5, rtol=0)


def test_the_clip_with_sound_is_interleaved_in_two_second_chunks(run, hf_processor, data):
    """Sample 4's clip: 3 frame groups of 4 tokens (at 0, 1, 2 s) and 75 audio tokens (3 s),
    written as video 0-1 s, audio 0-2 s, video 2 s, audio 2-3 s."""
    _, tok, encoded, _, _ = run
    ids = encoded[4].input_ids
    names = {tok.convert_tokens_to_ids(t): t for t in ("<|VIDEO|>", "<|AUDIO|>", "<|audio_bos|>", "<|vision_bos|>")}
    runs: list[list] = []
    for i in ids:
        name = names.get(i)
        if name in ("<|VIDEO|>", "<|AUDIO|>") and runs and runs[-1][0] == name:
            runs[-1][1] += 1
        elif name:
            runs.append([name, 1])
    assert runs == [["<|vision_bos|>", 1], ["<|audio_bos|>", 1], ["<|VIDEO|>", 8], ["<|AUDIO|>", 50], ["<|VIDEO|>", 4], ["<|AUDIO|>", 25]]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5], ids=NAMES[1:])
def test_positions_equal_get_rope_index(run, hf_thinker, hf_processor, data, k, hf_inputs):
    """The data side's 3-D positions are transformers' ``get_rope_index`` (with
    ``use_audio_in_video`` where a clip carries sound)."""
    _, _, encoded, _, _ = run
    inputs, with_sound = hf_inputs(hf_processor, data, k)
    lengths = inputs["feature_attention_mask"].sum(-1) if "feature_attention_mask" in inputs else None
    want, _ = hf_thinker.model.get_rope_index(
        inputs["input_ids"],
        inputs.get("image_grid_thw"),
        inputs.get("video_grid_thw"),
        inputs["attention_mask"],
        with_sound,
        lengths,
        inputs.get("video_second_per_grid"),
    )
    assert encoded[k].rope_position_ids == want[:, 0].tolist()


def test_packed_row_equals_each_sample_alone(run):
    model, _, encoded, _, _ = run
    packed = _logits(model, encoded).logits[0]
    start = 0
    for e in encoded:
        alone = _logits(model, [e]).logits[0]
        torch.testing.assert_close(packed[start : start + len(e.input_ids)], alone, atol=1e-5, rtol=0)
        start += len(e.input_ids)


def test_loss_equals_transformers_loss_on_the_assistant_tokens(run, hf_thinker, hf_processor, data, hf_inputs):
    model, tok, encoded, _, _ = run
    k = 5
    inputs, with_sound = hf_inputs(hf_processor, data, k)
    ids = inputs["input_ids"][0].tolist()
    header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    start = max(i for i in range(len(ids)) if ids[i : i + len(header)] == header) + len(header)
    end = ids.index(tok.convert_tokens_to_ids("<|im_end|>"), start) + 1  # the answer and its end of turn
    hf_labels = torch.full((1, len(ids)), IGNORE)
    hf_labels[0, start:end] = torch.tensor(ids[start:end])
    assert [IGNORE] + encoded[k].labels[:-1] == hf_labels[0].tolist()
    out = _logits(model, [encoded[k]])
    with torch.no_grad():
        want = hf_thinker(**inputs, labels=hf_labels, use_audio_in_video=with_sound).loss
    torch.testing.assert_close(out.loss_sum / out.n_targets, want, atol=1e-5, rtol=0)


def test_greedy_generation_equals_transformers_generate(run, hf_thinker, hf_processor, data, hf_inputs):
    """Greedy continuation of prompts with an image and with a clip and its sound: omnicore's
    batched generation (two prompts of other lengths, left-padded together) gives each prompt the
    tokens ``Qwen2_5OmniThinkerForConditionalGeneration.generate`` gives it alone."""
    model, tok, _, _, proc = run
    samples = read_jsonl(data / "train.jsonl")
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    prompts = [proc.encode(samples[k], prompt_only=True) for k in (1, 4)]
    got = generate_batch(model, tok, prompts, max_new_tokens=10, stop_id=stop)
    for k, prompt, out in zip((1, 4), prompts, got):
        inputs, with_sound = hf_inputs(hf_processor, data, k, prompt_only=True)
        assert prompt.input_ids == inputs["input_ids"][0].tolist()
        with torch.no_grad():
            ids = hf_thinker.generate(
                **inputs,
                use_audio_in_video=with_sound,
                max_new_tokens=10,
                do_sample=False,
                eos_token_id=stop,
                pad_token_id=tok.pad_token_id,
            )
        want = ids[0, inputs["input_ids"].shape[1] :].tolist()
        assert out["token_ids"] == want, k
        assert len(want) >= 4  # enough tokens to pass the prefill and several cached steps
