"""LoRA through PEFT (``omnicore.model.lora``) and its export (``omnicore.checkpoint.export``).

The tiny Qwen2 of ``conftest.TINY_LM``, text only, built through the real path (config -> registry
-> ``build_omni_model`` -> ``apply_lora`` -> ``parallelize``). A few AdamW steps over the trainable
parameters on fixed random batches; FSDP2 on 2 processes is compared with one process, and the
exports are loaded back with plain transformers and with PEFT and compared with the trained model.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_LM

from omnicore.data.packing import MicroBatch
from omnicore.testing.distributed import max_rel_diff, run_distributed

MICRO = 2  # micro-batches per optimizer step (global)
SEQ = 32
STEPS = 3
LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _cfg(lora: dict | None = None, parallel: dict | None = None):
    from omnicore.config import Config

    return Config.model_validate(
        {
            "run": {"seed": 0, "device": "cpu"},
            "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM)}}, "lora": lora or dict(LORA)},
            "data": {"train": "unused.jsonl"},
            "parallel": parallel or {"dp_shard": -1},
        }
    )


def _batches(vocab: int, n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(99)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (1, SEQ), generator=g)
        labels = torch.full_like(ids, -100)
        labels[:, :-1] = ids[:, 1:]
        out.append({"input_ids": ids, "labels": labels, "position_ids": torch.arange(SEQ).unsqueeze(0)})
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _build(cfg):
    from omnicore.model.build import build_omni_model
    from omnicore.model.lora import apply_lora
    from omnicore.registry import Registry

    model, tok = build_omni_model(cfg, Registry.from_plugins([], builtins=True))
    adapted = apply_lora(model, cfg.model.lora, seed=cfg.run.seed)
    return model, tok, adapted


def train_lora(parallel: dict, keep_model: bool = False, export_dir: str | None = None) -> dict:
    """STEPS AdamW steps (lr 1e-2) over the trainable parameters, each on the same MICRO batches
    (split over the data-parallel ranks); returns per-step losses and every parameter's full value
    after the steps (on every rank). ``export_dir``: then export the model there (merged)."""
    from omnicore.parallel.parallelize import build_strategies, parallelize
    from omnicore.parallel.state import ParallelState, init_parallel_state
    from omnicore.registry import Registry

    cfg = _cfg(parallel=parallel)
    dist = torch.distributed.is_initialized()
    state = init_parallel_state("cpu", "gloo", cfg.parallel) if dist else ParallelState(0, 1, 0, torch.device("cpu"))
    model, tok, _ = _build(cfg)
    model = parallelize(model, state, build_strategies(cfg.parallel, Registry.from_plugins([], builtins=True), dist))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, foreach=False)
    batches = _batches(len(tok), MICRO)  # the same batches every step: the loss on them must fall
    losses = []
    for _ in range(STEPS):
        mine = [batches[k * state.dp_size + state.dp_rank] for k in range(MICRO // state.dp_size)]
        n_global = state.all_reduce_sum(sum(int((b["labels"] != -100).sum()) for b in mine), dim="dp")
        loss_sum = 0.0
        for b in mine:
            out = model(MicroBatch(**b))
            (out.loss_sum * state.world_size / n_global).backward()
            loss_sum += float(out.loss_sum.detach())
        losses.append(state.all_reduce_sum(loss_sum) / n_global)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sharded = any(hasattr(p, "full_tensor") for p in model.parameters())
    result = {"losses": losses, "params": {n: _full(p) for n, p in model.named_parameters()}, "sharded": sharded}
    if export_dir is not None:
        from omnicore.checkpoint.export import export_model

        export_model(model, tok, cfg, export_dir, state)  # collective: every rank gathers
    if keep_model:
        result.update(model=model, tokenizer=tok, cfg=cfg, state=state, batches=batches)
    return result


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


@pytest.mark.multiprocess
def test_lora_fsdp2_two_processes_match_one_process_and_base_stays_bit_identical(tmp_path):
    """Losses and adapters of 2 FSDP2 ranks equal 1 process; the merged export written from the
    sharded model gives the 1-process model's logits."""
    from transformers import AutoModelForCausalLM

    initial, _, adapted = _build(_cfg())
    initial_params = {n: p.detach().clone() for n, p in initial.named_parameters()}
    ref = train_lora({"dp_shard": -1}, keep_model=True)
    ranks = run_distributed(train_lora, 2, args=({"dp_shard": -1, "strategies": ["fsdp2"]}, False, str(tmp_path / "export")))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export" / "foundation")
    ids = ref["batches"][0]["input_ids"]
    assert max_rel_diff(_lm_logits(exported, ids), _lm_logits(ref["model"].lm, ids)) <= 1e-5
    assert len(adapted) == 3 * TINY_LM["num_hidden_layers"]
    adapters = {n for n in ref["params"] if _is_adapter(n)}
    assert len(adapters) == 2 * len(adapted)
    assert ref["losses"][-1] < ref["losses"][0]  # the adapters learned something
    assert not ref["sharded"]
    for got in ranks:
        assert got["sharded"]  # FSDP2 really wrapped the LoRA model
        loss_diff = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref["losses"]))
        assert loss_diff <= 1e-5, (got["losses"], ref["losses"])
        assert max_rel_diff({n: got["params"][n] for n in adapters}, {n: ref["params"][n] for n in adapters}) <= 1e-5
        for name, value in got["params"].items():
            if not _is_adapter(name):  # base weights, norms, embeddings: frozen by LoRA
                assert torch.equal(value, initial_params[name]), name
    # lora_B starts at zero (PEFT's init) and moved; lora_A moved from its kaiming init
    for name in adapters:
        assert not torch.equal(ref["params"][name], initial_params[name]), name


