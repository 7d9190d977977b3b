"""Multi-dimensional rotary positions (mRoPE): omnicore's per-sample 3-D positions against the
library's own position functions, packed rows against samples alone, batched generation against one
prompt at a time, and a checkpoint round trip of the text-only foundation."""

from __future__ import annotations

import dataclasses
import functools
import json
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_SIGLIP, tiny_config_dict

from omnicore.data.packing import MicroBatch
from omnicore.data.positions import RopeLayout, mrope_positions, next_position, rope_layout

MROPE_LM = {
    "model_type": "qwen2_vl",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
}

# one sample: 3 text, an image of merged grid (1, 2, 3), 2 text, a video (5, 2, 2) (t > max(h, w)), 4 text
SEGMENTS = [("text", 3), ("image", (1, 2, 3)), ("text", 2), ("video", (5, 2, 2)), ("text", 4)]


def _blocks(segments):
    at, blocks = 0, []
    for kind, v in segments:
        if kind == "text":
            at += v
        else:
            blocks.append((at, v))
            at += v[0] * v[1] * v[2]
    return at, blocks


def test_positions_match_qwen2_vl_get_rope_index():
    """Text, an image and a video: the rows equal transformers' ``Qwen2VLModel.get_rope_index``
    (spatial merge 2, so its grids are twice ours in h and w), which resumes text at ``start +
    max(h, w)`` after the video; ``next_position`` is its ``rope_deltas`` + length."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    merge = 2
    length, blocks = _blocks(SEGMENTS)
    types = []
    for kind, v in SEGMENTS:
        types += [0] * v if kind == "text" else [1 if kind == "image" else 2] * (v[0] * v[1] * v[2])
    lib = SimpleNamespace(
        config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=merge)),
        get_vision_position_ids=functools.partial(Qwen2VLModel.get_vision_position_ids, None),
    )
    grids = [(t, h * merge, w * merge) for kind, (t, h, w) in ((k, v) for k, v in SEGMENTS if k != "text")]
    want, delta = Qwen2VLModel.get_rope_index(
        lib,
        torch.zeros(1, length, dtype=torch.long),
        torch.tensor([types]),
        image_grid_thw=torch.tensor([grids[0]]),
        video_grid_thw=torch.tensor([grids[1]]),
    )
    layout = rope_layout(SimpleNamespace(model_type="qwen2_vl", get_text_config=lambda: SimpleNamespace(model_type="qwen2_vl_text")))
    assert layout == RopeLayout(3, "spatial")
    got = mrope_positions(length, blocks, layout)
    assert got == want[:, 0].tolist()
    assert got[0][3:9] == [3] * 6 and got[2][3:9] == [3, 4, 5, 3, 4, 5]  # the image: t, then w varying fastest
    assert next_position(got) == int(delta) + length
    assert mrope_positions(7, [], layout) == [list(range(7))] * 3  # text only: the 1-D positions on every axis


@pytest.mark.parametrize("second_per_grid", [1.0, 0.7, 1 / 3, 2.5])
def test_video_time_interval_matches_qwen2_5_vl_get_rope_index(second_per_grid):
    """Qwen2.5-VL spaces a video's frame groups by ``tokens_per_second * second_per_grid_t``
    (floored in float32): a block with that time interval gives transformers' own positions,
    images unscaled, text after the video at ``start + max(h, w)``."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    merge, tokens_per_second = 2, 25
    segments = [("text", 3), ("image", (1, 2, 3)), ("text", 2), ("video", (7, 2, 2)), ("text", 4)]
    length, blocks = _blocks(segments)
    types = []
    for kind, v in segments:
        types += [0] * v if kind == "text" else [1 if kind == "image" else 2] * (v[0] * v[1] * v[2])
    lib = SimpleNamespace(
        config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=merge, tokens_per_second=tokens_per_second)),
        get_vision_position_ids=functools.partial(Qwen2_5_VLModel.get_vision_position_ids, None),
    )
    grids = [(v[0], v[1] * merge, v[2] * merge) for kind, v in segments if kind != "text"]
    want, delta = Qwen2_5_VLModel.get_rope_index(
        lib,
        torch.zeros(1, length, dtype=torch.long),
        torch.tensor([types]),
        image_grid_thw=torch.tensor([grids[0]]),
        video_grid_thw=torch.tensor([grids[1]]),
        second_per_grid_ts=torch.tensor([second_per_grid]),
    )
    interval = tokens_per_second * float(torch.tensor(second_per_grid))  # the processor's value, as a float32 tensor holds it
    got = mrope_positions(length, [blocks[0], blocks[1] + (interval,)], RopeLayout(3, "spatial"))
    assert got == want[:, 0].tolist()
    assert next_position(got) == int(delta) + length
    if second_per_grid != 1.0:
        assert got != mrope_positions(length, blocks, RopeLayout(3, "spatial"))  # the interval changes the answer


