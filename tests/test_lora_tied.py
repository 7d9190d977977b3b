"""LoRA and tied weights (issue 27, item 6).

The training loss counts an adapter on ``lm_head`` (the cross-entropy kernel takes the head's
weight, base plus adapter), so that adapter trains.

A tied checkpoint that holds only ``lm_head.weight`` (what ``safetensors.torch.save_model`` writes)
loads, as transformers loads it.
"""

from __future__ import annotations

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
