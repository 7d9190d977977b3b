"""Pretrained foundations: Hub names through the local HF cache, strict keys, dtype, and sharded loading.

References are computed another way: the saved transformers model itself, ``from_pretrained``
loading the whole model on one process, and the checkpoint's tensors read directly.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_LM, tiny_config_dict
from safetensors.torch import load_file, save_file

from omnicore.config import Config
from omnicore.registry import RegistryError

SHA = "0123456789abcdef0123456789abcdef01234567"


def _save_lm(folder, vocab=300, seed=1, tie=False):
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {k: v for k, v in TINY_LM.items() if k != "model_type"}
    config = AutoConfig.for_model("qwen2", **kw, vocab_size=vocab, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder)
    return model


def _cfg(checkpoint, **foundation):
    raw = {"data": {"train": "x.jsonl"}, "model": {"foundation": {"name": "hf_causal_lm", "options": {"checkpoint": str(checkpoint)}}}}
    raw["model"]["foundation"].update(foundation)
    return Config.model_validate(raw)


def _logits(lm, ids):
    with torch.no_grad():
        return lm.eval()(ids).logits


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm") / "lm"
    return folder, _save_lm(folder)


@pytest.mark.slow
def test_loaded_by_name_from_the_local_hf_cache_offline(saved, tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    from omnicore.model.build import build_omni_model

    folder, ref = saved
    repo = tmp_path / "hub" / "models--tiny-org--tiny-lm"
    snap = repo / "snapshots" / SHA
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    model, tok = build_omni_model(_cfg("tiny-org/tiny-lm"))
    ids = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    assert torch.equal(_logits(model.lm, ids), _logits(ref, ids))
    assert model.pending_loads == []  # filled on this process (no defer_load)

    with pytest.raises(
        RegistryError,
        match=r"model.foundation: options.checkpoint: 'tiny-org/absent' is neither a folder .* local Hugging Face cache .*HF_HUB_OFFLINE is set",
    ):
        build_omni_model(_cfg("tiny-org/absent"))


def test_meta_build_then_fill_equals_from_pretrained_and_grows_rows_with_the_mean(tmp_path):
    """vocab 256 < the tokenizer's 259 (omnicore's 3 special tokens): 3 new rows, each the mean of the checkpoint's rows."""
    from omnicore.model.build import build_omni_model

    ref = _save_lm(tmp_path / "lm", vocab=256)
    model, tok = build_omni_model(_cfg(tmp_path / "lm"), defer_load=True)
    assert all(p.is_meta for p in model.lm.parameters())
    assert not model.lm.model.rotary_emb.inv_freq.is_meta  # buffers are real from the start
    assert [p.prefix for p in model.pending_loads] == ["lm."]
    from omnicore.model.loading import fill_pending

    assert fill_pending(model) == len(list(ref.parameters()))
    got, want = dict(model.lm.named_parameters()), dict(ref.named_parameters())
    for name in want:
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            assert got[name].shape == (len(tok), 32)
            assert torch.equal(got[name][:256], want[name])
            mean = want[name].double().mean(0).float()
            assert torch.allclose(got[name][256:], mean.expand(len(tok) - 256, -1), atol=1e-7)
        else:
            assert torch.equal(got[name], want[name]), name
    assert torch.equal(model.lm.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)


@pytest.mark.slow
def test_tied_embeddings_stay_one_tensor(tmp_path):
    """A tied checkpoint has no lm_head.weight; the filled model shares one tensor, as from_pretrained's does."""
    from omnicore.model.build import build_omni_model

    ref = _save_lm(tmp_path / "lm", tie=True)
    model, _ = build_omni_model(_cfg(tmp_path / "lm"))
    assert model.lm.lm_head.weight is model.lm.model.embed_tokens.weight
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    assert torch.equal(_logits(model.lm, ids), _logits(ref, ids))


def test_bf16_component_dtype_casts_while_reading(saved):
    from omnicore.model.build import build_omni_model

    folder, ref = saved
    model, _ = build_omni_model(_cfg(folder, dtype="bfloat16"))
    assert {p.dtype for p in model.lm.parameters()} == {torch.bfloat16}
    w = model.lm.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(w, ref.model.layers[0].self_attn.q_proj.weight.to(torch.bfloat16))