def test_positions_match_qwen2_5_omni_get_rope_index():
    """The same sample with Qwen2.5-Omni's rule (text resumes one past the block's largest
    position): transformers' ``Qwen2_5OmniThinkerForConditionalGeneration.get_rope_index``, whose
    vision-start and -end tokens are text to us."""
    from transformers import AutoConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniPreTrainedModelForConditionalGeneration as Omni

    ids_of = dict(image_token_id=5, video_token_id=6, audio_token_id=7, vision_start_token_id=8, audio_start_token_id=9)
    cfg = SimpleNamespace(**ids_of, position_id_per_seconds=1, seconds_per_chunk=2)
    merge = 2
    ids = [1, 1, cfg.vision_start_token_id] + [cfg.image_token_id] * 6 + [2]  # 2: the vision end token
    ids += [1, cfg.vision_start_token_id] + [cfg.video_token_id] * 20 + [2] + [1] * 3
    lib = SimpleNamespace(
        config=cfg, spatial_merge_size=merge, get_llm_pos_ids_for_vision=functools.partial(Omni.get_llm_pos_ids_for_vision, None)
    )
    want, delta = Omni.get_rope_index(
        lib,
        torch.tensor([ids]),
        image_grid_thw=torch.tensor([[1, 2 * merge, 3 * merge]]),
        video_grid_thw=torch.tensor([[5, 2 * merge, 2 * merge]]),
        second_per_grids=torch.tensor([1.0]),
    )
    layout = rope_layout(AutoConfig.for_model("qwen2_5_omni_thinker"))
    assert layout == RopeLayout(3, "max")
    got = mrope_positions(len(ids), [(3, (1, 2, 3)), (12, (5, 2, 2))], layout)
    assert got == want[:, 0].tolist()
    assert got[0][32] == 9 + 5  # the video starts at position 9 (t 9..13): its end token takes 14, not 9 + max(h, w)
    assert next_position(got) == int(delta) + len(ids)


def test_rope_layout_only_for_mrope_models():
    from transformers import AutoConfig

    assert rope_layout(AutoConfig.for_model("qwen2")) is None
    assert rope_layout(AutoConfig.for_model("llama")) is None
    assert rope_layout(AutoConfig.for_model("qwen2_5_vl")) == RopeLayout(3, "spatial")
    with pytest.raises(ValueError, match="does not fit"):
        mrope_positions(10, [(4, (1, 2, 4))], RopeLayout())


def _config(path, attention="sdpa"):
    from omnicore.config import Config

    raw = tiny_config_dict(str(path), decoders=False)
    raw["model"]["foundation"]["options"]["config"] = dict(MROPE_LM)
    raw["model"]["encoders"] = {"image": {"name": "siglip", "options": {"config": dict(TINY_SIGLIP)}}}
    raw["model"]["kernels"] = {"attention": attention}
    return Config.model_validate(raw)


