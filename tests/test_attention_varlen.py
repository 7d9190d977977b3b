"""The ``sdpa_varlen`` attention kernel (omnicore.kernels.attention_varlen) and the varlen helpers
(omnicore.kernels.varlen): real values against per-sample SDPA and against the ``sdpa`` kernel on the
real digits model, and no ``[T, T]`` tensor anywhere in a packed forward."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_LM, tiny_config_dict  # noqa: E402  (tests/ is on pytest's pythonpath)
from torch.utils._python_dispatch import TorchDispatchMode

from omnicore.kernels.attention_varlen import IMPLEMENTATION, SDPAVarlenAttention, no_mask, register, sdpa_varlen_attention_forward
from omnicore.kernels.varlen import bucket_length, cu_seqlens_from_position_ids, is_varlen, plan_varlen

CAUSAL = types.SimpleNamespace(is_causal=True)


def _pos(*rows: list[int]) -> torch.Tensor:
    """position_ids ``[B, T]`` for rows of packed sample lengths."""
    return torch.stack([torch.cat([torch.arange(n) for n in row]) for row in rows])


def _reference(q, k, v, pos, scale, causal=True):
    """Per-sample SDPA, one call per sample, KV heads repeated: ``[B, T, H, D]``."""
    b, h, t, d = q.shape
    cu = cu_seqlens_from_position_ids(pos)[0].tolist()
    flat = [x.transpose(1, 2).reshape(b * t, x.shape[1], d).transpose(0, 1) for x in (q, k, v)]  # [H, B*T, D]
    rep = h // k.shape[1]
    outs = []
    for s, e in zip(cu, cu[1:]):
        qs, ks, vs = flat[0][:, s:e], flat[1][:, s:e].repeat_interleave(rep, 0), flat[2][:, s:e].repeat_interleave(rep, 0)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale).transpose(0, 1))
    return torch.cat(outs).view(b, t, h, d)


def _qkv(b: int, t: int, hq: int = 4, hkv: int = 2, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g, requires_grad=True) for h in (hq, hkv, hkv)]


# ---- helpers -----------------------------------------------------------------------------------


def test_cu_seqlens_from_restarting_position_ids():
    cu, max_len = cu_seqlens_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]))
    assert cu.tolist() == [0, 3, 5, 6, 12] and cu.dtype == torch.int32 and max_len == 6


def test_bucket_lengths():
    assert [bucket_length(n, 512) for n in (1, 5, 8, 9, 12, 17, 100, 129, 511, 512, 700)] == [1, 5, 8, 10, 12, 20, 112, 160, 512, 512, 700]
    for n in range(1, 600):
        p = bucket_length(n, 512)
        assert n <= p <= max(n * 1.25, n + 1)


def test_plan_groups_views_padding_and_order():
    cu = cu_seqlens_from_position_ids(_pos([4, 4, 4, 9, 10, 3]))[0]
    plan = plan_varlen(cu, pad=True)
    by_len = {g.length: g for g in plan.groups}
    assert plan.lengths == [4, 4, 4, 9, 10, 3]
    # three consecutive samples of 4: one view, no copy, no padding
    assert by_len[4].n == 3 and by_len[4].start == 0 and by_len[4].index is None
    # 9 and 10 share the bucket 10: 9 is right-padded, the padded row is dropped
    assert by_len[10].n == 2 and by_len[10].index.tolist() == [
        [12, 13, 14, 15, 16, 17, 18, 19, 20, 21],
        [21, 22, 23, 24, 25, 26, 27, 28, 29, 30],
    ]
    assert by_len[10].keep.numel() == 19
    assert by_len[3].start == 31
    assert plan.inverse is None  # the groups come out in sequence order here
    exact = plan_varlen(cu, pad=False)  # non-causal: exact lengths only
    assert sorted((g.length, g.n) for g in exact.groups) == [(3, 1), (4, 3), (9, 1), (10, 1)]
    shuffled = plan_varlen(cu_seqlens_from_position_ids(_pos([5, 3, 5]))[0], pad=True)
    assert [g.n for g in shuffled.groups] == [2, 1] and shuffled.inverse.tolist() == [0, 1, 2, 3, 4, 10, 11, 12, 5, 6, 7, 8, 9]


# ---- the attention function --------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows",
    [[[37]], [[10, 10, 10]], [[5, 3, 5, 7, 5, 40, 17, 20, 1, 2, 3]], [[9, 101]], [[300, 212, 600, 1]], [[6, 6, 2], [1, 13]]],
    ids=["one", "equal", "many-short", "two", "long", "two-rows"],
)
def test_matches_per_sample_sdpa_values_and_grads(rows):
    pos = _pos(*rows)
    q, k, v = _qkv(*pos.shape)
    out, none = sdpa_varlen_attention_forward(CAUSAL, q, k, v, None, scaling=0.3, position_ids=pos)
    assert none is None and out.shape == (pos.shape[0], pos.shape[1], 4, 8)
    want = _reference(q, k, v, pos, 0.3)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    got_g = torch.autograd.grad(out, (q, k, v), g)
    want_g = torch.autograd.grad(want, (q, k, v), g)
    for a, b in zip(got_g, want_g):
        # float32 sums over up to 600 keys differ in order between the two paths: allow 1e-5 relative.
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_samples_never_see_each_other():
    """Changing one sample's k/v changes no other sample's output."""
    pos = _pos([7, 5, 9])
    q, k, v = (x.detach() for x in _qkv(1, 21))
    out, _ = sdpa_varlen_attention_forward(CAUSAL, q, k, v, None, position_ids=pos)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 7:12] += 1.0
    v2[:, :, 7:12] -= 2.0
    out2, _ = sdpa_varlen_attention_forward(CAUSAL, q, k2, v2, None, position_ids=pos)
    torch.testing.assert_close(out2[:, :7], out[:, :7], atol=0, rtol=0)
    torch.testing.assert_close(out2[:, 12:], out[:, 12:], atol=0, rtol=0)
    assert not torch.allclose(out2[:, 7:12], out[:, 7:12])


def test_non_causal_module_and_no_position_ids():
    pos = _pos([6, 6, 4])
    q, k, v = (x.detach() for x in _qkv(1, 16))
    out, _ = sdpa_varlen_attention_forward(types.SimpleNamespace(is_causal=False), q, k, v, None, position_ids=pos)
    torch.testing.assert_close(out, _reference(q, k, v, pos, None, causal=False), atol=1e-5, rtol=0)
    out, _ = sdpa_varlen_attention_forward(CAUSAL, q, k, v, None)  # no position_ids: one sample per row
    torch.testing.assert_close(out, _reference(q, k, v, _pos([16]), None), atol=1e-5, rtol=0)


def test_kv_cache_queries_are_the_last_positions():
    """Generation: ``Tq < Tk`` gives the last ``Tq`` rows of the full causal attention."""
    q, k, v = (x.detach() for x in _qkv(1, 10))
    full = _reference(q, k, v, _pos([10]), None)
    for tq in (1, 3):
        out, _ = sdpa_varlen_attention_forward(CAUSAL, q[:, :, -tq:], k, v, None, position_ids=torch.arange(10 - tq, 10)[None])
        torch.testing.assert_close(out, full[:, -tq:], atol=1e-5, rtol=0)


def test_plan_cache_follows_in_place_changes():
    pos = _pos([8, 8])
    q, k, v = (x.detach() for x in _qkv(1, 16))
    sdpa_varlen_attention_forward(CAUSAL, q, k, v, None, position_ids=pos)
    pos[0, 8:] = torch.arange(8, 16)  # now one sample of 16: the cached plan must not be reused
    out, _ = sdpa_varlen_attention_forward(CAUSAL, q, k, v, None, position_ids=pos)
    torch.testing.assert_close(out, _reference(q, k, v, _pos([16]), None), atol=1e-5, rtol=0)


def test_registered_with_no_mask_and_marked_varlen():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    register()
    assert ALL_ATTENTION_FUNCTIONS[IMPLEMENTATION] is sdpa_varlen_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS[IMPLEMENTATION] is no_mask and no_mask(torch.zeros(3)) is None
    assert is_varlen(sdpa_varlen_attention_forward)
    kernel = SDPAVarlenAttention()
    assert kernel.op == "attention" and kernel.available()[0]


@pytest.mark.cli
def test_listed_available_by_omnicore_plugins():
    out = subprocess.run(
        [sys.executable, "-m", "omnicore", "plugins", "--kind", "kernel", "--json"], capture_output=True, text=True, check=True
    )
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert (
        rows["sdpa_varlen"]["status"] == "available"
        and rows["sdpa_varlen"]["target"] == "omnicore.kernels.attention_varlen:SDPAVarlenAttention"
    )


# ---- in the model ------------------------------------------------------------------------------


class _SquareShapes(TorchDispatchMode):
    """Records every op output with two dimensions equal to ``t`` (a ``[T, T]`` mask or score)."""

    def __init__(self, t: int):
        super().__init__()
        self.t, self.hits = t, []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor) and sum(s == self.t for s in x.shape) >= 2:
                self.hits.append((str(func), tuple(x.shape)))
        return out


def _foundation(attention: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**dict(TINY_LM, vocab_size=64))
    lm = AutoModelForCausalLM.from_config(cfg)
    kernel = SDPAVarlenAttention() if attention == IMPLEMENTATION else None
    if kernel:
        kernel.activate(lm)
    else:
        lm.set_attn_implementation(attention)
    return lm


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", IMPLEMENTATION])
def test_no_square_tensor_in_a_packed_forward_and_backward(attention):
    """sdpa builds a ``[T, T]`` block-diagonal mask for a packed row (the positive control);
    sdpa_varlen creates no tensor with two dimensions of length T, forward or backward."""
    lm = _foundation(attention)
    pos = _pos([30, 20, 30, 17])
    t = pos.shape[1]
    ids = torch.randint(0, 64, (1, t), generator=torch.Generator().manual_seed(0))
    with _SquareShapes(t) as mode:
        out = lm(input_ids=ids, position_ids=pos, use_cache=False).logits  # as OmniModel does (a cache turns packing off)
        out.float().pow(2).mean().backward()
    if attention == "sdpa":
        assert mode.hits
    else:
        assert not mode.hits, mode.hits[:3]


@pytest.mark.slow
def test_packed_logits_and_grads_equal_sdpa_on_the_digits_model(digits_jsonl):
    """The tiny omni-modal model on a packed row of real samples (image, audio and image-target):
    sdpa_varlen gives sdpa's logits, loss and every parameter gradient within 1e-5."""
    from omnicore.config import Config
    from omnicore.data.chat import ChatProcessor, module_processors
    from omnicore.data.jsonl import parse_line
    from omnicore.data.packing import collate
    from omnicore.model.build import build_omni_model

    path = digits_jsonl / "train.jsonl"
    results = {}
    for attention in ("sdpa", IMPLEMENTATION):
        raw = tiny_config_dict(str(path))
        raw["model"]["kernels"] = {"attention": attention}
        model, tok = build_omni_model(Config.model_validate(raw))  # seeded: the same weights
        model.eval()
        assert model.lm.config._attn_implementation == attention
        proc = ChatProcessor(tok, module_processors(model.encoders, "encoder"), module_processors(model.decoders, "decoder"))
        encs, tasks = [], set()
        for lineno, text in enumerate(path.read_text().splitlines(), start=1):
            task = json.loads(text)["task"]
            if task not in tasks or len(encs) < 6:
                tasks.add(task)
                encs.append(proc.encode(parse_line(text, str(path), lineno)))
        assert len(tasks) == 3
        mb = collate(encs, proc.encoders, proc.decoders)
        assert len(mb.cu_seqlens) - 1 == len(encs)
        out = model(mb, return_logits=True)
        out.loss_sum.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        results[attention] = (out.logits.detach(), out.loss_sum.detach(), grads)
    (la, sa, ga), (lb, sb, gb) = results["sdpa"], results[IMPLEMENTATION]
    torch.testing.assert_close(lb, la, atol=1e-5, rtol=0)
    torch.testing.assert_close(sb, sa, atol=0, rtol=1e-5)
    assert ga.keys() == gb.keys() and len(ga) > 10
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=1e-5, rtol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.slow
def test_compiled_blocks_follow_new_position_ids():
    """torch.compile'd blocks (dynamo, eager backend) do not bake in one row's sample plan: the
    attention runs eagerly, so a second row with other sample lengths gives uncompiled values."""
    lm, ref = _foundation(IMPLEMENTATION), _foundation(IMPLEMENTATION)
    for layer in lm.model.layers:
        layer.compile(backend="eager")
    ids = torch.randint(0, 64, (1, 97), generator=torch.Generator().manual_seed(0))
    for rows in ([30, 20, 30, 17], [50, 47], [97]):
        pos = _pos(rows)
        with torch.no_grad():
            got = lm(input_ids=ids, position_ids=pos, use_cache=False).logits
            want = ref(input_ids=ids, position_ids=pos, use_cache=False).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_generation_with_kv_cache_equals_sdpa(digits_jsonl):
    """``omnicore.model.generation.generate`` (prefill, then one query per step against the KV cache):
    greedy tokens with sdpa_varlen are sdpa's."""
    from omnicore.config import Config
    from omnicore.data.chat import ChatProcessor, module_processors
    from omnicore.data.jsonl import parse_line
    from omnicore.model.build import build_omni_model
    from omnicore.model.generation import generate

    path = digits_jsonl / "train.jsonl"
    lines = path.read_text().splitlines()[:3]
    got = {}
    for attention in ("sdpa", IMPLEMENTATION):
        raw = tiny_config_dict(str(path), decoders=False)
        raw["model"]["kernels"] = {"attention": attention}
        model, tok = build_omni_model(Config.model_validate(raw))
        model.eval()
        proc = ChatProcessor(tok, module_processors(model.encoders, "encoder"), module_processors(model.decoders, "decoder"))
        got[attention] = [
            generate(model, tok, proc.encode(parse_line(text, str(path), i + 1), prompt_only=True), max_new_tokens=10)["token_ids"]
            for i, text in enumerate(lines)
        ]
    assert got[IMPLEMENTATION] == got["sdpa"] and all(len(ids) > 1 for ids in got["sdpa"])