def _edit(folder, dest, drop=(), add=None):
    dest.mkdir()
    for f in folder.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    sd = load_file(dest / "model.safetensors")
    for k in drop:
        sd.pop(k)
    sd.update(add or {})
    save_file(sd, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def test_missing_attention_projection_fails_before_training_with_its_name(saved, tmp_path):
    from omnicore.model.build import build_omni_model

    folder, ref = saved
    bad = _edit(folder, tmp_path / "bad", drop=["model.layers.1.self_attn.k_proj.weight"])
    with pytest.raises(RegistryError, match=r"lacks 1 of the model's \d+ tensors: 'model.layers.1.self_attn.k_proj.weight'.*init_fresh"):
        build_omni_model(_cfg(bad))
    # listed in init_fresh: built, with a fresh seeded tensor (the same on every build), the rest loaded
    model, _ = build_omni_model(_cfg(bad, options={"checkpoint": str(bad), "init_fresh": ["model.layers.1.self_attn.k_proj"]}))
    again, _ = build_omni_model(_cfg(bad, options={"checkpoint": str(bad), "init_fresh": ["model.layers.1.self_attn.k_proj"]}))
    fresh = model.lm.model.layers[1].self_attn.k_proj.weight
    assert torch.equal(fresh, again.lm.model.layers[1].self_attn.k_proj.weight)
    assert 0.01 < float(fresh.detach().std()) < 0.03  # normal(0, initializer_range 0.02)
    assert torch.equal(model.lm.model.layers[1].self_attn.q_proj.weight, ref.model.layers[1].self_attn.q_proj.weight)


def test_unused_checkpoint_tensor_and_idle_patterns_are_errors(saved, tmp_path):
    from omnicore.model.build import build_omni_model

    folder, _ = saved
    extra = _edit(folder, tmp_path / "extra", add={"visual.proj.weight": torch.zeros(2, 2)})
    with pytest.raises(RegistryError, match=r"holds 1 tensors the model does not use: 'visual.proj.weight'.*ignore_unused"):
        build_omni_model(_cfg(extra))
    build_omni_model(_cfg(extra, options={"checkpoint": str(extra), "ignore_unused": ["visual"]}))
    with pytest.raises(RegistryError, match=r"init_fresh patterns match nothing: \['lm_hed'\]"):
        build_omni_model(_cfg(folder, options={"checkpoint": str(folder), "init_fresh": ["lm_hed"]}))


def test_moe_checkpoint_without_its_router_fails_by_name(tmp_path):
    """Qwen3-MoE checkpoints are converted by transformers while loading (per-expert tensors fused),
    so they load whole through from_pretrained, with the same strict key check."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from omnicore.model.build import build_omni_model

    config = AutoConfig.for_model(
        "qwen3_moe", hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, vocab_size=300,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "moe")
    bad = _edit(tmp_path / "moe", tmp_path / "bad", drop=["model.layers.0.mlp.gate.weight"])
    with pytest.raises(RegistryError, match=r"does not fit the model: lacks \['model.layers.0.mlp.gate.weight'\]"):
        build_omni_model(_cfg(bad))


# ---------------------------------------------------------------------------------------------
# sharded loading on 2 processes
# ---------------------------------------------------------------------------------------------


def train_rank(raw: dict, out: str, whole: bool = False) -> dict:
    """One training step from the foundation checkpoint; ``whole``: the reference, loaded whole by from_pretrained."""
    from unittest import mock

    from omnicore.model import loading
    from omnicore.train.loop import train

    d = copy.deepcopy(raw)
    d["run"]["output_dir"] = out
    read = []  # (elements this rank filled, elements of the whole parameter)
    real = loading._local_and_offset

    def spy(p):
        local, offset = real(p)
        read.append((local.numel(), p.numel()))
        return local, offset

    with (
        mock.patch.object(loading, "checkpoint_index", return_value=None) if whole else mock.patch.object(loading, "_local_and_offset", spy)
    ):
        rows = train(Config.model_validate(d))
    return {"losses": [r["loss"] for r in rows], "grad_norms": [r["grad_norm"] for r in rows], "read": read}


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def text_run(tmp_path_factory, saved, request):
    folder = tmp_path_factory.mktemp("sharded")
    lines = []
    for i in range(24):
        q = "Add " + " ".join(str((i * 5 + k) % 10) for k in range(2 + i % 6))
        lines.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 3)}]})
    (folder / "text.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    raw = tiny_config_dict(str(folder / "text.jsonl"), decoders=False, max_steps=2, grad_accum=2)
    raw["model"]["encoders"] = {}
    lm = saved[0]
    if request.param:
        lm = folder / "tied"
        _save_lm(lm, tie=True)
    raw["model"]["foundation"]["options"] = {"checkpoint": str(lm)}
    raw["data"].update(max_tokens=128, num_workers=0)
    return folder, raw, request.param


@pytest.mark.multiprocess
def test_two_processes_sharded_loading_equal_one_process_whole_model(text_run):
    from omnicore.testing.distributed import run_distributed

    folder, raw, tied = text_run
    ref = train_rank(raw, str(folder / "whole"), whole=True)
    two = dict(
        raw, parallel={"strategies": ["fsdp2"], "backend": "gloo"}, train=dict(raw["train"], grad_accum=1)
    )  # the same 2 micro-batches a step
    ranks = run_distributed(train_rank, 2, args=(two, str(folder / "two")))
    assert ranks[0]["losses"] == ranks[1]["losses"] and ref["read"] == []  # the reference read nothing shard by shard
    n_params = len(ranks[0]["read"])
    assert n_params == 27 - tied and all(len(r["read"]) == n_params for r in ranks)
    # each rank filled only its shard of every parameter: together, each element exactly once
    assert all(a[0] + b[0] == a[1] and a[0] <= (a[1] + 1) // 2 for a, b in zip(ranks[0]["read"], ranks[1]["read"]))
    assert ranks[0]["losses"] == pytest.approx(ref["losses"], rel=1e-6)
    assert ranks[0]["grad_norms"][0] == pytest.approx(ref["grad_norms"][0], rel=1e-5)


@pytest.mark.multiprocess
def test_lora_on_a_checkpoint_loaded_foundation(text_run, tmp_path):
    """LoRA wraps the layers whose base weights are still on meta: the fill follows them to
    ``base_layer``; the base weights are the checkpoint's, and 2 processes equal 1."""
    from safetensors import safe_open

    from omnicore.testing.distributed import run_distributed
    from omnicore.train.loop import setup

    folder, raw, tied = text_run
    if tied:
        pytest.skip("one variant is enough")
    raw = copy.deepcopy(raw)
    raw["model"]["lora"] = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    raw["run"]["output_dir"] = str(tmp_path / "setup")
    run = setup(Config.model_validate(raw))
    try:
        params = dict(run.model.named_parameters())
        with safe_open(str(Path(raw["model"]["foundation"]["options"]["checkpoint"]) / "model.safetensors"), "pt") as f:
            for key in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.v_proj.bias"):
                head, _, leaf = key.rpartition(".")
                assert torch.equal(params[f"lm.{head}.base_layer.{leaf}"], f.get_tensor(key)), key
            assert torch.equal(params["lm.model.layers.1.mlp.up_proj.weight"], f.get_tensor("model.layers.1.mlp.up_proj.weight"))
        assert not params["lm.model.layers.0.self_attn.q_proj.base_layer.weight"].requires_grad
        assert all(p.requires_grad == ("lora_" in n) for n, p in params.items() if n.startswith("lm."))
    finally:
        run.data.close()
    ref = train_rank(raw, str(tmp_path / "one"))
    two = dict(raw, parallel={"strategies": ["fsdp2"], "backend": "gloo"}, train=dict(raw["train"], grad_accum=1))
    ranks = run_distributed(train_rank, 2, args=(two, str(tmp_path / "two")))
    assert ranks[0]["losses"] == ranks[1]["losses"]
    assert ranks[0]["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    assert len(ranks[0]["read"]) == 27  # every base tensor filled shard by shard, under its new name
