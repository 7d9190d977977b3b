"""The training recipe, readable top to bottom.

config -> components from the registry -> model -> data (read, tokenise, pack) -> parallel strategy
-> AdamW + warm-up/cosine LR -> steps (forward, loss over the global target count, backward, clip,
step) -> metrics -> checkpoints -> export.

Loss normalisation: each micro-batch returns the *sum* of its target losses. Every rank adds up the
target counts of its micro-batches, one all-reduce gives the global count ``N`` of the step, and
each micro-batch backpropagates ``loss_sum * dp / N`` (FSDP2 averages gradients over ``dp`` ranks).
With sequence parallelism several ranks share one micro-batch (the strategy's ``data_split``), each
returning the loss sum of its part of the sequence; counts from the data are divided by that
replication so ``N`` stays the global count.
So gradient accumulation and more ranks give the gradients of one big batch, and a micro-batch
without targets contributes exactly zero.

Each metrics row (``metrics.jsonl``) also holds the step's throughput: ``tokens_per_s``,
``step_time_s``, ``tflops`` (achieved model TFLOP/s per device), ``mfu`` (None where the device's
peak is unknown), ``padding_waste`` and ``peak_mem_mib`` (rank 0); see :mod:`omnicore.train.metrics`
for the FLOP count and its source.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from omnicore.config import Config
from omnicore.data.chat import ChatProcessor, Encoded
from omnicore.data.jsonl import SampleError, read_jsonl
from omnicore.data.packing import PackedStream, collate
from omnicore.parallel.state import ParallelState, init_parallel_state
from omnicore.parallel.parallelize import build_strategies, parallelize
from omnicore.registry import Registry, registry_for
from omnicore.train.metrics import flops_model, padding_waste, peak_memory_mib, peak_tflops


def warmup_cosine(warmup: int, total: int, min_ratio: float):
    """LR multiplier: linear from 0 to 1 over ``warmup`` steps, then cosine down to ``min_ratio``
    at ``total`` (Loshchilov & Hutter 2017, SGDR, without restarts)."""

    def fn(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


def load_samples(path: Path, processor: ChatProcessor, on_error: str, max_samples: int | None = None, *, prompt_only: bool = False) -> tuple[list[Encoded], list[str]]:
    """Read and encode a JSONL file. With ``on_error="skip"`` bad samples are dropped and their
    messages returned; otherwise the first :class:`SampleError` propagates."""
    errors: list[str] = []
    samples = read_jsonl(path, on_error=on_error, errors=errors)
    if max_samples is not None:
        samples = samples[:max_samples]
    encoded = []
    for s in samples:
        try:
            encoded.append(processor.encode(s, prompt_only=prompt_only))
        except SampleError as exc:
            if on_error != "skip":
                raise
            errors.append(str(exc))
    return encoded, errors


def build_optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019); weight decay only on matrices (>= 2-D), as in GPT-2/nanoGPT."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.train.lr, betas=cfg.train.betas, foreach=False)


def clip_grad_norm_(parameters: Any, max_norm: float) -> torch.Tensor:
    """Clip the gradients of ``parameters`` in place to a global L2 norm of ``max_norm``; returns the
    norm before clipping (a plain scalar tensor, the same on every rank).

    Gradients may be DTensors on *different* meshes: with expert parallelism the experts live on
    ``(dp_shard_sp, ep)`` and the dense weights on ``fsdp``, and
    ``torch.nn.utils.clip_grad_norm_`` refuses to stack their norms. So the norm is taken per mesh
    (each DTensor norm made whole with ``full_tensor()``), combined as ``sqrt(sum of squares)``, and
    each group is scaled by the same coefficient (torchtitan clips EP models the same way).
    """
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    total_sq = torch.zeros((), dtype=torch.float32)
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        total_sq = total_sq + norm.float().cpu() ** 2
    total = total_sq.sqrt()
    for group in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total.to(group[0].grad.device))
    return total


def summarize(history: list[dict[str, Any]]) -> str:
    """One line of throughput figures over a run's metrics rows (medians, skipping the first step,
    which pays for warm-up and compilation when there are others)."""
    import statistics

    rows = history[1:] or history
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    parts = [f"{med('tokens_per_s'):.0f} tokens/s", f"{med('step_time_s') * 1e3:.1f} ms/step", f"{med('tflops'):.3g} TFLOP/s per device"]
    if all(r["mfu"] is not None for r in rows):
        parts.append(f"MFU {100 * med('mfu'):.1f}%")
    parts.append(f"padding waste {100 * statistics.mean(r['padding_waste'] for r in rows):.1f}%")
    parts.append(f"peak memory {max(r['peak_mem_mib'] for r in rows):.0f} MiB")
    return "throughput (median over steps 2..): " + ", ".join(parts)


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_device(v, device) for v in obj]
    return obj


def train(cfg: Config, *, resume: bool = False, registry: Registry | None = None, state: ParallelState | None = None) -> list[dict[str, Any]]:
    """Run training as configured; returns the per-step metrics (on every rank).

    Raises:
        SampleError: a bad training sample (``FILE:LINE: ...``) when ``data.on_error`` is ``raise``.
        RegistryError: a component or strategy cannot be resolved.
        CheckpointError: ``resume`` with no usable checkpoint, or a fresh run into an output folder
            that already holds one.
    """
    from omnicore.checkpoint.dcp import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
    from omnicore.checkpoint.export import export_model
    from omnicore.model.build import build_omni_model

    registry = registry or registry_for(cfg)
    state = state or init_parallel_state(cfg.run.device, cfg.parallel.backend, cfg.parallel)
    out_dir = Path(cfg.run.output_dir)
    log = print if state.is_main else (lambda *a, **k: None)
    ckpt_root = out_dir / "checkpoints"
    if not resume and (ckpt_root / "latest").is_file():
        raise CheckpointError(
            f"{ckpt_root} already holds a run (latest: {(ckpt_root / 'latest').read_text().strip()}); "
            "continue it with --resume, or pick another --run.output_dir"
        )

    # ---- model and data ------------------------------------------------------------------------
    model, tokenizer = build_omni_model(cfg, registry)
    processor = ChatProcessor(tokenizer, dict(model.encoders), dict(model.decoders), cfg.data.system_prompt)
    samples, errors = load_samples(cfg.resolve_path(cfg.data.train), processor, cfg.data.on_error, cfg.data.max_samples)
    if errors:
        log(f"skipped {len(errors)} bad samples (data.on_error=skip); first: {errors[0]}")
    stream = PackedStream(samples, cfg.data.max_tokens, cfg.run.seed, cfg.data.shuffle, cfg.data.packing, cfg.data.packing_window)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters; data: {len(samples)} samples from {cfg.data.train}")

    # ---- parallelism: the strategy wraps the model from outside --------------------------------
    # (parallel.strategies, or parallel.strategy with auto resolved; applied in phase order, see
    # omnicore.parallel.parallelize)
    flops = flops_model(model.lm)  # counted before sharding turns parameters into shards
    model = model.to(state.device)
    state.mixed_precision = cfg.train.mixed_precision
    strategies = build_strategies(cfg.parallel, registry, state.distributed)
    model = parallelize(model, state, strategies)
    strategy = next((s for _, s in strategies if hasattr(s, "data_split")), None)
    # Which micro-batches this rank reads: a strategy that splits each micro-batch over several ranks
    # (sequence parallelism) answers data_split(state) -> (index, count) of this rank's data group;
    # by default every rank reads its own. `replicas` ranks see each micro-batch.
    data_split = getattr(strategy, "data_split", None)
    data_rank, data_size = data_split(state) if data_split is not None else (state.dp_rank, state.dp_size)
    replicas = state.world_size // data_size
    names = [n for n, _ in strategies if n.split(":")[-1] != "none"] or ["none"]
    log(f"parallel: {state.layout.describe()}; strategies: {', '.join(names)}; data split into {data_size} shard(s), one per data-parallel group")
    kernels = {op: c.name for op, c in cfg.model.kernel_choices().items()}
    kernels.setdefault("cross_entropy", "torch_cross_entropy")
    precision = "bf16 mixed (fp32 parameters)" if cfg.train.mixed_precision == "bf16" else cfg.run.dtype
    log(f"kernels: {', '.join(f'{op}={k}' for op, k in kernels.items())} (other ops: the foundation's own code); precision: {precision}")

    optimizer = build_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.train.warmup_steps, cfg.train.max_steps, cfg.train.min_lr_ratio))
    start = 0
    if resume:
        meta = load_checkpoint(latest_checkpoint(ckpt_root), model, optimizer, scheduler, state)
        start = meta["step"]
        log(f"resumed from step {start} ({ckpt_root / ('step-%08d' % start)})")

    metrics_path = out_dir / "metrics.jsonl"
    if state.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            metrics_path.unlink(missing_ok=True)  # a fresh run starts a fresh metrics file
    history: list[dict[str, Any]] = []
    bar = None
    if state.is_main and cfg.train.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.train.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True)

    # ---- the loop ------------------------------------------------------------------------------
    model.train()
    # bf16 mixed precision: parameters, optimizer state and gradient reductions stay fp32; matmuls run
    # in bf16 under autocast (FSDP2 also gathers bf16 parameters); the loss is computed from fp32
    # logits and accumulated in fp64 below.
    bf16 = cfg.train.mixed_precision == "bf16"
    autocast = (lambda: torch.autocast(state.device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    compute_dtype = "bf16" if bf16 or cfg.run.dtype == "bfloat16" else "fp32"
    peak = peak_tflops(state.device, compute_dtype, cfg.train.peak_tflops)
    # dp: the ranks gradients are averaged over (FSDP2's group, or a strategy's own all-reduce)
    accum, dp = cfg.train.grad_accum, state.world_size
    for step in range(start, cfg.train.max_steps):
        t0 = time.perf_counter()
        batches = list(stream.iter_step(step, accum, data_rank, data_size))
        micro = [collate(mb, processor.encoders, processor.decoders) for mb in batches]
        # one all-reduce gives the step's global target count (the loss denominator)
        n_global = state.all_reduce_sum(sum(mb.n_targets for mb in micro)) / replicas
        scale = dp / max(n_global, 1.0)
        loss_sum = torch.zeros((), dtype=torch.float64)
        part_sums: dict[str, float] = {}  # per-part loss sums, for the metrics only
        part_counts: dict[str, int] = {}
        tokens = 0
        step_flops = 0.0
        for mb, samples in zip(micro, batches):
            step_flops += flops.step_flops([len(x.input_ids) for x in samples]) / replicas
            with autocast():
                out = model(**_to_device(vars(mb), state.device))
            (out.loss_sum * scale).backward()
            loss_sum += out.loss_sum.detach().double().cpu()
            n_text = out.n_targets - sum(out.decoder_targets.values())  # this rank's part of the micro-batch
            parts = {"text": (float(out.text_loss_sum), n_text)}
            parts.update({f"decoder.{m}": (float(v), out.decoder_targets[m]) for m, v in out.decoder_loss_sums.items()})
            for k, (v, c) in parts.items():
                part_sums[k] = part_sums.get(k, 0.0) + v
                part_counts[k] = part_counts.get(k, 0) + c
            tokens += mb.num_tokens / replicas
        grad_norm = clip_grad_norm_(model.parameters(), cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf"))
        lr = scheduler.get_last_lr()[0]  # the rate this step uses
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        # one all-reduce for every figure of the step's metrics
        keys = sorted({"text", *(f"decoder.{m}" for m in processor.decoders)})
        sums = state.all_reduce_sums(
            [float(loss_sum), tokens, step_flops] + [part_sums.get(k, 0.0) for k in keys] + [part_counts.get(k, 0) for k in keys]
        )
        loss, tokens_global, flops_global = sums[0] / max(n_global, 1.0), sums[1], sums[2]
        part_loss = {k: sums[3 + i] / max(sums[3 + len(keys) + i], 1.0) for i, k in enumerate(keys)}
        dt = time.perf_counter() - t0
        tflops = flops_global / dt / state.world_size / 1e12  # achieved, per device
        row = {
            "step": step + 1,
            "loss": loss,
            "lr": lr,
            "grad_norm": float(grad_norm),
            "targets": int(round(n_global)),
            "tokens": int(round(tokens_global)),
            "tokens_per_s": tokens_global / dt,
            "step_time_s": dt,
            "tflops": tflops,
            "mfu": tflops / peak if peak else None,
            "padding_waste": padding_waste(int(round(tokens_global)), accum * data_size, cfg.data.max_tokens),
            "peak_mem_mib": peak_memory_mib(state.device),
            "epoch": stream.epoch_of((step + 1) * accum * data_size),
        }
        row.update({f"loss/{k}": v for k, v in part_loss.items()})
        history.append(row)
        if state.is_main:
            if (step + 1) % cfg.train.log_every == 0 or step + 1 == cfg.train.max_steps:
                with metrics_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
            if bar is not None:
                post = {"loss": f"{loss:.4f}", "tok_s": f"{row['tokens_per_s']:.0f}"}
                if row["mfu"] is not None:
                    post["mfu"] = f"{100 * row['mfu']:.1f}%"
                bar.set_postfix(post)
                bar.update(1)
        last = step + 1 == cfg.train.max_steps
        stop = cfg.train.stop_after is not None and step + 1 >= cfg.train.stop_after
        if last or stop or (cfg.train.save_every and (step + 1) % cfg.train.save_every == 0):
            save_checkpoint(ckpt_root, step + 1, model, optimizer, scheduler, {"micro_batches": (step + 1) * accum * data_size, "seed": cfg.run.seed}, state, cfg.train.keep_checkpoints)
        if stop and not last:
            log(f"stopped after step {step + 1} (train.stop_after); continue with --resume")
            break
    if bar is not None:
        bar.close()
    if history:
        log(summarize(history))
    finished = bool(history) and history[-1]["step"] == cfg.train.max_steps
    if cfg.train.export and finished:
        path = export_model(model, tokenizer, cfg, out_dir / "export", state)
        log(f"exported to {path}")
    return history
