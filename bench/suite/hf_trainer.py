"""omnicore's packed training vs the Hugging Face ``Trainer`` on the same model and samples.

All three runs train the same randomly initialised Qwen2 (same config and seed) for one epoch over
the same encoded samples (omnicore's ChatProcessor output: the same token ids, and the same
trained positions, converted to transformers' unshifted ``labels`` for the Trainer), with the same
AdamW groups and hyperparameters, gradient clip and warm-up + cosine schedule, and a loss
normalised by the step's number of target tokens (the Trainer's ``num_items_in_batch``):

* ``omnicore``: :func:`omnicore.train.loop.train`, samples packed first-fit into rows of
  ``max_tokens`` (no padding); one epoch is ``rows`` steps. Attention kernel: omnicore's built-in
  ``sdpa_varlen`` where this omnicore has it (SDPA per packed sample, no ``[T, T]`` mask: what a
  CPU user of omnicore would pick for packed rows), else ``sdpa``.
* ``omnicore_sdpa``: the same with ``model.kernels.attention: sdpa`` (transformers' SDPA with the dense
  block-diagonal mask of the packed row: the attention path the Trainer runs below), reported so
  that the gain of packing alone and of the varlen kernel can be told apart.
* ``trainer_padded``: ``Trainer`` with transformers' padding collator ``DataCollatorForSeq2Seq``
  (pads ``input_ids`` to the longest sample of the batch and ``labels`` with -100, adds the
  attention mask). (``DataCollatorWithPadding``, the Trainer's default when a tokenizer is given,
  cannot pad ``labels``.) The batch size is chosen by :func:`suite.waste.choose_batch_size` so that
  the average padded batch is about ``max_tokens`` positions.
* ``trainer_flattening``: ``Trainer`` with ``DataCollatorWithFlattening`` (padding-free: the batch's
  samples concatenated into one row with restarting ``position_ids``, as omnicore packs), batch
  size ``round(max_tokens / mean sample length)``, so the average row is about ``max_tokens``.

Logging, saving, evaluation and reporting are off; one process, ``dataloader_num_workers=0``.
Throughput is *real* (non-pad) tokens per second over the steps after the first ``warmup``: for
omnicore the sum of the history's ``tokens`` over the sum of its ``step_time_s``; for the Trainer
the real tokens of each collated batch (recorded by a wrapper around the collator) over the wall
time between the ``on_step_end`` callbacks of the first kept step's predecessor and the last step
(which includes the Trainer's data loading, collation and callbacks; omnicore's step time includes
its collation too). The four runs are interleaved over ``repeats``; each repeat gives the ratios of
omnicore's throughput to each Trainer run's, and the headline ratios are the medians of those
per-repeat ratios (robust to a burst of load that spoils one repeat). The median throughput of
each variant over the repeats is reported alongside.
"""

from __future__ import annotations

import contextlib
import io
import math
import statistics
import tempfile
import time
from typing import Any

from . import overhead, waste


def hf_features(samples: list[Any]) -> list[dict[str, list[int]]]:
    """omnicore's encoded samples as transformers features: ``labels`` unshifted (``labels[j]`` is
    token ``j`` when token ``j`` is trained), since transformers' causal-LM loss shifts them."""
    return [{"input_ids": list(s.input_ids), "labels": [-100] + list(s.labels[:-1])} for s in samples]


class _Counting:
    """Wraps a collator; records real (non-pad) and computed positions of every batch."""

    def __init__(self, inner: Any):
        self.inner, self.real, self.computed = inner, [], []

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.inner(features)
        self.real.append(sum(len(f["input_ids"]) for f in features))
        self.computed.append(int(batch["input_ids"].numel()))
        return batch


