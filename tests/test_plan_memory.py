"""``omnicore plan``'s gradient and AdamW memory with ``train.freeze``, against what a real optimizer
step holds: the bytes of every ``.grad`` and of AdamW's ``exp_avg`` / ``exp_avg_sq`` after one step
of the model the training set-up builds (frozen parameters: neither), in fp32 and in bf16."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_LM

from omnicore.config import Config
from omnicore.model.build import build_omni_model
from omnicore.model.trainable import apply_freeze
from omnicore.parallel.plan import make_plan
from omnicore.registry import Registry
from omnicore.train.optim import build_optimizer

FREEZE = ["lm.model.layers.0", "lm.model.embed_tokens"]


def _cfg(dtype: str) -> Config:
    return Config.model_validate(
        {
            "run": {"seed": 0, "device": "cpu", "dtype": dtype},
            "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM)}}},
            "data": {"train": "unused.jsonl"},
            "train": {"freeze": FREEZE},
        }
    )


def _measured(cfg: Config) -> tuple[int, int, int]:
    """(frozen parameter bytes, gradient bytes, AdamW state bytes) after one real AdamW step."""
    model, _ = build_omni_model(cfg, Registry.from_plugins([], builtins=True))
    apply_freeze(model, cfg.train.freeze)
    opt = build_optimizer(model, cfg)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.ones_like(p)
    opt.step()
    params = list(model.parameters())
    frozen = sum(p.numel() * p.element_size() for p in params if not p.requires_grad)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    states = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq"))
    assert all(p not in opt.state for p in params if not p.requires_grad)
    return frozen, grads, states


@pytest.mark.parametrize("dtype, bytes_per_element", [("float32", 4), ("bfloat16", 2)])
def test_plan_memory_equals_a_real_step(dtype, bytes_per_element):
    cfg = _cfg(dtype)
    frozen, grads, states = _measured(cfg)
    plan = make_plan(cfg, 1)
    trainable = plan.trainable_params
    assert 0 < trainable < plan.params
    assert (plan.frozen_param_bytes_per_rank, plan.grad_bytes_per_rank, plan.optimizer_bytes_per_rank) == (frozen, grads, states)
    assert grads == bytes_per_element * trainable and states == 2 * bytes_per_element * trainable  # the reference, by hand
    assert frozen == bytes_per_element * (plan.params - trainable)
