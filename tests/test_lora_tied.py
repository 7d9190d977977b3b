"""LoRA and tied weights (issue 27, item 6).

``tie_word_embeddings`` makes ``lm_head`` and ``embed_tokens`` one tensor. An adapter on ``lm_head``
changes the output side only, so the merged export writes the two untied (both tensors,
``tie_word_embeddings: false``) and gives the adapted model's logits; the reference is computed apart
from omnicore's merge: the unmerged PEFT forward, and ``E + (alpha / r) * B @ A`` by hand. A published
family's export writes its own (tied) config, so there the combination is refused before step 1.
The training loss counts the head's adapter (the cross-entropy kernel takes the head's weight, base
plus adapter), so that adapter trains.

A tied checkpoint that holds only ``lm_head.weight`` (what ``safetensors.torch.save_model`` writes)
loads, as transformers loads it.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from conftest import TINY_LM

from omnicore.testing.distributed import max_rel_diff

LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "lm_head"]}
IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])


def _cfg(lora: dict | None = None, foundation: str = "hf_causal_lm", data: str = "unused.jsonl", **train):
    from omnicore.config import Config

    return Config.model_validate(
        {
            "run": {"seed": 0, "device": "cpu"},
            "model": {
                "foundation": {"name": foundation, "options": {"config": dict(TINY_LM, tie_word_embeddings=True)}},
                "lora": dict(lora or LORA),
            },
            "data": {"train": data},
            "train": train,
        }
    )


def _adapted(cfg, scale: float = 0.1):
    """The tied tiny Qwen2 with LoRA whose ``lora_B`` moved from its zero init (as after training)."""
    from omnicore.model.build import build_omni_model
    from omnicore.model.lora import apply_lora
    from omnicore.registry import Registry

    model, tok = build_omni_model(cfg, Registry.from_plugins([], builtins=True))
    apply_lora(model, cfg.model.lora, seed=0)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(scale * torch.randn(p.shape, generator=g))
    return model.eval(), tok


def _logits(lm, ids=IDS):
    with torch.no_grad():
        return lm(input_ids=ids).logits


def _export(model, tok, cfg, folder):
    from omnicore.checkpoint.export import export_model
    from omnicore.parallel.state import ParallelState

    return export_model(model, tok, cfg, folder, ParallelState(0, 1, 0, torch.device("cpu")))


def test_merged_export_of_an_adapted_tied_lm_head_is_untied_and_equals_base_plus_adapter(tmp_path, caplog):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    cfg = _cfg()
    model, tok = _adapted(cfg)
    lm = model.lm
    head = lm.lm_head
    emb = lm.get_input_embeddings().weight.detach().clone()
    assert head.base_layer.weight is lm.get_input_embeddings().weight  # tied in training
    want = _logits(lm)  # PEFT's unmerged forward: base plus adapter
    # by hand: the head is E + (alpha / r) * B @ A; the input embedding stays E
    head_weight = emb + (LORA["alpha"] / LORA["r"]) * head.lora_B["default"].weight @ head.lora_A["default"].weight
    with caplog.at_level(logging.INFO, logger="omnicore.checkpoint.export"):
        out = _export(model, tok, cfg, tmp_path / "export")
    assert any("tie_word_embeddings: false" in r.getMessage() for r in caplog.records)

    hf, info = AutoModelForCausalLM.from_pretrained(out / "foundation", output_loading_info=True)
    assert type(hf) is Qwen2ForCausalLM
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert json.loads((out / "foundation" / "config.json").read_text())["tie_word_embeddings"] is False
    with safe_open(str(out / "foundation" / "model.safetensors"), "pt") as f:
        assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(f.keys())
    assert hf.lm_head.weight is not hf.get_input_embeddings().weight
    assert torch.equal(hf.get_input_embeddings().weight, emb)  # the merge left the embedding alone
    assert max_rel_diff(hf.lm_head.weight.detach(), head_weight.detach()) <= 1e-6
    assert max_rel_diff(_logits(hf), want) <= 1e-5
    # the trained model is untouched by the export (the merge runs on its copy)
    assert torch.equal(lm.get_input_embeddings().weight, emb) and head.base_layer.weight is lm.get_input_embeddings().weight


def test_adapter_export_of_a_tied_lm_head_keeps_the_base_tied_and_peft_gives_the_logits(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from omnicore.eval.loading import load_trained

    cfg = _cfg(dict(LORA, export="adapter"))
    model, tok = _adapted(cfg)
    want = _logits(model.lm)
    out = _export(model, tok, cfg, tmp_path / "export")
    base = AutoModelForCausalLM.from_pretrained(out / "foundation")
    assert base.config.tie_word_embeddings and base.lm_head.weight is base.get_input_embeddings().weight
    assert max_rel_diff(_logits(base), want) > 1e-3  # the adapter matters
    assert max_rel_diff(_logits(PeftModel.from_pretrained(base, out / "foundation_lora")), want) <= 1e-5
    reloaded, _, _ = load_trained(cfg, export=str(out))  # omnicore's own loader puts the adapter back
    assert max_rel_diff(_logits(reloaded.lm), want) <= 1e-5


def test_merge_lora_unties_only_a_changed_head_and_never_writes_into_the_embedding():
    from omnicore.model.lora import merge_lora, tied_adapted

    for scale, tied_after in ((0.1, False), (0.0, True)):  # lora_B zero: the merged head equals E, so it stays tied
        model, _ = _adapted(_cfg(), scale)
        assert tied_adapted(model) == [("lm.lm_head", "lm.model.embed_tokens.weight")]
        emb = model.lm.get_input_embeddings().weight
        before = emb.detach().clone()
        assert merge_lora(model) == TINY_LM["num_hidden_layers"] + 1
        assert (model.lm.lm_head.weight is emb) is tied_after
        assert model.lm.get_input_embeddings().weight is emb and torch.equal(emb, before)
        assert tied_adapted(model) == []


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_the_training_loss_counts_and_trains_the_lm_head_adapter(dropout):
    """The loss the kernel computes from the LM head's weight equals the loss of the head module
    (base plus adapter), and the head's adapter gets gradients; with adapter dropout (no one weight
    is exact) the module itself runs."""
    from omnicore.data.packing import MicroBatch
    from omnicore.model.lora import head_weight

    model, _ = _adapted(_cfg(dict(LORA, dropout=dropout)))
    head = model.lm.lm_head
    ids = torch.randint(0, head.out_features, (1, 24), generator=torch.Generator().manual_seed(0))
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], dim=1)
    batch = MicroBatch(input_ids=ids, labels=labels, position_ids=torch.arange(24).unsqueeze(0))
    model.eval()  # no dropout: the kernel's loss (from head_weight) against the module's logits
    with torch.no_grad():
        kernel, module = float(model(batch).loss_sum), float(model(batch, return_logits=True).loss_sum)
    assert abs(kernel - module) <= 1e-5 * abs(module)
    base = head.get_base_layer().weight + (LORA["alpha"] / LORA["r"]) * head.lora_B["default"].weight @ head.lora_A["default"].weight
    assert max_rel_diff(head_weight(head).detach(), base.detach()) <= 1e-6
    model.train()
    assert (head_weight(head) is None) == (dropout > 0)
    model(batch).loss_sum.backward()
    for part in (head.lora_A, head.lora_B):
        assert part["default"].weight.grad is not None and part["default"].weight.grad.abs().max() > 0


def tied_family(options: dict):
    """A foundation with ``export_pretrained``, as a published family has (the stand-in of
    :func:`test_a_tied_lm_head_adapter_of_a_family_is_refused_before_step_1`)."""
    from omnicore.model.foundation import HFCausalLM

    class TiedFamily(HFCausalLM):
        def export_pretrained(self, model, tokenizer, folder):  # never reached: refused before training
            raise AssertionError("export_pretrained called")

    return TiedFamily(options)


def test_a_tied_lm_head_adapter_of_a_family_is_refused_before_step_1(tmp_path):
    from omnicore.components import ComponentSpec
    from omnicore.config import ConfigError
    from omnicore.hookspecs import hookimpl
    from omnicore.parallel.state import ParallelState
    from omnicore.registry import Registry
    from omnicore.train.loop import _model_to_train

    class Plugin:
        @hookimpl
        def omnicore_foundations(self):
            return [
                ComponentSpec(
                    name="tiedfam", target="test_lora_tied:tied_family", options_model="omnicore.model.foundation:HFCausalLMOptions"
                )
            ]

    reg = Registry.from_plugins([(Plugin(), "lora-tied-test")], builtins=True)
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n"
    )
    state = ParallelState(0, 1, 0, torch.device("cpu"))

    data = str(tmp_path / "train.jsonl")

    def setup(cfg):
        return _model_to_train(cfg, reg, state, False, lambda *a, **k: None)

    with pytest.raises(ConfigError) as exc:
        setup(_cfg(foundation="tiedfam", data=data))
    assert str(exc.value) == (
        "model.lora.target_modules: the adapter on lm.lm_head cannot be merged exactly: its weight is tied to "
        "lm.model.embed_tokens.weight (tie_word_embeddings), and foundation 'tiedfam' exports its published config, which "
        "ties them again. Set model.lora.export: adapter (the PEFT adapter keeps the embedding apart), or leave 'lm_head' "
        "out of model.lora.target_modules"
    )
    # what the message offers passes, as do the built-in foundation and a run without export
    for cfg in (
        _cfg(dict(LORA, export="adapter"), foundation="tiedfam", data=data),
        _cfg(dict(LORA, target_modules=["q_proj"]), foundation="tiedfam", data=data),
        _cfg(foundation="tiedfam", data=data, export=False),
        _cfg(data=data),
    ):
        setup(cfg)


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_tied_checkpoint_holding_only_lm_head_loads_like_transformers(tmp_path, model_type):
    from safetensors import safe_open
    from safetensors.torch import save_file, save_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from omnicore.model.foundation import HFCausalLM
    from omnicore.model.loading import fill_now

    settings = {k: v for k, v in TINY_LM.items() if k != "model_type"}
    config = AutoConfig.for_model(model_type, **settings, vocab_size=300, tie_word_embeddings=True)
    torch.manual_seed(0)
    source = AutoModelForCausalLM.from_config(config)
    config.save_pretrained(tmp_path)
    save_model(source, str(tmp_path / "model.safetensors"))  # keeps one name of the tied pair
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" in f.keys() and "model.embed_tokens.weight" not in f.keys()
    want = _logits(AutoModelForCausalLM.from_pretrained(tmp_path))
    assert torch.equal(want, _logits(source))

    lm = fill_now(HFCausalLM({"checkpoint": str(tmp_path), "tokenizer": "byte"}).build_model(300))
    assert lm.lm_head.weight is lm.get_input_embeddings().weight
    assert torch.equal(lm.get_input_embeddings().weight, source.get_input_embeddings().weight)
    assert torch.equal(_logits(lm), want)
    # a file holding both names of the tied tensor reads one and leaves the other as a copy of it
    save_file({k: v.clone() for k, v in source.state_dict().items()}, str(tmp_path / "model.safetensors"))
    lm = fill_now(HFCausalLM({"checkpoint": str(tmp_path), "tokenizer": "byte"}).build_model(300))
    assert torch.equal(_logits(lm), want)


@pytest.mark.slow
def test_training_run_exports_the_tied_lm_head_adapter_it_trained(tmp_path):
    """The issue's run: ``train`` on the tied foundation with ``target_modules: [q_proj, lm_head]``
    ends with an export (it raised ``KeyError: "attribute 'weight' already exists"``) whose logits
    are those of the last checkpoint, read back with its adapters."""
    from transformers import AutoModelForCausalLM

    from omnicore.config import Config
    from omnicore.eval.loading import load_trained
    from omnicore.train.loop import train

    lines = [{"messages": [{"role": "user", "content": f"count {i}"}, {"role": "assistant", "content": str(i) * 3}]} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    raw = _cfg(data=str(tmp_path / "train.jsonl"), max_steps=2, lr=1e-2, progress=False).model_dump()
    raw["run"]["output_dir"] = str(tmp_path / "run")
    raw["data"]["num_workers"] = 0  # no worker start-up: the test is about the model
    cfg = Config.model_validate(raw)
    assert [r["step"] for r in train(cfg)] == [1, 2]
    trained, _, _ = load_trained(cfg, checkpoint=str(tmp_path / "run" / "checkpoints" / "step-00000002"))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "export" / "foundation")
    assert not hf.config.tie_word_embeddings
    assert torch.equal(hf.get_input_embeddings().weight, trained.lm.get_input_embeddings().weight)
    assert max_rel_diff(_logits(hf), _logits(trained.lm)) <= 1e-5