def _samples(digits_jsonl, proc, n_images=2):
    """Encoded image questions (with answers) of the digits set and two text-only samples."""
    from omnicore.data.jsonl import parse_line

    path = digits_jsonl / "train.jsonl"
    rows = [(i, t) for i, t in enumerate(path.read_text().splitlines(), 1) if json.loads(t)["task"] == "image_to_text"][:n_images]
    out = [proc.encode(parse_line(t, str(path), i)) for i, t in rows]
    for k, text in enumerate(["What is seven plus one?", "Name a digit."]):
        line = {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": str(k + 3)}]}
        out.append(proc.encode(parse_line(json.dumps(line), str(path), 1000 + k)))
    return out


@pytest.mark.parametrize("attention", ["sdpa", "sdpa_varlen"])
def test_packed_samples_give_the_logits_of_each_sample_alone(digits_jsonl, attention):
    """A qwen2_vl foundation (text model and LM head only) with the SigLIP encoder: one packed row of
    image and text samples gives each sample's logits alone (1e-5); the rows of 3-D positions
    restart per sample and lay the image out as its 4 x 4 patch grid; the 1-D row still gives the
    sample boundaries; and the 3-D positions change the logits (they are used)."""
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.packing import collate
    from omnicore.kernels.varlen import cu_seqlens_from_position_ids
    from omnicore.model.build import build_omni_model

    model, tok = build_omni_model(_config(digits_jsonl / "train.jsonl", attention))
    model.eval()
    assert type(model.lm).__name__ == "Qwen2VLTextForCausalLM" and not any("visual" in n for n, _ in model.lm.named_parameters())
    assert model.rope == RopeLayout(3, "spatial") and model.lm.config._attn_implementation == attention
    proc = ChatProcessor.for_model(tok, model, SimpleNamespace(system_prompt=None, special_tokens_in_text="escape", chat_template="auto"))
    samples = _samples(digits_jsonl, proc)
    img = samples[0]
    start = img.input_ids.index(model.token_ids["encoder"]["image"])
    assert img.rope_position_ids[1][start : start + 16] == [start + j for j in range(4) for _ in range(4)]
    assert img.rope_position_ids[0][start + 16] == start + 4  # text resumes after the 4 x 4 grid
    mb = collate(samples, proc.encoders, proc.decoders)
    assert mb.rope_position_ids.shape == (3, 1, mb.num_tokens)
    cu, _ = cu_seqlens_from_position_ids(mb.position_ids)
    assert cu.tolist() == mb.cu_seqlens.tolist() and len(cu) == len(samples) + 1
    with torch.no_grad():
        packed = model(mb, return_logits=True).logits[0]
        text_layout = model(dataclasses.replace(mb, rope_position_ids=None), return_logits=True).logits[0]
        at = 0
        for s in samples:
            alone = model(collate([s], proc.encoders, proc.decoders), return_logits=True).logits[0]
            torch.testing.assert_close(packed[at : at + len(s)], alone, atol=1e-5, rtol=0)
            at += len(s)
    assert (packed - text_layout).abs().max() > 1e-3


def test_batched_generation_equals_one_at_a_time(digits_jsonl):
    """Greedy generation with the mRoPE foundation: image and text prompts of different lengths in one
    left-padded batch give each prompt's tokens alone; and decoding with the KV cache continues one
    past the prompt's largest position: one forward over prompt + answer, with the answer's
    positions set that way, picks the same tokens (teacher forcing)."""
    from omnicore.data.chat import ChatProcessor, Encoded, module_processors
    from omnicore.data.jsonl import parse_line
    from omnicore.data.packing import collate
    from omnicore.model import generation
    from omnicore.model.build import build_omni_model

    model, tok = build_omni_model(_config(digits_jsonl / "train.jsonl"))
    model.eval()
    proc = ChatProcessor(tok, module_processors(model.encoders, "encoder"), {}, rope=model.rope)
    path = digits_jsonl / "eval.jsonl"
    lines = [(i, t) for i, t in enumerate(path.read_text().splitlines(), 1) if json.loads(t)["task"] == "image_to_text"][:3]
    prompts = [proc.encode(parse_line(t, str(path), i), prompt_only=True) for i, t in lines]
    line = {"messages": [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "1 2 3"}]}
    prompts.append(proc.encode(parse_line(json.dumps(line), str(path), 99), prompt_only=True))
    assert len({len(p) for p in prompts}) >= 2 and next_position(prompts[0].rope_position_ids) < len(prompts[0])
    alone = [generation.generate(model, tok, p, max_new_tokens=6)["token_ids"] for p in prompts]
    batched = [o["token_ids"] for o in generation.generate_batch(model, tok, prompts, max_new_tokens=6)]
    assert batched == alone and all(len(a) == 6 for a in alone)
    for p, gen in zip(prompts, alone):
        nxt = next_position(p.rope_position_ids)
        rows = [r + list(range(nxt, nxt + len(gen) - 1)) for r in p.rope_position_ids]
        ids = p.input_ids + gen[:-1]
        full = Encoded(ids, [-100] * len(ids), p.media, 0, p.where, rows)
        with torch.no_grad():
            logits = model(collate([full], proc.encoders, {}), return_logits=True).logits[0]
        assert logits[len(p) - 1 :].argmax(-1).tolist() == gen


