"""The whole family through omnicore's run path (one foundation entry) against transformers'
``Qwen3VLForConditionalGeneration`` and its processor on the same images and clips (fp32): input
ids, logits (text only, one image, two images, a clip), the 3-D positions, a packed row, the loss
on the assistant tokens, greedy generation with an image, and the export read back by
``from_pretrained``.

The clip (8 frames at 3 fps) is sampled to 5 frames at 2 fps (3 frame groups, the last frame
repeated), each group written after its timestamp; its groups outnumber nothing, but each is its
own position block, so the text after it starts where ``get_rope_index`` puts it. Every image and
clip sample also runs the DeepStack rows through the LM's first two layers; the sample with a
clip and an image joins both modalities' rows in sequence order, as ``Qwen3VLModel.forward`` does.
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
import torch

from omnicore.api import load_image, load_video
from omnicore.testing import ChatProcessor, Config, build_omni_model, collate, generate_batch, isolated_registry, read_jsonl

IGNORE = -100


def _write_video(path, frames: np.ndarray, fps: int) -> None:
    """RGB frames [T, H, W, 3] as lossless FFV1 in Matroska."""
    import av

    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=Fraction(fps))
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "bgr0"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())


SAMPLES = [
    ([{"type": "text", "text": "Say hi"}], "hi there"),
    ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "What is it?"}], "noise"),
    (
        [
            {"type": "text", "text": "Compare "},
            {"type": "image", "path": "b.png"},
            {"type": "text", "text": " and "},
            {"type": "image", "path": "a.png"},
            {"type": "text", "text": "."},
        ],
        "the first is larger",
    ),
    ([{"type": "video", "path": "c.mkv"}, {"type": "text", "text": "What happens?"}], "it flickers"),
    (
        [{"type": "video", "path": "c.mkv"}, {"type": "text", "text": "then"}, {"type": "image", "path": "a.png"}],
        "a still",
    ),
]


def _hf_messages(user, answer):
    """The same conversation as transformers' processors take it (parts in order)."""
    content = [p if p["type"] == "text" else {"type": p["type"]} for p in user]
    return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


@pytest.fixture(scope="session")
def data(tmp_path_factory, image, frames):
    """The data folder: two PNG images, one lossless clip, and train.jsonl of :data:`SAMPLES`."""
    folder = tmp_path_factory.mktemp("data")
    image(60, 45, seed=1).save(folder / "a.png")
    image(100, 120, seed=2).save(folder / "b.png")
    _write_video(folder / "c.mkv", frames(8, 50, 80, seed=3), fps=3)
    with open(folder / "train.jsonl", "w") as f:
        for user, answer in SAMPLES:
            f.write(json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}) + "\n")
    return folder


_RUNS: dict[str, tuple] = {}


@pytest.fixture
def run(standin, data):
    """``(model, tokenizer, encoded samples, registry, chat processor)`` from the one foundation entry."""
    if str(standin) not in _RUNS:
        import omnicore_family_qwen3_vl.plugin as plugin

        registry = isolated_registry([(plugin, "omnicore-family-qwen3-vl")], builtins=True)
        cfg = Config.model_validate(
            {
                "run": {"output_dir": str(data / "run")},
                "model": {"foundation": {"name": "qwen3_vl", "options": {"checkpoint": str(standin)}}},
                "data": {"train": str(data / "train.jsonl")},
            }
        )
        torch.manual_seed(0)
        model, tok = build_omni_model(cfg, registry)
        model.eval()
        proc = ChatProcessor.for_model(tok, model, cfg.data)
        _RUNS[str(standin)] = (model, tok, [proc.encode(s) for s in read_jsonl(data / "train.jsonl")], registry, proc)
    return _RUNS[str(standin)]


def _hf_inputs(hf_processor, data, k, *, prompt_only=False):
    user, answer = SAMPLES[k]
    messages = _hf_messages(user, answer)[:1] if prompt_only else _hf_messages(user, answer)
    text = hf_processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt_only)
    images = [load_image(data / p["path"]) for p in user if p["type"] == "image"]
    clips = [load_video(data / p["path"]) for p in user if p["type"] == "video"]
    kwargs = {"images": images or None, "videos": [c.frames for c in clips] or None}
    if clips:
        kwargs["video_metadata"] = [{"total_num_frames": len(c.frames), "fps": float(c.fps)} for c in clips]
    return hf_processor(text=text, return_tensors="pt", **kwargs)


def _logits(model, encoded):
    mb = collate(encoded, model.encoder_processors(), {})
    with torch.no_grad():
        return model(mb, return_logits=True)


def test_one_entry_brings_one_tower_for_images_and_video(run, standin):
    from transformers import AutoTokenizer

    model, tok, _, _, _ = run
    assert list(model.encoders) == ["image"] and type(model.encoders["image"]).__name__ == "Qwen3VLVisionTower"
    assert model.shared["video"][0] == "image" and model.shared["video"][1].placeholder == "<|video_pad|>"
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(standin).get_vocab()
    assert sorted(model.part_names) == ["language_model", "merger", "visual"]
    assert type(model.lm.model).__name__ == "Qwen3VLTextModel" and model.layer_inputs is not None


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4], ids=["text", "one_image", "two_images", "video", "video_and_image"])
def test_ids_and_logits_equal_transformers(run, hf_model, hf_processor, data, k):
    model, _, encoded, _, _ = run
    inputs = _hf_inputs(hf_processor, data, k)
    assert encoded[k].input_ids == inputs["input_ids"][0].tolist()
    if k == 3:  # three frame groups, each after its timestamp
        assert inputs["video_grid_thw"][0].tolist() == [3, 4, 4]  # 50 x 80 frames at 64 x 64
        assert "<0.3 seconds><|vision_start|>" in hf_processor.tokenizer.decode(inputs["input_ids"][0])
    with torch.no_grad():
        want = hf_model(**inputs).logits[0]
    torch.testing.assert_close(_logits(model, [encoded[k]]).logits[0], want, atol=1e-5, rtol=0)


