"""OmniModel: packing isolation, encoder scatter, placeholder checks, decoder loss, zero-target and dummy passes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config_dict  # noqa: E402  (tests/ is on pytest's pythonpath)

from omnicore.data.chat import IGNORE_INDEX, ChatProcessor, module_processors
from omnicore.data.jsonl import parse_line
from omnicore.data.packing import collate
from omnicore.model.omni import PlaceholderMismatch

_BUILT: dict = {}


def _build(train: Path, attention: str):
    from omnicore.config import Config
    from omnicore.model.build import build_omni_model

    if attention not in _BUILT:
        raw = tiny_config_dict(str(train))
        raw["model"]["kernels"] = {"attention": attention}
        model, tok = build_omni_model(Config.model_validate(raw))
        model.eval()  # no dropout: exact comparisons
        _BUILT[attention] = (
            model,
            tok,
            ChatProcessor(tok, module_processors(model.encoders, "encoder"), module_processors(model.decoders, "decoder")),
        )
    return _BUILT[attention]


@pytest.fixture(scope="module")
def sdpa(digits_jsonl):
    yield _build(digits_jsonl / "train.jsonl", "sdpa")
    _BUILT.clear()


@pytest.fixture(scope="module")
def samples(sdpa, digits_jsonl):
    """One encoded sample per task from the real digits data: {task: Encoded}."""
    _, _, proc = sdpa
    path = digits_jsonl / "train.jsonl"
    out = {}
    for lineno, text in enumerate(path.read_text().splitlines(), start=1):
        task = json.loads(text)["task"]
        if task not in out:
            out[task] = proc.encode(parse_line(text, str(path), lineno))
    assert set(out) == {"image_to_text", "audio_to_text", "text_to_image"}
    return out


def _mb(proc, encs):
    return collate(encs, proc.encoders, proc.decoders)


def _fwd(model, mb, **kw):
    return model(mb, **kw)


# ---- packing isolation -----------------------------------------------------------------------


def _attention_kernels() -> list[str]:
    """Every attention kernel in the registry (built-ins and installed plugins) that is available on
    this machine: a new kernel is covered by the packing test without editing it."""
    from omnicore.registry import Registry

    reg = Registry.discover()
    names = []
    for row in reg.components("kernel"):
        if row.status != "available":
            continue
        kernel = reg.build("kernel", f"{row.provider}:{row.name}")
        if getattr(kernel, "op", None) == "attention" and kernel.available()[0]:
            names.append(row.name)
    return sorted(names)


ATTENTION_KERNELS = _attention_kernels()


def test_attention_kernels_discovered():
    assert {"sdpa", "eager", "sdpa_varlen"} <= set(ATTENTION_KERNELS)


@pytest.mark.parametrize("attention", ATTENTION_KERNELS)
def test_packed_equals_separate(attention, sdpa, samples, digits_jsonl):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model, _, proc = _build(digits_jsonl / "train.jsonl", attention)
    impl = model.lm.config._attn_implementation
    # built-ins register under their own name; a plugin's implementation name may differ
    assert impl == attention if attention in ("sdpa", "eager", "sdpa_varlen") else impl in ALL_ATTENTION_FUNCTIONS
    encs = [samples["image_to_text"], samples["audio_to_text"], samples["text_to_image"]]
    packed = _mb(proc, encs)
    with torch.no_grad():
        out = _fwd(model, packed, return_logits=True)
        cu = packed.cu_seqlens.tolist()
        total = 0.0
        for k, e in enumerate(encs):
            alone = _fwd(model, _mb(proc, [e]), return_logits=True)
            assert alone.logits.shape[1] == len(e)
            torch.testing.assert_close(out.logits[:, cu[k] : cu[k + 1]], alone.logits, atol=1e-5, rtol=0)
            total += float(alone.loss_sum)
            assert alone.n_targets == e.n_targets
    assert out.n_targets == packed.n_targets == sum(e.n_targets for e in encs)
    assert float(out.loss_sum) == pytest.approx(total, rel=1e-5)
    assert torch.isfinite(out.loss_sum) and float(out.loss_sum) > 0


# ---- encoder scatter -------------------------------------------------------------------------


def test_encoder_outputs_scattered_at_placeholders(sdpa, samples):
    model, tok, proc = sdpa
    mb = _mb(proc, [samples["image_to_text"], samples["audio_to_text"], samples["text_to_image"]])
    ids = mb.input_ids
    with torch.no_grad():
        embeds, codes, dummy = model.embed(ids, mb.encoder_inputs, mb.decoder_inputs, mb.wheres)
        tok_emb = model.lm.get_input_embeddings()(ids)
        img = model.encoders["image"](mb.encoder_inputs["image"])
        aud = model.encoders["audio"](mb.encoder_inputs["audio"])
        dec = model.decoders["image"]
        want_codes = dec.encode(mb.decoder_inputs["image"])
        code_emb = dec.embed(want_codes)
    masks = {t: ids[0] == tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|audio_pad|>", "<|image_out|>")}
    assert int(masks["<|image_pad|>"].sum()) == img.shape[0] == 16
    assert int(masks["<|audio_pad|>"].sum()) == aud.shape[0] > 0
    assert int(masks["<|image_out|>"].sum()) == code_emb.shape[0] == 64
    assert embeds.shape == tok_emb.shape
    torch.testing.assert_close(embeds[0, masks["<|image_pad|>"]], img, atol=0, rtol=0)
    torch.testing.assert_close(embeds[0, masks["<|audio_pad|>"]], aud, atol=0, rtol=0)
    torch.testing.assert_close(embeds[0, masks["<|image_out|>"]], code_emb, atol=0, rtol=0)
    assert torch.equal(codes["image"], want_codes)
    rest = ~(masks["<|image_pad|>"] | masks["<|audio_pad|>"] | masks["<|image_out|>"])
    assert int(rest.sum()) > 0
    torch.testing.assert_close(embeds[0, rest], tok_emb[0, rest], atol=0, rtol=0)
    assert float(dummy) == 0.0
    # the media embeddings really differ from the placeholder tokens' own embeddings
    assert not torch.allclose(embeds[0, masks["<|image_pad|>"]], tok_emb[0, masks["<|image_pad|>"]])


# ---- placeholder mismatch --------------------------------------------------------------------


@pytest.mark.parametrize(
    "task,token", [("image_to_text", "<|image_pad|>"), ("audio_to_text", "<|audio_pad|>"), ("text_to_image", "<|image_out|>")]
)
def test_placeholder_mismatch_names_sample(sdpa, samples, task, token):
    model, tok, proc = sdpa
    mb = _mb(proc, [samples[task]])
    pad = tok.convert_tokens_to_ids(token)
    drop = (mb.input_ids[0] == pad).nonzero()[0, 0].item()
    keep = torch.ones(mb.num_tokens, dtype=torch.bool)
    keep[drop] = False
    mb.input_ids, mb.labels, mb.position_ids = (t[:, keep] for t in (mb.input_ids, mb.labels, mb.position_ids))
    where = samples[task].where
    assert re.search(r":\d+$", where)
    with torch.no_grad(), pytest.raises(PlaceholderMismatch, match=re.escape(where)) as info:
        _fwd(model, mb)
    n = int((mb.input_ids == pad).sum())
    assert f"for {n} placeholders" in str(info.value)


# ---- decoder loss ----------------------------------------------------------------------------


def test_decoder_loss_matches_independent_computation(sdpa, samples):
    model, tok, proc = sdpa
    enc = samples["text_to_image"]
    mb = _mb(proc, [samples["image_to_text"], enc])  # packed behind another sample
    dec = model.decoders["image"]
    with torch.no_grad():
        out = _fwd(model, mb)
        codes = dec.encode(mb.decoder_inputs["image"])
        ids = mb.input_ids
        emb = model.lm.get_input_embeddings()(ids).clone()
        img_mask = ids[0] == tok.convert_tokens_to_ids("<|image_pad|>")
        emb[0, img_mask] = model.encoders["image"](mb.encoder_inputs["image"])
        out_pos = (ids[0] == tok.convert_tokens_to_ids("<|image_out|>")).nonzero()[:, 0]
        emb[0, out_pos] = dec.embed(codes)
        hidden = model.lm.base_model(inputs_embeds=emb, position_ids=mb.position_ids, use_cache=False).last_hidden_state
        dec_logits = dec.head(hidden[0, out_pos - 1]).float()
        want_dec = F.cross_entropy(dec_logits, codes, reduction="sum")
        lm_logits = model.lm.get_output_embeddings()(hidden).float()
        want_text = F.cross_entropy(lm_logits[0], mb.labels[0], ignore_index=IGNORE_INDEX, reduction="sum")
    assert codes.shape == (64,) and int(codes.max()) < dec.codebook_size
    assert out_pos.tolist() == list(range(int(out_pos[0]), int(out_pos[0]) + 64))
    assert float(out.decoder_loss_sums["image"]) == pytest.approx(float(want_dec), rel=1e-5)
    assert float(out.text_loss_sum) == pytest.approx(float(want_text), rel=1e-5)
    assert float(out.loss_sum) == pytest.approx(float(want_dec + want_text), rel=1e-5)
    assert out.n_targets == mb.n_targets == int((mb.labels != IGNORE_INDEX).sum()) + 64
    # a random head over C codes scores about log(C) per code
    assert float(want_dec) / 64 == pytest.approx(torch.log(torch.tensor(float(dec.codebook_size))).item(), rel=0.2)


# ---- zero targets, dummy passes --------------------------------------------------------------


def _text_only(proc, tmp_name="mem.jsonl"):
    obj = {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]}
    return proc.encode(parse_line(json.dumps(obj), tmp_name, 1))


def _grads(module):
    return {n: p.grad for n, p in module.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_no_targets_gives_exact_zero_loss_and_finite_grads(sdpa):
    model, _, proc = sdpa
    mb = _mb(proc, [_text_only(proc), _text_only(proc)])
    mb.labels = torch.full_like(mb.labels, IGNORE_INDEX)
    mb.n_targets = 0
    model.zero_grad(set_to_none=True)
    out = _fwd(model, mb)
    assert out.n_targets == 0
    assert out.loss_sum.item() == 0.0 and not torch.isnan(out.loss_sum)
    assert out.text_loss_sum.item() == 0.0 and out.decoder_loss_sums == {}
    out.loss_sum.backward()
    lm = _grads(model.lm)
    assert lm and all(g is not None for g in lm.values())
    for name, g in lm.items():
        assert torch.isfinite(g).all(), name
        assert torch.count_nonzero(g) == 0, name
    for name, g in _grads(model).items():
        assert g is not None and torch.isfinite(g).all() and torch.count_nonzero(g) == 0, name
    model.zero_grad(set_to_none=True)


@pytest.mark.slow
def test_dummy_passes_give_every_component_param_a_zero_grad(sdpa):
    model, _, proc = sdpa
    mb = _mb(proc, [_text_only(proc)])
    assert mb.encoder_inputs == {} and mb.decoder_inputs == {} and mb.n_targets == 2
    model.zero_grad(set_to_none=True)
    out = _fwd(model, mb)
    assert out.loss_sum.item() > 0
    out.loss_sum.backward()
    checked = 0
    for kind, comps in (("encoder", model.encoders), ("decoder", model.decoders)):
        for m, comp in comps.items():
            grads = _grads(comp)
            assert grads, f"{kind} {m} has no trainable parameters"
            for name, g in grads.items():
                assert g is not None, f"{kind} {m}: {name} has no grad after a text-only micro-batch"
                assert torch.count_nonzero(g) == 0, f"{kind} {m}: {name}"
                checked += 1
    assert checked > 20
    # while the LM itself did learn something from the text targets
    assert any(torch.count_nonzero(g) > 0 for g in _grads(model.lm).values())
    model.zero_grad(set_to_none=True)