def run_trainer(
    cfg_dict: dict[str, Any],
    vocab_size: int,
    features: list[dict[str, list[int]]],
    collator: Any,
    batch_size: int,
    warmup: int,
    pad_id: int,
) -> dict[str, Any]:
    """One epoch of ``transformers.Trainer`` over ``features``; returns real tokens/s (after
    ``warmup`` steps), steps, the loss of the first step and the padding waste it computed."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Timer(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []
            self.losses: list[float] = []

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

    tr = cfg_dict["train"]
    seed = cfg_dict["run"]["seed"]
    model = overhead.build_lm(cfg_dict["model"]["foundation"]["options"]["config"], vocab_size, seed)
    steps = math.ceil(len(features) / batch_size)
    opt, sched = overhead.adamw(model, tr, steps)
    counting = _Counting(collator)
    timer = Timer()
    with tempfile.TemporaryDirectory(prefix="omnicore-bench-hf-") as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=batch_size,
            num_train_epochs=1,
            gradient_accumulation_steps=1,
            max_grad_norm=tr["grad_clip"],
            learning_rate=tr["lr"],
            weight_decay=tr["weight_decay"],
            adam_beta1=tr["betas"][0],
            adam_beta2=tr["betas"][1],
            seed=seed,
            logging_strategy="no",
            save_strategy="no",
            eval_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            dataloader_pin_memory=False,
            use_cpu=True,
            remove_unused_columns=False,
        )
        trainer = Trainer(
            model=model, args=args, train_dataset=features, data_collator=counting, optimizers=(opt, sched), callbacks=[timer]
        )
        with contextlib.redirect_stdout(io.StringIO()):
            out = trainer.train()
    n = len(timer.ends)
    assert n == steps and len(counting.real) >= n, (n, steps, len(counting.real))
    kept_tokens = sum(counting.real[warmup:n])
    span = timer.ends[n - 1] - timer.ends[warmup - 1] if warmup > 0 else timer.ends[n - 1] - timer.ends[0]
    if warmup == 0:
        kept_tokens = sum(counting.real[1:n])
    real, computed = sum(counting.real[:n]), sum(counting.computed[:n])
    return {
        "tokens_per_s": kept_tokens / span,
        "steps": steps,
        "batch_size": batch_size,
        "real_tokens": real,
        "computed_positions": computed,
        "padding_waste": 1 - real / computed,
        "train_loss": float(out.training_loss),
    }


def omnicore_epoch(cfg_dict: dict[str, Any], warmup: int) -> dict[str, Any]:
    """One epoch of omnicore's packed training; real tokens/s after ``warmup`` steps."""
    hist = overhead.run_omnicore(cfg_dict)
    kept = hist[warmup:]
    return {
        "tokens_per_s": sum(r["tokens"] for r in kept) / sum(r["step_time_s"] for r in kept),
        "steps": len(hist),
        "real_tokens": sum(r["tokens"] for r in hist),
        "train_loss": statistics.fmean(r["loss"] for r in hist),
    }


def varlen_available() -> bool:
    """Whether this omnicore has the built-in ``sdpa_varlen`` attention kernel."""
    import importlib.util

    return importlib.util.find_spec("omnicore.kernels.attention_varlen") is not None


def measure(train_path: str, *, max_tokens: int, repeats: int, warmup: int, seed: int = 0, lm: dict | None = None) -> dict[str, Any]:
    """The four runs, interleaved ``repeats`` times; medians of real tokens/s and the ratios."""
    from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening

    probe = overhead.config_dict(train_path, "unused", max_tokens=max_tokens, max_steps=1, lm=lm, seed=seed)
    samples, tokenizer = overhead.encode(probe)
    lengths = [len(s) for s in samples]
    rows = waste.packing(lengths, max_tokens, seed)["rows"]  # one epoch's rows, as training's packer makes them
    attention = "sdpa_varlen" if varlen_available() else "sdpa"
    cfg = overhead.config_dict(train_path, "unused", max_tokens=max_tokens, max_steps=rows, lm=lm, seed=seed, attention=attention)
    cfg_sdpa = overhead.config_dict(train_path, "unused", max_tokens=max_tokens, max_steps=rows, lm=lm, seed=seed, attention="sdpa")
    features = hf_features(samples)
    bs_pad = waste.choose_batch_size(lengths, max_tokens, seed)
    bs_flat = max(1, round(max_tokens / statistics.fmean(lengths)))
    pad = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)
    flat = DataCollatorWithFlattening()
    runs: dict[str, list[dict[str, Any]]] = {"omnicore": [], "omnicore_sdpa": [], "trainer_padded": [], "trainer_flattening": []}
    for _ in range(repeats):
        runs["omnicore"].append(omnicore_epoch(cfg, warmup))
        runs["omnicore_sdpa"].append(omnicore_epoch(cfg_sdpa, warmup))
        runs["trainer_padded"].append(run_trainer(cfg, len(tokenizer), features, pad, bs_pad, warmup, tokenizer.pad_token_id))
        runs["trainer_flattening"].append(run_trainer(cfg, len(tokenizer), features, flat, bs_flat, warmup, tokenizer.pad_token_id))
    med = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(runs[a], runs[b]))

    return {
        "samples": len(samples),
        "max_tokens": max_tokens,
        "real_tokens": sum(lengths),
        "tokens_per_s": med,
        "ratio_vs_padded": ratio("omnicore", "trainer_padded"),
        "ratio_vs_flattening": ratio("omnicore", "trainer_flattening"),
        "ratio_sdpa_vs_padded": ratio("omnicore_sdpa", "trainer_padded"),
        "ratio_sdpa_vs_flattening": ratio("omnicore_sdpa", "trainer_flattening"),
        "ratio_varlen_vs_sdpa": ratio("omnicore", "omnicore_sdpa"),
        "omnicore_attention": attention,
        "goal_ratio_vs_padded_min": 1.5,
        "runs": runs,
        "warmup_steps_dropped": warmup,
        "repeats": repeats,
    }