def test_deepstack_rows_change_the_logits(run):
    """The layer inputs are used: without them the image sample's logits move."""
    model, _, encoded, _, _ = run
    with_rows = _logits(model, [encoded[1]]).logits[0]
    keep = model.layer_inputs
    model.layer_inputs = lambda mask, per_layer: {"visual_pos_masks": mask, "deepstack_visual_embeds": [0 * x for x in per_layer]}
    try:
        without = _logits(model, [encoded[1]]).logits[0]
    finally:
        model.layer_inputs = keep
    assert not torch.allclose(with_rows, without, atol=1e-3)


@pytest.mark.parametrize("k", [2, 3, 4], ids=["two_images", "video", "video_and_image"])
def test_positions_equal_get_rope_index(run, hf_model, hf_processor, data, k):
    """The data side's 3-D positions are transformers' ``get_rope_index``."""
    _, _, encoded, _, _ = run
    inputs = _hf_inputs(hf_processor, data, k)
    kwargs = {key: inputs[key] for key in ("image_grid_thw", "video_grid_thw") if key in inputs}
    want, _ = hf_model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"], **kwargs)
    assert encoded[k].rope_position_ids == want[:, 0].tolist()


def test_packed_row_equals_each_sample_alone(run):
    model, _, encoded, _, _ = run
    packed = _logits(model, encoded).logits[0]
    start = 0
    for e in encoded:
        alone = _logits(model, [e]).logits[0]
        torch.testing.assert_close(packed[start : start + len(e.input_ids)], alone, atol=1e-5, rtol=0)
        start += len(e.input_ids)


def test_loss_equals_transformers_loss_on_the_assistant_tokens(run, hf_model, hf_processor, data):
    model, tok, encoded, _, _ = run
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


def test_export_is_read_back_by_from_pretrained_with_the_same_logits(run, standin, hf_model, hf_processor_of, data, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    model, tok, encoded, registry, _ = run
    foundation = registry.build("foundation", "qwen3_vl", {"checkpoint": str(standin)})
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # "trained": every part moves
            model.lm.model.layers[0].mlp.up_proj.weight.add_(0.05)
            model.lm.lm_head.weight.mul_(1.1)
            model.encoders["image"].visual.blocks[1].norm2.weight.add_(0.05)
            model.encoders["image"].visual.pos_embed.weight.add_(0.05)
            next(model.encoders["image"].visual.deepstack_merger_list[1].parameters()).add_(0.1)
        foundation.export_pretrained(model, tok, tmp_path / "hf")
        with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f, safe_open(str(standin / "model.safetensors"), "pt") as g:
            assert sorted(f.keys()) == sorted(g.keys())  # the names save_pretrained writes
        back = AutoModelForImageTextToText.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
        assert type(back) is type(hf_model)
        proc = hf_processor_of(tmp_path / "hf")
        for k in (0, 2, 3):
            inputs = _hf_inputs(proc, data, k)
            assert inputs["input_ids"][0].tolist() == encoded[k].input_ids
            with torch.no_grad():
                want = back(**inputs).logits[0]
            torch.testing.assert_close(_logits(model, [encoded[k]]).logits[0], want, atol=1e-5, rtol=0)
            with torch.no_grad():  # the trained change is in the export (the stand-in gives other logits)
                assert not torch.allclose(hf_model(**inputs).logits[0], want, atol=1e-3)
    finally:
        model.load_state_dict(state)


def test_greedy_generation_equals_transformers_generate(run, hf_model, hf_processor, data):
    """Greedy continuation of prompts with media, DeepStack rows in the prefill: omnicore's batched
    generation (two prompts of other lengths, left-padded together) gives each prompt the tokens
    ``Qwen3VLForConditionalGeneration.generate`` gives it alone."""
    model, tok, _, _, proc = run
    samples = read_jsonl(data / "train.jsonl")
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    prompts = [proc.encode(samples[k], prompt_only=True) for k in (1, 4)]
    got = generate_batch(model, tok, prompts, max_new_tokens=12, stop_id=stop)
    for (k, prompt), out in zip(zip((1, 4), prompts), got):
        inputs = _hf_inputs(hf_processor, data, k, prompt_only=True)
        assert prompt.input_ids == inputs["input_ids"][0].tolist()
        with torch.no_grad():
            ids = hf_model.generate(**inputs, max_new_tokens=12, do_sample=False, eos_token_id=stop, pad_token_id=tok.pad_token_id)
        want = ids[0, inputs["input_ids"].shape[1] :].tolist()
        assert out["token_ids"] == want, k
        assert len(want) >= 4  # enough tokens to pass the prefill and several cached steps