def test_export_round_trip_through_the_strict_key_plan(digits_jsonl, tmp_path):
    """``save_pretrained`` of the text-only foundation writes the text config (qwen2_vl_text); as a
    ``checkpoint`` it is planned key by key and read back to the same parameters; a published
    layout's vision tower must be listed in ignore_unused; transformers 5's layout is refused."""
    from safetensors.torch import load_file, save_file

    from omnicore.config import Config
    from omnicore.model.build import build_omni_model
    from omnicore.registry import RegistryError

    model, _ = build_omni_model(_config(digits_jsonl / "train.jsonl"))
    model.lm.save_pretrained(tmp_path / "lm")
    assert json.loads((tmp_path / "lm" / "config.json").read_text())["model_type"] == "qwen2_vl_text"
    raw = _config(digits_jsonl / "train.jsonl").model_dump()
    raw["model"]["foundation"]["options"] = {"checkpoint": str(tmp_path / "lm")}
    again, _ = build_omni_model(Config.model_validate(raw))
    assert again.rope == model.rope
    want = dict(model.lm.named_parameters())
    for n, p in again.lm.named_parameters():
        torch.testing.assert_close(p, want[n], atol=0, rtol=0)
    tensors = load_file(tmp_path / "lm" / "model.safetensors")
    save_file({**tensors, "visual.patch_embed.proj.weight": torch.zeros(2, 2)}, tmp_path / "lm" / "model.safetensors")
    with pytest.raises(RegistryError, match="visual"):
        build_omni_model(Config.model_validate(raw))
    raw["model"]["foundation"]["options"]["ignore_unused"] = ["visual"]
    build_omni_model(Config.model_validate(raw))
    save_file({k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}, tmp_path / "lm" / "model.safetensors")
    with pytest.raises(RegistryError, match="model.language_model"):
        build_omni_model(Config.model_validate(raw))


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen3_vl", "qwen2_5_omni_thinker"])
def test_other_mrope_types_build_without_towers_and_keep_samples_apart(model_type):
    """Qwen2.5-VL, Qwen3-VL (interleaved sections) and Qwen2.5-Omni's thinker build as their text
    model and LM head (no vision or audio tower) and take ``[4, 1, T]`` positions: two packed
    samples give each one's logits alone."""
    from omnicore.model.foundation import HFCausalLM

    text = {k: v for k, v in MROPE_LM.items() if k != "model_type"}
    nested = {"text_config": {**text, "vocab_size": 300, "head_dim": 16}}  # Qwen3-VL's text config defaults to head_dim 128
    config = {"model_type": model_type, **(text if model_type == "qwen2_5_vl" else nested)}
    lm = HFCausalLM({"config": config}).build_model(vocab_size=300).eval()
    assert not any("visual" in n or "audio" in n for n, _ in lm.named_parameters()) and lm.config.vocab_size == 300
    layout = rope_layout(lm.config)
    assert layout == RopeLayout(3, "max" if model_type == "qwen2_5_omni_thinker" else "spatial")
    ids = torch.randint(0, 300, (1, 30), generator=torch.Generator().manual_seed(0))
    first, second = mrope_positions(18, [(3, (2, 2, 3))], layout), mrope_positions(12, [], layout)
    flat = torch.tensor([list(range(18)) + list(range(12))])
    rope = torch.tensor([a + b for a, b in zip(first, second)]).unsqueeze(1)
    with torch.no_grad():
        packed = lm(input_ids=ids, position_ids=torch.cat([flat[None], rope]), use_cache=False).logits[0]
        alone = lm(input_ids=ids[:, :18], position_ids=torch.cat([flat[None, :, :18], rope[:, :, :18]]), use_cache=False).logits[0]
        second_alone = lm(input_ids=ids[:, 18:], position_ids=torch.cat([flat[None, :, 18:], rope[:, :, 18:]]), use_cache=False).logits[0]
    torch.testing.assert_close(packed, torch.cat([alone, second_alone]), atol=1e-5, rtol=0)


