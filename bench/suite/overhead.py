"""omnicore's training step vs the same step written by hand in PyTorch + transformers.

omnicore side: :func:`omnicore.train.loop.train` in-process on a text-only config (built-in
``hf_causal_lm`` Qwen2 foundation, byte tokenizer, one process, no strategy, ``progress`` and
``export`` off, output in a temporary folder); the step time is the history's ``step_time_s``
(seconds, from before collation to after the optimizer step and the step's metrics).

Hand-written side (:func:`handwritten_train`): the same Qwen2 config built directly with
``AutoModelForCausalLM.from_config`` after ``torch.manual_seed(seed)`` (so the same initial
weights), the same packed micro-batches (omnicore's data pipeline decides which encoded samples
form each step's row; the loop concatenates their token ids, pre-shifted labels and restarting
``position_ids`` itself, inside the timed step), the same loss (sum of fp32 cross-entropy over the
labels divided by the step's target count), AdamW with the same groups (decay on >= 2-D tensors),
lr, betas and weight decay, the same gradient clip and the same linear warm-up + cosine LR
multiplier. Its step time spans the same work: collation, forward, backward, clip, optimizer and
scheduler step, and reading the loss.

The two runs are interleaved ``A, B, B, A, A, B, ...`` (each a fresh model; the side that runs first alternates) and the first ``warmup`` steps
of every run are dropped. Each pair gives a ratio, median omnicore step time over median
hand-written step time of that pair; the headline ``ratio`` is the median of the pair ratios (a
burst of load from another process spoils one pair, not the figure). The medians of all kept steps
of each side and their ratio are reported too. Both see identical data and weights, so their losses agree step by step; the maximum
difference is recorded as a check that the comparison is like for like.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

#: the benchmark's foundation (Qwen2, ~1.7 M parameters with the byte vocabulary); sized so that a
#: step on a 2048-token row takes ~100-300 ms on 2 CPU cores. MLP width 4x hidden, as in most
#: transformers; at this small width attention over a 2048-token row is still a large share of the
#: FLOPs (see bench/README.md, caveats)
LM = {
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}


def config_dict(
    train: str,
    output_dir: str,
    *,
    max_tokens: int,
    max_steps: int,
    lm: dict | None = None,
    seed: int = 0,
    lr: float = 1e-3,
    warmup_steps: int = 2,
    attention: str = "sdpa",
) -> dict[str, Any]:
    """The omnicore run config (as a dict) used by every figure: text only, one process;
    ``attention`` is the registry's attention kernel (``model.kernels.attention``)."""
    return {
        "run": {"output_dir": output_dir, "seed": seed, "device": "cpu"},
        "model": {
            "foundation": {"name": "hf_causal_lm", "options": {"config": dict(lm or LM), "tokenizer": "byte"}},
            "kernels": {"attention": attention},
        },
        "data": {"train": train, "max_tokens": max_tokens, "shuffle": True},
        "train": {
            "max_steps": max_steps,
            "lr": lr,
            "warmup_steps": warmup_steps,
            "min_lr_ratio": 0.1,
            "weight_decay": 0.01,
            "betas": [0.9, 0.95],
            "grad_clip": 1.0,
            "grad_accum": 1,
            "progress": False,
            "export": False,
        },
    }


def encode(cfg_dict: dict[str, Any]) -> tuple[list[Any], Any]:
    """omnicore's encoded samples of ``data.train`` and the tokenizer (as ``train`` builds them)."""
    from omnicore.config import Config
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.jsonl import iter_jsonl
    from omnicore.model.build import build_omni_model

    cfg = Config.model_validate(cfg_dict)
    _, tokenizer = build_omni_model(cfg)
    chat = ChatProcessor(tokenizer, {}, {})
    samples = [chat.encode(s) for s in iter_jsonl(Path(cfg.data.train))]
    return samples, tokenizer


def step_rows(cfg_dict: dict[str, Any], tokenizer: Any, steps: int) -> list[Any]:
    """The collated micro-batch of each step, exactly as omnicore's loop takes them: its data
    pipeline (:class:`omnicore.data.pipeline.DataPipeline`) with ``grad_accum = 1``, one process."""
    from omnicore.config import Config
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.pipeline import DataPipeline
    from omnicore.data.sources import open_source

    cfg = Config.model_validate(cfg_dict)
    chat = ChatProcessor(tokenizer, {}, {}, max_tokens=cfg.data.max_tokens)
    sources = [open_source(s, Path.cwd()) for s in cfg.data.source_list()]
    pipe = DataPipeline(sources, chat, cfg.data, cfg.run.seed, data_rank=0, data_size=1, grad_accum=1)
    return [pipe.step()[0] for _ in range(steps)]