@pytest.fixture(scope="module")
def trained() -> dict:
    return train_lora({"dp_shard": -1}, keep_model=True)


def _lm_logits(lm, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return lm(input_ids=ids).logits


def _export(trained: dict, tmp_path, mode: str):
    from omnicore.checkpoint.export import export_model

    cfg = trained["cfg"].model_copy(deep=True)
    cfg.model.lora.export = mode
    return export_model(trained["model"], trained["tokenizer"], cfg, tmp_path / "export", trained["state"])


@pytest.mark.slow
def test_merged_export_loads_in_plain_transformers_with_the_trained_logits(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    out = _export(trained, tmp_path, "merged")
    ids = trained["batches"][0]["input_ids"]
    want = _lm_logits(trained["model"].lm, ids)
    plain = AutoModelForCausalLM.from_pretrained(out / "foundation")
    assert not any("lora" in n for n, _ in plain.named_parameters())
    assert max_rel_diff(_lm_logits(plain, ids), want) <= 1e-5
    # the merged q_proj of layer 0 is W + (alpha / r) * B @ A of the trained layer
    layer = trained["model"].lm.model.layers[0].self_attn.q_proj
    merged = layer.base_layer.weight + (LORA["alpha"] / LORA["r"]) * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    assert max_rel_diff(plain.model.layers[0].self_attn.q_proj.weight.detach(), merged.detach()) <= 1e-6
    assert "lora: null" in (out / "omnicore.yaml").read_text()


@pytest.mark.slow
def test_adapter_export_loads_with_peft_with_the_trained_logits(trained, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = _export(trained, tmp_path, "adapter")
    ids = trained["batches"][1]["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(out / "foundation")
    # the base folder holds the untouched base weights
    layer = trained["model"].lm.model.layers[1].mlp.down_proj
    assert torch.equal(base.model.layers[1].mlp.down_proj.weight, layer.base_layer.weight.detach())
    base_logits = _lm_logits(base, ids)
    peft_model = PeftModel.from_pretrained(base, out / "foundation_lora")
    want = _lm_logits(trained["model"].lm, ids)
    assert max_rel_diff(_lm_logits(peft_model, ids), want) <= 1e-5
    assert max_rel_diff(base_logits, want) > 1e-4  # the adapters matter: without them the logits differ
    assert "PeftModel.from_pretrained" in (out / "omnicore.yaml").read_text()
    # omnicore's own loader (eval, generate) puts the adapter back too
    from omnicore.eval.loading import load_trained

    reloaded, _, _ = load_trained(trained["cfg"], export=str(out))
    assert max_rel_diff(_lm_logits(reloaded.lm, ids), want) <= 1e-5


def test_target_matching_nothing_is_a_config_error_listing_the_linear_names():
    from omnicore.config import ConfigError

    with pytest.raises(ConfigError) as exc:
        _build(_cfg({"target_modules": ["q_proj", "qkv_proj"]}))
    msg = str(exc.value)
    assert "model.lora.target_modules" in msg and "'qkv_proj'" in msg
    for name in ("q_proj", "k_proj", "gate_proj", "down_proj"):
        assert name in msg
    with pytest.raises(ConfigError, match=r"model.lora.modules: 'encoders.image' names no submodule"):
        _build(_cfg({"modules": ["encoders.image"]}))


def test_meta_base_gets_real_cpu_adapters_initialised_the_peft_way():
    from omnicore.model.build import build_omni_model
    from omnicore.model.lora import apply_lora
    from omnicore.registry import Registry

    cfg = _cfg()
    with torch.device("meta"):
        model, _ = build_omni_model(cfg, Registry.from_plugins([], builtins=True))
    adapted = apply_lora(model, cfg.model.lora, seed=7)
    # reference: the same seed, kaiming-uniform(a=sqrt(5)) per lora_A in module order, lora_B zeros
    g = torch.Generator().manual_seed(7)
    for name in adapted:
        layer = model.get_submodule(name)
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        assert layer.base_layer.weight.is_meta and not a.is_meta and not b.is_meta
        assert a.device.type == "cpu" and a.requires_grad and not layer.base_layer.weight.requires_grad
        bound = 1 / math.sqrt(a.shape[1])  # kaiming_uniform with a=sqrt(5): gain sqrt(1/3), bound gain*sqrt(3/fan_in)
        want = torch.empty(a.shape).uniform_(-bound, bound, generator=g)
        assert torch.allclose(a, want, rtol=0, atol=1e-7), name
        assert torch.count_nonzero(b) == 0
    # the same seed on a CPU-built base gives the same adapters (so every rank, and either path, agree)
    cpu, _ = build_omni_model(cfg, Registry.from_plugins([], builtins=True))
    apply_lora(cpu, cfg.model.lora, seed=7)
    want = {n: p for n, p in cpu.named_parameters() if _is_adapter(n)}
    got = {n: p for n, p in model.named_parameters() if _is_adapter(n)}
    assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)
    # inside a meta context (omnicore plan) the adapters stay on meta and are counted
    with torch.device("meta"):
        planned, _ = build_omni_model(cfg, Registry.from_plugins([], builtins=True))
        apply_lora(planned, cfg.model.lora)
    n_adapter = sum(p.numel() for n, p in planned.named_parameters() if _is_adapter(n))
    h, inter, kv = TINY_LM["hidden_size"], TINY_LM["intermediate_size"], TINY_LM["hidden_size"] // 2
    per_layer = LORA["r"] * ((h + h) + (h + kv) + (inter + h))  # q (h->h), v (h->kv), down (inter->h)
    assert n_adapter == per_layer * TINY_LM["num_hidden_layers"]
    assert all(p.is_meta for p in planned.parameters())


@pytest.mark.slow
def test_training_run_with_lora_freezes_the_foundation_and_exports_the_merged_model(digits_jsonl, tmp_path):
    """The real loop (``train``): LoRA on the foundation, encoders and decoders training; the checkpoint loads
    back through ``load_trained`` with its adapters, and the merged export gives its logits."""
    from conftest import tiny_config_dict
    from transformers import AutoModelForCausalLM

    from omnicore.config import Config
    from omnicore.eval.loading import load_trained
    from omnicore.model.build import build_omni_model
    from omnicore.train.loop import train

    raw = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(tmp_path / "run"), max_steps=3, export=True)
    raw["model"]["lora"] = dict(LORA)
    cfg = Config.model_validate(raw)
    history = train(cfg)
    assert [r["step"] for r in history] == [1, 2, 3]
    trained, _, _ = load_trained(cfg, checkpoint=str(tmp_path / "run" / "checkpoints" / "step-00000003"))
    fresh, _ = build_omni_model(cfg)
    after = dict(trained.named_parameters())
    for name, p in fresh.named_parameters():  # the foundation's weights: frozen by LoRA, bit-identical
        if name.startswith("lm."):
            owner, _, leaf = name.rpartition(".")
            key = name if name in after else f"{owner}.base_layer.{leaf}"  # PEFT moved it under base_layer
            assert torch.equal(after[key], p), name
    moved = [n for n, p in fresh.named_parameters() if n.startswith("encoders.") and not torch.equal(after[n], p)]
    assert moved  # encoders are outside model.lora.modules: they trained
    ids = torch.tensor([[5, 17, 42, 99, 3, 64]])
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "export" / "foundation")
    assert max_rel_diff(_lm_logits(hf, ids), _lm_logits(trained.lm, ids)) <= 1e-5
    assert max_rel_diff(_lm_logits(hf, ids), _lm_logits(fresh.lm, ids)) > 1e-4  # the adapters trained


@pytest.mark.slow
def test_merged_export_keeps_tied_embeddings_tied(tmp_path):
    """A foundation with ``tie_word_embeddings``: the export gathers two tensors for one; the
    rebuilt model shares them again, and the merged folder gives the adapted model's logits."""
    from transformers import AutoModelForCausalLM

    from omnicore.checkpoint.export import export_model
    from omnicore.parallel.state import ParallelState

    cfg = _cfg()
    cfg.model.foundation.options["config"]["tie_word_embeddings"] = True
    model, tok, _ = _build(cfg)
    assert model.lm.lm_head.weight is model.lm.get_input_embeddings().weight
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # stand-in for trained adapters: lora_B away from its zero init
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    out = export_model(model, tok, cfg, tmp_path / "export", ParallelState(0, 1, 0, torch.device("cpu")))
    hf = AutoModelForCausalLM.from_pretrained(out / "foundation")
    assert hf.lm_head.weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    assert max_rel_diff(_lm_logits(hf, ids), _lm_logits(model.lm, ids)) <= 1e-5
