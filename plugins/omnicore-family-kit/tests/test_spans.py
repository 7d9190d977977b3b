"""Gemma 3's bidirectional image spans through the generic family (:mod:`omnicore_family_kit.generic.spans`).

The parity suite (``TestGemma3`` in ``test_matrix.py``) proves ids, logits, the packed row, the loss
and the export with sdpa. Here: the masks equal transformers' own ``create_masks_for_vision_model``
for each packed sample alone, also where an image is longer than the sliding window and with the
padding and cache of a generation prefill; eager attention gives the class's logits; the prefill of
``generate_batch`` gives the class's last logits; the attention kernels that take no mask and
sequence parallelism are refused; PaliGemma's prefix mask is not mistaken for media spans.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import omnicore_family_kit.plugin
from omnicore.testing import FamilyParitySuite
from omnicore_family_kit.generic.spans import span_masks
from omnicore_family_kit.standins import save_standin

WIDTH = 16


class GenericParity(FamilyParitySuite):
    """The suite on the gemma3 stand-in through the generic family, as ``test_matrix.py`` runs it."""

    __test__ = False
    model_type = "gemma3"
    foundation = "auto"
    plugins = [(omnicore_family_kit.plugin, "omnicore-family-kit")]
    hf_class = "Gemma3ForConditionalGeneration"
    samples = [
        ([{"type": "text", "text": "Say hi"}], "hi there"),
        ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "What is it?"}], "noise"),
        (
            [{"type": "image", "path": "b.png"}, {"type": "image", "path": "a.png"}, {"type": "text", "text": "Which is wider?"}],
            "the first",
        ),
    ]
    media = {"a.png": (40, 52), "b.png": (70, 33)}

    def standin(self, tmp_path_factory):
        return save_standin(self.model_type, tmp_path_factory.mktemp(self.model_type) / "standin")

    def load_hf_processor(self, folder):
        from omnicore_family_kit.processors import load_hf_processor

        return load_hf_processor(str(folder))

    def hf_messages(self, user, answer):
        content = [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]} for p in user]
        return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


def _text_config(impl: str, window: int = 3):
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=32,
        hidden_size=WIDTH,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=window,
        layer_types=["sliding_attention", "full_attention"],
    )
    config._attn_implementation = impl
    return config


def _blocks(types: list[int]) -> torch.Tensor:
    """transformers' block ids of one sample's token types (1: image token)."""
    from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask

    return get_block_sequence_ids_for_mask(torch.tensor([types]))


SAMPLES = [
    [0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0],  # an image of 6 tokens, longer than the window of 3
    [0, 1, 1, 1, 0, 0, 1, 1, 0],  # two images
    [0, 0, 0, 0, 0],  # text
]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_masks_are_gemma3s_masks_of_each_sample_alone(impl):
    from transformers.models.gemma3.modeling_gemma3 import create_masks_for_vision_model

    config = _text_config(impl)
    alone = []
    for types in SAMPLES:
        embeds = torch.zeros(1, len(types), WIDTH)
        alone.append(create_masks_for_vision_model(config, embeds, None, None, torch.arange(len(types))[None], _blocks(types)))
    row = sum(SAMPLES, [])
    positions = torch.cat([torch.arange(len(t)) for t in SAMPLES])[None]
    packed = span_masks(config, _blocks(row), positions, torch.zeros(1, len(row), WIDTH))
    assert set(packed) == {"full_attention", "sliding_attention"}
    blocked = torch.finfo(torch.float32).min if impl == "eager" else False
    for kind, mask in packed.items():
        assert mask.shape == (1, 1, len(row), len(row))
        start = 0
        for k, masks in enumerate(alone):
            n = masks[kind].shape[-1]
            torch.testing.assert_close(mask[..., start : start + n, start : start + n], masks[kind], msg=f"{kind}, sample {k}")
            outside = torch.ones(len(row), dtype=torch.bool)
            outside[start : start + n] = False
            assert (mask[0, 0, start : start + n][:, outside] == blocked).all(), f"{kind}: sample {k} sees another sample"
            start += n
    # the image longer than the window: its last token sees its first only through the full layers
    assert bool(packed["full_attention"][0, 0, 7, 2] != blocked) and bool(packed["sliding_attention"][0, 0, 7, 2] == blocked)
    assert bool(packed["sliding_attention"][0, 0, 2, 7] != blocked), "an image token does not see a later token of its image"


def test_prefill_masks_with_padding_and_cache_are_gemma3s():
    from transformers import DynamicCache
    from transformers.models.gemma3.modeling_gemma3 import create_masks_for_vision_model

    config = _text_config("sdpa")
    width = max(len(t) for t in SAMPLES)
    types = torch.tensor([[0] * (width - len(t)) + t for t in SAMPLES])  # left-padded, as generate_batch pads
    padding = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in SAMPLES])
    positions = (padding.cumsum(-1) - 1).clamp(min=0)
    blocks = _blocks(types.tolist()[0]), _blocks(types.tolist()[1]), _blocks(types.tolist()[2])
    blocks = torch.cat(blocks)
    embeds = torch.zeros(len(SAMPLES), width, WIDTH)
    want = create_masks_for_vision_model(config, embeds, padding, DynamicCache(config=config), positions, blocks)
    got = span_masks(config, blocks, positions, embeds, padding, DynamicCache(config=config))
    assert set(got) == set(want)
    for kind in got:
        assert torch.equal(got[kind], want[kind]), kind


class EagerParity(GenericParity):
    """The suite with ``model.kernels.attention: eager``."""

    __test__ = False

    def config(self, standin, data):
        cfg = super().config(standin, data)
        cfg["model"]["kernels"] = {"attention": "eager"}
        return cfg


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """The suite's run and reference for the gemma3 stand-in (sdpa): ``(suite, standin, run, reference)``."""
    suite = GenericParity()
    folder = tmp_path_factory.mktemp("gemma3_spans")
    standin = save_standin("gemma3", folder / "standin")
    run = suite.build_run(standin, folder / "data")
    return suite, standin, run, suite.build_reference(standin, run.data)