def run_omnicore(cfg_dict: dict[str, Any]) -> list[dict[str, Any]]:
    """``omnicore.train.loop.train`` in this process, in a fresh temporary output folder; returns its
    history rows (``loss``, ``tokens``, ``tokens_per_s``, ``step_time_s`` in seconds, ...)."""
    from omnicore.config import Config
    from omnicore.train.loop import train

    with tempfile.TemporaryDirectory(prefix="omnicore-bench-") as tmp:
        d = dict(cfg_dict, run=dict(cfg_dict["run"], output_dir=str(Path(tmp) / "run")))
        with contextlib.redirect_stdout(io.StringIO()):
            return train(Config.model_validate(d))


def build_lm(lm: dict[str, Any], vocab_size: int, seed: int) -> Any:
    """A randomly initialised transformers causal LM from ``lm`` (with ``model_type``), seeded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(lm)
    config = AutoConfig.for_model(kw.pop("model_type"), vocab_size=vocab_size, **kw)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def adamw(model: Any, train: dict[str, Any], total_steps: int) -> tuple[Any, Any]:
    """AdamW (decay on >= 2-D tensors only) and the linear warm-up + cosine LambdaLR, from a
    ``train`` config section."""
    import torch

    from omnicore.train.optim import warmup_cosine  # the schedule formula only (a pure function)

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": train["weight_decay"]},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=train["lr"], betas=tuple(train["betas"]))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(train["warmup_steps"], total_steps, train["min_lr_ratio"]))
    return opt, sched


def handwritten_train(cfg_dict: dict[str, Any], vocab_size: int, rows: list[Any]) -> list[dict[str, Any]]:
    """The hand-written loop over ``rows`` (one collated packed row per step, a
    :class:`~omnicore.data.packing.MicroBatch`); returns per-step ``loss``,
    ``tokens`` and ``step_time_s`` (seconds)."""
    import torch
    import torch.nn.functional as F

    tr = cfg_dict["train"]
    model = build_lm(cfg_dict["model"]["foundation"]["options"]["config"], vocab_size, cfg_dict["run"]["seed"])
    model.train()
    opt, sched = adamw(model, tr, tr["max_steps"])
    history = []
    for step, row in enumerate(rows):
        t0 = time.perf_counter()
        input_ids, target, position_ids = row.input_ids, row.labels, row.position_ids
        n = int((target != -100).sum())
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits.float()
        loss_sum = F.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1), ignore_index=-100, reduction="sum")
        (loss_sum / max(n, 1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr["grad_clip"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss = loss_sum.item() / max(n, 1)
        dt = time.perf_counter() - t0
        history.append({"step": step + 1, "loss": loss, "tokens": int(input_ids.shape[1]), "step_time_s": dt})
    return history


def measure(
    train_path: str, *, max_tokens: int, steps: int, warmup: int, repeats: int, seed: int = 0, lm: dict | None = None
) -> dict[str, Any]:
    """Interleaved repeats of both loops (see the module docstring). Times in milliseconds."""
    cfg = config_dict(train_path, "unused", max_tokens=max_tokens, max_steps=steps, lm=lm, seed=seed)
    _, tokenizer = encode(cfg)
    rows = step_rows(cfg, tokenizer, steps)
    omni_t: list[float] = []
    hand_t: list[float] = []
    pair_ratios = []
    loss_diff = 0.0
    for rep in range(repeats):
        # alternate which side runs first, so neither always inherits the other's warm (or hot) machine
        if rep % 2 == 0:
            a = run_omnicore(cfg)
            b = handwritten_train(cfg, len(tokenizer), rows)
        else:
            b = handwritten_train(cfg, len(tokenizer), rows)
            a = run_omnicore(cfg)
        assert [r["tokens"] for r in a] == [r["tokens"] for r in b], "the two loops saw different rows"
        loss_diff = max(loss_diff, max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b)))
        ta = [r["step_time_s"] for r in a[warmup:]]
        tb = [r["step_time_s"] for r in b[warmup:]]
        omni_t += ta
        hand_t += tb
        pair_ratios.append(statistics.median(ta) / statistics.median(tb))
    mo, mh = statistics.median(omni_t), statistics.median(hand_t)
    tokens = [r["tokens"] for r in a]
    return {
        "ratio": statistics.median(pair_ratios),
        "ratio_of_pooled_medians": mo / mh,
        "omnicore_median_ms": mo * 1e3,
        "handwritten_median_ms": mh * 1e3,
        "ratio_per_repeat": pair_ratios,
        "omnicore_step_ms": [t * 1e3 for t in omni_t],
        "handwritten_step_ms": [t * 1e3 for t in hand_t],
        "max_loss_diff": loss_diff,
        "tokens_per_row_mean": statistics.fmean(tokens),
        "steps": steps,
        "warmup_steps_dropped": warmup,
        "repeats": repeats,
        "goal_ratio_max": 1.03,
    }