@pytest.mark.slow
def test_cu_seqlens_flow_from_collate_to_the_kernel(monkeypatch, digits_jsonl):
    """``cu_seqlens`` is built once, at collate, and reaches the varlen kernel through OmniModel's
    keyword arguments: with them the kernel never recomputes boundaries from ``position_ids`` (the
    function that would is made to fail), and the loss equals the run without them, where the kernel
    falls back to ``position_ids``. Wrong boundaries are used as given (the loss changes), so the
    passed value is really the one used."""
    from omnicore.config import Config
    from omnicore.data.chat import ChatProcessor, module_processors
    from omnicore.data.jsonl import read_jsonl
    from omnicore.data.packing import collate
    from omnicore.kernels import attention_varlen
    from omnicore.model.build import build_omni_model

    raw = tiny_config_dict(str(digits_jsonl / "train.jsonl"))
    raw["model"]["kernels"] = {"attention": IMPLEMENTATION}
    model, tok = build_omni_model(Config.model_validate(raw))
    model.eval()
    proc = ChatProcessor(tok, module_processors(model.encoders, "encoder"), module_processors(model.decoders, "decoder"))
    encs = [proc.encode(s) for s in read_jsonl(digits_jsonl / "train.jsonl")[:5]]
    mb = collate(encs, proc.encoders, proc.decoders)
    assert mb.cu_seqlens.tolist() == [0, *torch.tensor([len(e) for e in encs]).cumsum(0).tolist()]
    assert mb.max_seqlen == max(len(e) for e in encs)
    with torch.no_grad():
        fallback = model(dataclasses.replace(mb, cu_seqlens=None, max_seqlen=None)).loss_sum  # recomputed once in forward
        real = attention_varlen.cu_seqlens_from_position_ids

        def fail(*a, **k):
            raise AssertionError("the kernel recomputed cu_seqlens although collate built them")

        monkeypatch.setattr(attention_varlen, "cu_seqlens_from_position_ids", fail)
        attention_varlen._cache.clear()
        passed = model(mb).loss_sum
        torch.testing.assert_close(passed, fallback, rtol=1e-6, atol=0)
        # one sample of the whole row: attention crosses samples, so the loss must differ
        whole = torch.tensor([0, mb.num_tokens], dtype=torch.int32)
        attention_varlen._cache.clear()
        crossed = model(dataclasses.replace(mb, cu_seqlens=whole, max_seqlen=mb.num_tokens)).loss_sum
    monkeypatch.setattr(attention_varlen, "cu_seqlens_from_position_ids", real)
    assert abs(float(crossed) - float(passed)) > 100 * 1e-6 * abs(float(passed))  # far beyond the rounding allowed above