def test_eager_attention_gives_the_classs_logits_and_the_packed_row(gemma3, tmp_path):
    """The suite's logits (text, one image, two images) and packed-row tests with eager attention."""
    _, standin, _, ref = gemma3
    suite = EagerParity()
    run = suite.build_run(standin, tmp_path / "data")
    assert run.model.lm.config._attn_implementation == "eager" and run.model.media_span_inputs is not None
    for k in range(len(suite.samples)):
        suite.test_logits_equal_transformers(run, ref, k)
    suite.test_packed_row_equals_each_sample_alone(run)


def _prefill_logits(run, prompts):
    """The logits ``generate_batch`` picks its first tokens from (the LM head on the prefill's last positions)."""
    from omnicore.testing import generate_batch

    seen = []
    handle = run.model.lm.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        generate_batch(run.model, run.tokenizer, prompts, max_new_tokens=1)
    finally:
        handle.remove()
    return seen[0]


def test_the_generation_prefill_gives_the_classs_last_logits(gemma3):
    from omnicore.testing import ChatProcessor, Config, read_jsonl

    suite, _, run, ref = gemma3
    proc = ChatProcessor.for_model(run.tokenizer, run.model, Config.model_validate(run.config).data)
    samples = list(read_jsonl(run.data / "train.jsonl"))
    prompts = [proc.encode(s, prompt_only=True) for s in samples]
    want = []
    for (user, _, _, _), prompt in zip(suite.sample_list(), prompts):
        text = ref.processor.apply_chat_template(suite.hf_messages(user, "")[:1], tokenize=False, add_generation_prompt=True)
        inputs = ref.processor(text=text, return_tensors="pt", **suite.hf_media(run.data, user))
        assert inputs["input_ids"][0].tolist() == prompt.input_ids
        with torch.no_grad():
            want.append(ref.model(**inputs).logits[0, -1])
    got = _prefill_logits(run, prompts)  # three prompts of different lengths, left-padded in one batch
    torch.testing.assert_close(got, torch.stack(want), atol=1e-5, rtol=0)
    spans, run.model.media_span_inputs = run.model.media_span_inputs, None
    try:  # without the spans the image prompts' logits differ: the test can fail
        causal = _prefill_logits(run, prompts)
    finally:
        run.model.media_span_inputs = spans
    assert (causal[1:] - torch.stack(want[1:])).abs().max() > 1e-2


def _config(standin: Path, data: Path, **over):
    cfg = GenericParity().config(standin, data)
    cfg["model"].update(over)
    return cfg


def test_an_attention_kernel_that_takes_no_mask_is_refused(gemma3, tmp_path):
    from omnicore.testing import Config, build_omni_model, isolated_registry

    _, standin, run, _ = gemma3
    cfg = Config.model_validate(_config(standin, run.data, kernels={"attention": "sdpa_varlen"}))
    with pytest.raises(Exception, match="model.kernels.attention") as info:
        build_omni_model(cfg, isolated_registry([(omnicore_family_kit.plugin, "omnicore-family-kit")], builtins=True))
    assert "sdpa_varlen" in str(info.value) and "sdpa or eager" in str(info.value)


class _SpState:
    """A planned layout of 2 ranks, both in one sequence-parallel group."""

    world_size = 2
    rank = 0
    mesh = None
    mixed_precision = "none"
    distributed = False

    def size(self, dim):
        return 2 if dim in ("sp", "fsdp", "dp_shard_sp") else 1


def test_sequence_parallelism_is_refused(gemma3):
    from omnicore.testing import parallelize

    _, _, run, _ = gemma3
    with pytest.raises(Exception, match="parallel.sp: is 2 but the foundation attends bidirectionally"):
        parallelize(run.model, _SpState(), [])


def test_a_sequence_hook_that_cuts_the_row_is_refused(gemma3):
    _, _, run, _ = gemma3

    def cut(model, seq):
        half = seq["inputs_embeds"].shape[1] // 2
        return {**seq, **{k: seq[k][:, :half] for k in ("inputs_embeds", "position_ids", "labels")}}

    handle = run.model.register_sequence_hook(cut)
    try:
        with pytest.raises(ValueError, match="sequence parallelism cannot carry them"):
            GenericParity.logits(run.model, run.encoded[1:2])
        GenericParity.logits(run.model, run.encoded[:1])  # text only: no span, nothing to refuse
    finally:
        handle.remove()


def test_paligemmas_prefix_is_not_a_media_span(tmp_path):
    """PaliGemma takes token_type_ids too, but they mark its text prefix: no media spans."""
    from omnicore_family_kit.generic.model import build_composite, fresh_config
    from omnicore_family_kit.generic.processor import read_config_json
    from omnicore_family_kit.generic.spans import span_modality

    got = {}
    for model_type in ("paligemma", "gemma3"):
        folder = save_standin(model_type, tmp_path / model_type)
        got[model_type] = span_modality(read_config_json(folder), build_composite(fresh_config(folder)), folder)
    assert got == {"paligemma": None, "gemma3": "image"}
