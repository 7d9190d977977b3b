"""Tied weights (issue 27, item 6).

A tied checkpoint that holds only ``lm_head.weight`` (what ``safetensors.torch.save_model`` writes)
loads, as transformers loads it.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_LM

IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])


def _logits(lm, ids=IDS):
    with torch.no_grad():
        return lm(input_ids=ids).logits


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