def test_sequence_hook_must_pass_rope_positions_on():
    """The sequence-hook contract for an mRoPE foundation (``OmniModel.foundation_positions``): a hook
    that drops ``rope_position_ids``, or cuts ``position_ids`` without them (as Ulysses' hook did
    before it knew mRoPE), stops the forward with an error naming what to do; a hook that cuts both
    alike along the sequence runs, and its part of the row has the whole row's logits there."""
    from omnicore.model.foundation import HFCausalLM
    from omnicore.model.omni import OmniModel

    text = {k: v for k, v in MROPE_LM.items() if k != "model_type"}
    lm = HFCausalLM({"config": {"model_type": "qwen2_vl", **text}}).build_model(vocab_size=300).eval()
    model = OmniModel(lm, {}, {}, {"encoder": {}, "decoder": {}, "decoder_start": {}})
    layout = rope_layout(lm.config)
    ids = torch.randint(0, 300, (1, 30), generator=torch.Generator().manual_seed(0))
    rope = torch.tensor(mrope_positions(30, [(3, (2, 2, 3))], layout)).unsqueeze(1)
    batch = MicroBatch(ids, torch.full_like(ids, -100), torch.arange(30)[None], rope_position_ids=rope)
    with torch.no_grad():
        whole = model(batch, return_logits=True).logits[0]

    def cut(seq, keys):
        return {**seq, **{k: seq[k][..., :16] for k in keys}, "inputs_embeds": seq["inputs_embeds"][:, :16]}

    hooks = {
        "drops": lambda m, seq: {k: v for k, v in seq.items() if k != "rope_position_ids"},
        "cuts position_ids only": lambda m, seq: cut(seq, ["position_ids", "labels"]),
    }
    for hook in hooks.values():
        handle = model.register_sequence_hook(hook)
        with pytest.raises(
            ValueError,
            match=r"rope_position_ids .* do not match position_ids \(1, (30|16)\): an mRoPE foundation needs every sequence hook",
        ):
            model(batch)
        handle.remove()
    model.register_sequence_hook(lambda m, seq: cut(seq, ["position_ids", "labels", "rope_position_ids"]))
    with torch.no_grad():
        part = model(batch, return_logits=True).logits[0]
    torch.testing.assert_close(part, whole[:16], atol=1e-5, rtol=0)  # causal: the first 16 see only themselves
