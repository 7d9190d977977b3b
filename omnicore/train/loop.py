"""The training recipe, readable top to bottom.

config -> components from the registry -> model -> data (read, tokenise, pack) -> parallel strategy
-> AdamW + warm-up/cosine LR -> steps (forward, loss over the global target count, backward, clip,
step) -> metrics -> checkpoints -> export.

The parts, in the order they run: :func:`setup` builds a :class:`Run` (model, data, strategies,
optimizer and schedule from :mod:`omnicore.train.optim`, outputs); :func:`train_step` is one
optimizer step over the micro-batches of :func:`forward_backward_step` and returns the step's
metrics row; :func:`log_step` writes it; :func:`save` checkpoints; :func:`train` is the loop.

Loss normalisation: each micro-batch returns the *sum* of its target losses. Every rank adds up the
target counts of its micro-batches, one all-reduce gives the global count ``N`` of the step, and
each micro-batch backpropagates ``loss_sum * dp / N`` (FSDP2 averages gradients over ``dp`` ranks).
With sequence parallelism several ranks share one micro-batch (the strategy's ``data_split``), each
returning the loss sum of its part of the sequence; counts from the data are divided by that
replication so ``N`` stays the global count.
So gradient accumulation and more ranks give the gradients of one big batch, and a micro-batch
without targets contributes exactly zero.

Steps without an update (:func:`apply_update`): a step whose loss (summed over ranks) or gradient
norm is NaN or inf stops the run before the optimizer step (``train.on_nonfinite: stop``, the
default, raising :class:`~omnicore.train.optim.NonFiniteError`), or is skipped (``skip``: weights
and AdamW state untouched; after ``train.max_skipped_steps`` such steps in a row the next one stops
the run). A step where no rank has a target (global count 0) is skipped too: AdamW would still
apply weight decay and move its moments with zero gradients. A skipped step still counts as a step:
it consumes its data and advances the LR schedule, so step numbers, data positions and learning rates
stay those of a run without skips. Its metrics row says ``skipped: true`` and ``skip_reason``
(``nonfinite`` or ``no_targets``); ``skipped_steps`` counts the run's skipped steps (kept across
``--resume``).

Each metrics row (``metrics.jsonl``) also holds the step's throughput: ``tokens_per_s``,
``step_time_s``, ``tflops`` (achieved model TFLOP/s per device, every part), ``mfu`` (None where the
device's peak is unknown), ``flops_share/<part>``, ``padding_waste`` and ``peak_mem_mib`` (rank 0),
and its balance across ranks: ``flops_spread`` and ``reduce_wait_s`` (mean, max, per rank); see
:mod:`omnicore.train.metrics` for what each means and :mod:`omnicore.model.flops` for the count.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnicore.checkpoint.changes import continue_command
from omnicore.config import Config, ConfigError
from omnicore.data.chat import ChatProcessor
from omnicore.data.jsonl import SampleError
from omnicore.data.loader import DataWorkerError
from omnicore.data.packing import to_device
from omnicore.data.pipeline import DataPipeline
from omnicore.data.reading import DataExhausted
from omnicore.data.seeds import rank_seed
from omnicore.data.state import DataResumeError, merge_states
from omnicore.eval.samples import Sampler
from omnicore.eval.validate import Validator
from omnicore.logs import Phase, echo_of_other_rank
from omnicore.model.build import open_data
from omnicore.model.flops import ModelFlops, model_flops
from omnicore.model.trainable import apply_freeze
from omnicore.parallel.parallelize import build_strategies, data_split, parallelize
from omnicore.parallel.state import ParallelState, init_parallel_state
from omnicore.registry import Registry, registry_for
from omnicore.train.loggers import LoggerStopped, check_loggers, start_loggers
from omnicore.train.metrics import balance_figures, padding_waste, peak_memory_mib, peak_tflops
from omnicore.train.optim import (
    NonFiniteError,
    build_optimizer,
    build_schedule,
    clip_grad_norm_,
    describe_nonfinite,
    nonfinite_message,
    nonfinite_save_message,
    nonfinite_tensors,
    use_implementation,
)
from omnicore.train.run import Run
from omnicore.train.signals import SIGNALS, GracefulStop, Interrupted, signal_flags, signal_from_flags

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# set-up
# ---------------------------------------------------------------------------------------------


def setup(cfg: Config, *, resume: bool | str = False, registry: Registry | None = None, state: ParallelState | None = None) -> Run:
    """Build everything a run needs: model and data, parallelism, optimizer and LR schedule (restored
    with ``resume``: see :func:`train`), output files and progress bar. Raises as :func:`train` does."""
    from omnicore.checkpoint.changes import config_json, load_for_resume
    from omnicore.checkpoint.dcp import CheckpointError

    given = config_json(cfg)  # as the user gave it (model.init_from may re-point components below)
    registry = registry or registry_for(cfg)
    state = state or init_parallel_state(cfg.run.device, cfg.parallel.backend, cfg.parallel)
    out_dir = Path(cfg.run.output_dir)
    log = logger.info  # every rank logs; other ranks' INFO lines are left out by the handler (omnicore.logs)
    ckpt_root = out_dir / "checkpoints"
    # checked before the (slow) build: a fresh run must not mix its checkpoints into an older run's,
    # and a missing held-out file must not wait for the first validation
    if not resume and (ckpt_root / "latest").is_file():
        raise CheckpointError(
            f"{ckpt_root} already holds a run (latest: {(ckpt_root / 'latest').read_text().strip()}); "
            "continue it with --resume, or pick another --run.output_dir"
        )
    check_eval_file(cfg)
    # strategies are built (their options validated) before the model, so a misspelt option fails
    # in seconds rather than after a 7B build; parallel.strategy with auto resolved, in phase order
    strategies = build_strategies(cfg.parallel, registry, state.distributed)

    cfg, init_from, (model, tokenizer, processor, sources, flops) = _model_to_train(cfg, registry, state, resume, log)
    model, (data_rank, data_size, replicas) = _parallelize_model(model, cfg, strategies, state, log)
    flops.model = model  # the wrapped model (strategies wrap in place; the parts' modules stay the same)
    if init_from is not None:  # model.init_from names a checkpoint: its model weights, into the sharded model
        _load_init_from(init_from.folder, model, state)
    pin = cfg.data.pin_memory if cfg.data.pin_memory is not None else state.device.type == "cuda"
    data = DataPipeline(sources, processor, cfg.data, cfg.run.seed, data_rank=data_rank, data_size=data_size,
                        grad_accum=cfg.train.grad_accum, pin_memory=pin, decoder_keys=cfg.train.code_cache_mb > 0)  # fmt: skip
    _check_rows(sources, data.num_shards, cfg)

    torch.manual_seed(rank_seed(cfg.run.seed, state.rank))  # dropout: each rank its own stream (a resume restores it)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_schedule(optimizer, cfg)
    start, skips = 0, (0, 0)
    if resume:
        with Phase(logger, "loading the checkpoint to resume from") as ph:
            folder = _resume_folder(ckpt_root, resume, state, log, verify=cfg.run.verify)
            # settings changed since the checkpoint: refused before anything is read, else listed and applied
            meta, scheduler = load_for_resume(folder, given, cfg, model, optimizer, state, log, build_schedule)
            use_implementation(optimizer)  # fused or looped AdamW as this run's parameters allow, not as the saved run's
            _resume_data(data, meta, folder, state, verify=cfg.run.verify)
            start, skips = meta["step"], (meta.get("skipped_steps", 0), meta.get("nonfinite_in_row", 0))
            ph.detail = f"resumed from step {start} ({folder})"

    metrics_path, bar = _open_outputs(cfg, state, out_dir, resume, start)
    model.train()
    autocast, peak = _precision(cfg, state)
    return Run(
        cfg=cfg, state=state, model=model, tokenizer=tokenizer, processor=processor, data=data, strategies=strategies,
        optimizer=optimizer, scheduler=scheduler, data_rank=data_rank, data_size=data_size, replicas=replicas, autocast=autocast,
        peak_tflops=peak, flops=flops, out_dir=out_dir, ckpt_root=ckpt_root, metrics_path=metrics_path, log=log, registry=registry,
        start=start, bar=bar, skipped_steps=skips[0], nonfinite_in_row=skips[1], given_config=given,
    )  # fmt: skip


def _model_to_train(
    cfg: Config, registry: Registry, state: ParallelState, resume: bool | str, log: Callable[..., None]
) -> tuple[Config, Any, tuple[Any, Any, ChatProcessor, list[Any], ModelFlops]]:
    """The model as it will train, before the parallel strategies: ``model.init_from`` resolved (an
    export re-points the config's components at its folders, so the returned config is the one the
    run uses; a checkpoint is returned, to be loaded after sharding, else None), the model and data
    built (a foundation checkpoint still on meta), LoRA adapters added, ``train.freeze`` applied.
    Returns ``(cfg, init_from, (model, tokenizer, processor, sources, FLOP model))``, the FLOPs
    counted before sharding."""
    from omnicore.checkpoint.export import check_lora_export
    from omnicore.checkpoint.init_from import start_from
    from omnicore.model.lora import apply_lora

    cfg, init_from = start_from(cfg, resume, state, log)
    model, tokenizer, processor, sources = _build_model_and_data(cfg, registry)
    flops = model_flops(model)  # the foundation counted before sharding turns parameters into shards
    apply_lora(model, cfg.model.lora, seed=cfg.run.seed)  # model.lora: adapters before freeze and the strategies
    check_lora_export(model, cfg, registry)  # a merged export that could not be exact is refused now, not after training
    log(apply_freeze(model, cfg.train.freeze).describe())  # train.freeze, after LoRA, before the strategies
    if cfg.train.code_cache_mb > 0:  # after the freeze: a decoder's fixed_codes may depend on it
        from omnicore.model.code_cache import CodeCache

        model.code_cache = CodeCache(int(cfg.train.code_cache_mb * 2**20))
    return cfg, init_from, (model, tokenizer, processor, sources, flops)


def _resume_folder(ckpt_root: Path, resume: bool | str, state: ParallelState, log: Callable[..., None], *, verify: bool = True) -> Path:
    """The checkpoint to resume from, its files verified against its manifest (collective). A path
    (``--resume PATH``: a folder, or a name such as ``step-00000004``) must verify, else the error
    names the bad file and the previous good checkpoint; plain ``--resume`` takes the newest
    checkpoint that verifies and says so, as a warning, when it had to skip a corrupt one or
    ``latest`` was bad (missing, empty, naming a folder an interrupted save left missing).
    ``verify`` False (``run.verify: false``): complete checkpoints are taken unchecked, with a warning."""
    from omnicore.checkpoint.resume import find_good_checkpoint, resolve_resume

    if isinstance(resume, str):
        folder = resolve_resume(ckpt_root, resume, state, verify=verify)
    else:
        folder, message = find_good_checkpoint(ckpt_root, state, verify=verify)
        if message == f"resuming from {folder}":
            log(message)
        elif state.is_main:
            logger.warning(message)
    if not verify and state.is_main:
        logger.warning("run.verify is false: %s is loaded without checking its checksums", folder)
    return folder


@contextlib.contextmanager
def run_lock(cfg: Config, state: ParallelState, log: Callable[..., None]) -> Iterator[None]:
    """One run per output folder: rank 0 holds ``run.lock`` (:class:`omnicore.checkpoint.lock.RunLock`)
    while the run lasts; every rank learns whether it got it (one all-reduce), so no rank waits for
    a run that was refused.

    Raises:
        RunLockError: on rank 0, another live run holds the folder (its PID and host named);
            CheckpointError on the other ranks.
    """
    from omnicore.checkpoint.errors import CheckpointError
    from omnicore.checkpoint.lock import RunLock, RunLockError

    lock, error = None, None
    if state.is_main:
        try:
            lock = RunLock(cfg.run.output_dir).__enter__()
        except RunLockError as exc:
            error = exc
    refused = state.all_reduce_sum(1.0 if error is not None else 0.0)
    if error is not None:
        raise error
    if refused:
        raise CheckpointError(f"{cfg.run.output_dir} is locked by another run (see rank 0's error)")
    if lock is not None and lock.message:
        log(lock.message)
    try:
        yield
    finally:
        if lock is not None:
            lock.__exit__(None, None, None)


def _build_model_and_data(cfg: Config, registry: Registry) -> tuple[Any, Any, ChatProcessor, list[Any]]:
    """The model and tokenizer from the registry's components, the chat processor of the data side
    (the tokenizer and the components' processors, no weights) and the opened data sources (nothing
    read yet), each timed in the log."""
    from omnicore.model.build import build_omni_model

    with Phase(logger, "building the model") as ph:
        model, tokenizer = build_omni_model(cfg, registry, defer_load=True)  # filled shard by shard after parallelize
        ph.detail = f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; {_components(cfg)}"
    with Phase(logger, "opening the data") as ph:
        processor, sources = open_data(cfg, registry, tokenizer, rope=model.rope)
        desc = ", ".join(f"{s.name} (weight {s.config.weight:g})" for s in sources)
        ph.detail = f"{desc}; {cfg.data.num_workers} worker(s) per rank, started with the first step"
        if processor.template is not None and processor.template.rewrites:  # Qwen3 drops earlier <think> blocks: say so
            ph.detail += f"; the chat template rewrites {processor.template.rewrites}: samples are trained as it renders them"
    return model, tokenizer, processor, sources


def _components(cfg: Config) -> str:
    """``foundation qwen2; encoders image=qwen2_vl_vision, audio=whisper; decoders image=movqgan``."""
    m = cfg.model
    parts = [f"foundation {m.foundation.name}"]
    for kind, table in (("encoders", m.encoders), ("decoders", m.decoders)):
        if table:
            parts.append(f"{kind} " + ", ".join(f"{k}={c.name}" for k, c in table.items()))
    return "; ".join(parts)


def check_eval_file(cfg: Config) -> None:
    """``data.eval``'s files (a file, folder or glob, or a list of them:
    :func:`~omnicore.eval.heldout.resolve_eval`) must exist before the build when validation reads
    them (``eval.every``), not only at the first validation; when training does not read them, a
    missing one is a warning (for ``omnicore eval`` later).

    Raises:
        ConfigError: ``eval.every`` is set and an entry names no file; the message names the
            field, the entry as configured and as resolved (relative to the config file's folder).
    """
    from omnicore.config import ConfigError
    from omnicore.eval.heldout import resolve_eval

    _, problem = resolve_eval(cfg)
    if problem is None:
        return
    if cfg.eval.every:
        raise ConfigError(
            f"{cfg.source or 'config'}: {problem}; eval.every reads it for validation: fix the path "
            "(relative to the config file's folder) or set eval.every: 0"
        )
    logger.warning("%s; training does not read it, but `omnicore eval` will", problem)


def _load_init_from(folder: Path, model: Any, state: ParallelState) -> None:
    """``model.init_from``'s checkpoint weights into the (sharded) model, timed."""
    from omnicore.checkpoint.init_from import load_model_weights

    with Phase(logger, "loading the weights of model.init_from") as ph:
        load_model_weights(folder, model, state)
        ph.detail = str(folder)


def _check_rows(sources: list[Any], num_shards: int, cfg: Config) -> None:
    """Every source whose row count is known cheaply must give each virtual shard a row.

    Raises:
        SampleError: naming the source, its rows and the number of shards.
    """
    for src in sources:
        n = src.num_rows
        if n is not None and cfg.data.max_samples is not None:
            n = min(n, cfg.data.max_samples)
        if n is not None and n < num_shards:
            raise SampleError(
                f"data source {src.name!r} has {n} row(s) (data.max_samples included), fewer than the {num_shards} data shards "
                "(data-parallel groups x train.grad_accum): every shard needs rows; add rows, lower the shards, or remove the source"
            )


def _resume_data(data: DataPipeline, meta: dict[str, Any], folder: Path, state: ParallelState, *, verify: bool = True) -> None:
    """Continue the data stream where the checkpoint left it (collective: the ranks agree, so that
    a rank whose copy of the data differs stops every rank).

    Raises:
        DataResumeError: the checkpoint has no data position (written before the streaming pipeline),
            this run's layout cannot continue it (:func:`omnicore.data.state.check_resume`), or
            (``verify``) a data file differs from the one the checkpoint's run read
            (:mod:`omnicore.data.fingerprint`), on this rank or another.
    """
    if "data" not in meta:
        raise DataResumeError(
            f"{folder}: the checkpoint holds no data position (written by an omnicore before the streaming data pipeline); "
            "start a new run, or load its weights with model options"
        )
    error: DataResumeError | None = None
    try:
        data.load_state_dict(meta["data"], verify=verify)
    except DataResumeError as exc:
        error = exc
    failed = state.all_reduce_sum(1.0 if error is not None else 0.0)
    if error is not None:
        raise DataResumeError(f"{folder}: {error}") from error
    if failed:
        raise DataResumeError(f"{folder}: the data of {failed:.0f} other rank(s) does not continue the checkpoint (see their error)")


def _parallelize_model(
    model: Any, cfg: Config, strategies: list[tuple[str, Any]], state: ParallelState, log: Callable[..., None]
) -> tuple[Any, tuple[int, int, int]]:
    """Move ``model`` to the device and let the strategies (from :func:`build_strategies`) wrap it
    from outside; returns the model and ``(data_rank, data_size, replicas)``."""
    from omnicore.model.loading import fill_pending, to_device_keeping_meta

    with Phase(logger, f"moving the model to {state.device} and applying the parallel strategies"):
        to_device_keeping_meta(model, state.device)
        state.mixed_precision = cfg.train.mixed_precision
        model = parallelize(model, state, strategies)  # in phase order (see omnicore.parallel.parallelize)
    if getattr(model, "pending_loads", None):  # each rank reads its own shards of the foundation checkpoint
        with Phase(logger, "loading the foundation weights shard by shard") as ph:
            filled = fill_pending(model, state.device)
            ph.detail = f"{filled} tensors from {cfg.model.foundation.options.get('checkpoint')}"
    # A strategy that splits each micro-batch over several ranks (sequence parallelism) decides which
    # micro-batches this rank reads; by default every rank reads its own. `replicas` ranks see each
    # micro-batch, so counts from the data are divided by it.
    data_rank, data_size = data_split(strategies, state)
    replicas = state.world_size // data_size
    names = [n for n, _ in strategies if n.split(":")[-1] != "none"] or ["none"]
    log(
        f"parallel: {state.layout.describe()}; strategies: {', '.join(names)}; data split into {data_size} shard(s), one per data-parallel group"
    )
    kernels = {op: c.name for op, c in cfg.model.kernel_choices().items()}
    kernels.setdefault("cross_entropy", "torch_cross_entropy")
    precision = "bf16 mixed (fp32 parameters)" if cfg.train.mixed_precision == "bf16" else cfg.run.dtype
    m = cfg.model
    own = [f"model.{f}: {c.dtype}" for f, c in [("foundation", m.foundation)] + [(f"{kind}s.{k}", c) for kind, table in
           (("encoder", m.encoders), ("decoder", m.decoders)) for k, c in table.items()] if c.dtype and c.dtype != cfg.run.dtype]  # fmt: skip
    precision += f" ({', '.join(own)} parameters)" if own else ""
    log(f"kernels: {', '.join(f'{op}={k}' for op, k in kernels.items())} (other ops: the foundation's own code); precision: {precision}")
    return model, (data_rank, data_size, replicas)


def _open_outputs(cfg: Config, state: ParallelState, out_dir: Path, resume: bool, start: int) -> tuple[Path, Any]:
    """The metrics file (emptied for a fresh run) and the progress bar; both on rank 0 only."""
    metrics_path = out_dir / "metrics.jsonl"
    if state.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            metrics_path.unlink(missing_ok=True)  # a fresh run starts a fresh metrics file
    bar = None
    if state.is_main and cfg.train.progress:  # tqdm on a terminal, plain lines in a log file
        from omnicore.progress import progress_bar

        bar = progress_bar(cfg.train.max_steps, start)
    return metrics_path, bar


def _precision(cfg: Config, state: ParallelState) -> tuple[Callable[[], contextlib.AbstractContextManager[Any]], float | None]:
    """The autocast context factory of the forward pass, and the device's peak TFLOP/s for MFU."""
    # bf16 mixed precision: parameters, optimizer state and gradient reductions stay fp32; matmuls run
    # in bf16 under autocast (FSDP2 also gathers bf16 parameters); the loss is computed from fp32
    # logits and accumulated in fp64 (_StepTotals).
    bf16 = cfg.train.mixed_precision == "bf16"
    autocast = (lambda: torch.autocast(state.device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    compute_dtype = "bf16" if bf16 or cfg.run.dtype == "bfloat16" else "fp32"
    return autocast, peak_tflops(state.device, compute_dtype, cfg.train.peak_tflops)


# ---------------------------------------------------------------------------------------------
# one step
# ---------------------------------------------------------------------------------------------


def forward_backward_step(run: Run, mb: Any, scale: float) -> Any:
    """Forward and backward of one collated micro-batch; returns the model's output (loss sums and
    target counts of this rank's part of it). ``scale`` is ``dp / N`` (module docstring)."""
    with run.autocast():
        out = run.model(to_device(mb, run.state.device))
    (out.loss_sum * scale).backward()
    return out


@dataclass
class _StepTotals:
    """What one rank adds up over a step's micro-batches, for the metrics only."""

    loss_sum: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))
    tokens: float = 0
    flops: dict[str, float] = field(default_factory=dict)  # model FLOPs per part (this rank's share)
    part_sums: dict[str, float] = field(default_factory=dict)  # per part: "text", "decoder.<m>"[".depth"]
    part_counts: dict[str, int] = field(default_factory=dict)

    def add(self, out: Any) -> None:
        self.loss_sum += out.loss_sum.detach().double().cpu()
        n_text = out.n_targets - sum(out.decoder_targets.values())  # this rank's part of the micro-batch
        parts = {"text": (float(out.text_loss_sum), n_text)}
        parts.update({f"decoder.{m}": (float(v), out.decoder_targets[m]) for m, v in out.decoder_loss_sums.items()})
        for k, (v, c) in parts.items():
            self.part_sums[k] = self.part_sums.get(k, 0.0) + v
            self.part_counts[k] = self.part_counts.get(k, 0) + c


def train_step(run: Run, step: int) -> dict[str, Any] | None:
    """One optimizer step (0-based ``step``) over ``train.grad_accum`` micro-batches; returns its
    metrics row, the same on every rank, or None on every rank when some rank's data ran out (a
    source with ``on_exhausted: stop``): nothing of the step is applied."""
    cfg, state = run.cfg, run.state
    t0 = time.perf_counter()
    got = _step_batches(run)
    if got is None:
        return None
    micro, n_global = got
    # dp = world size: the ranks gradients are averaged over (FSDP2's group, or a strategy's own all-reduce)
    scale = state.world_size / max(n_global, 1.0)
    totals = _StepTotals()
    for mb in micro:
        with run.flops.count(mb) as flops:  # per part; a part seen for the first time is measured
            out = forward_backward_step(run, mb, scale)
        totals.add(out)
        totals.tokens += mb.num_tokens / run.replicas
        for part, n in flops.items():
            totals.flops[part] = totals.flops.get(part, 0.0) + n / run.replicas
    wait = reduce_wait(run)
    # one all-reduce for every figure of the step's metrics and any rank's stop signal (before the
    # update: the target check below must stop a wrong run before its first optimizer step)
    keys = run.model.loss_parts()
    sums = state.all_reduce_named(_step_sums(run, totals, keys, wait))
    run.stop_signal = signal_from_flags([sums[f"signal/{s.name}"] for s in SIGNALS])
    run.logger_stop = sums["stop/logger"] > 0
    check_target_split(run, n_global, sum(sums[f"targets/{k}"] for k in keys))
    grad_norm = clip_grad_norm_(run.model.parameters(), cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf"))
    lr = run.scheduler.get_last_lr()[0] / run.optimizer.param_groups[0].get("factor", 1.0)  # train.lr x schedule this step
    loss = sums["loss_sum"] / max(n_global, 1.0)
    skip_reason = apply_update(run, step, loss, float(grad_norm), n_global)
    # a part without targets in this step (no image to generate) is left out, not logged as 0.0
    part_loss = {k: sums[f"loss_sum/{k}"] / sums[f"targets/{k}"] for k in keys if sums[f"targets/{k}"] > 0}
    dt = time.perf_counter() - t0
    flops_global = sum(sums[f"flops/{p}"] for p in run.flops.parts())
    row = _metrics_row(run, step, loss=loss, lr=lr, grad_norm=float(grad_norm), n_global=n_global,
                       tokens_global=sums["tokens"], flops_global=flops_global, dt=dt)  # fmt: skip
    row.update({f"loss/{k}": v for k, v in part_loss.items()})
    row.update(_flops_figures(run, sums, flops_global))
    row.update(_data_figures(run, sums))
    row.update(skipped=skip_reason is not None, skip_reason=skip_reason, skipped_steps=run.skipped_steps)
    return row


def _step_batches(run: Run) -> tuple[list[Any], float] | None:
    """This rank's micro-batches of the step and the step's global target count (the loss
    denominator), from one all-reduce that also tells whether any rank's data ran out (then None on
    every rank, together, with the data position put back to the last whole step) or failed (then
    every rank raises, so that none waits for the failed one in a collective). When every failure is
    a dead data worker (killed, out of memory), the steps trained are saved first, on every rank.

    Raises:
        SampleError, DataWorkerError: this rank's data failed (its own message); on the other ranks a
            SampleError naming the failed rank(s), or a DataWorkerError when they lost a data worker.
            A DataWorkerError says where the steps trained were saved and how to continue.
    """
    error: Exception | None = None
    micro, ended = [], 0.0
    try:
        micro = run.data.step()
    except DataExhausted:
        ended = 1.0
    except (SampleError, DataWorkerError) as exc:
        error = exc
    flags = [float(sum(mb.n_targets for mb in micro)), ended, 0.0 if error is None else 1.0, float(isinstance(error, DataWorkerError))]
    n_sum, any_ended, failed, died = run.state.all_reduce_sums(flags)
    if failed:
        if died == failed:  # only data workers died: the steps trained are saved on every rank, then it stops
            run.data.rewind()
            saved = _save_after_data_failure(run)
            if error is None:
                error = DataWorkerError(
                    f"{died:.0f} rank(s) lost a data worker (see that rank's error); this rank {run.state.rank} stops too"
                )
            raise DataWorkerError(f"{error}; {saved}") from error
        if error is not None:
            raise error
        raise echo_of_other_rank(
            SampleError(f"{failed:.0f} rank(s) stopped on a data error (see that rank's error); this rank {run.state.rank} stops too")
        )
    if any_ended:
        run.data.rewind()
        return None
    return micro, n_sum / run.replicas


def _save_after_data_failure(run: Run) -> str:
    """Save the steps trained so far (unless just saved; collective) when a data worker died, and
    say where and how to go on; the data position was put back to the last whole step."""
    done = run.history[-1]["step"] if run.history else run.start
    if done == 0:
        return "no step was trained, nothing to save"
    if run.saved_at != done and done > run.start:
        save(run, done)
    return f"the {done} steps trained are saved in {run.ckpt_root / f'step-{done:08d}'}; continue with: {continue_command(run.cfg)}"


def _step_sums(run: Run, totals: _StepTotals, parts: list[str], wait: float = 0.0) -> dict[str, float]:
    """This rank's figures of the step, by name, for the step's one all-reduce (every rank has the
    same names, in the same order): ``loss_sum`` and ``tokens`` (this rank's share of each
    micro-batch), ``flops/<part>`` for each part of :meth:`ModelFlops.parts`, ``rank_flops/<r>``
    and ``reduce_wait_s/<r>`` (this rank's model FLOPs and ``wait`` in its own slot ``r``, zero in
    the others: the sum is every rank's figure), ``loss_sum/<part>`` and ``targets/<part>`` for
    each of ``parts`` (``text``, ``decoder.<m>``), ``data_wait_s`` (seconds waiting for
    micro-batches), ``seen/<source>`` and ``skipped/<source>`` (the data's running counts) and
    ``signal/<SIGNAL>`` (1.0 for a stop signal this rank received:
    :func:`~omnicore.train.signals.signal_flags`) and ``stop/logger`` (1.0 when a logger of this
    rank asked to end the run: :class:`~omnicore.train.loggers.StopRequest`)."""
    seen, skipped = run.data.counts()
    names = run.data.source_names
    out = {"loss_sum": float(totals.loss_sum), "tokens": float(totals.tokens)}
    out.update({f"flops/{p}": totals.flops.get(p, 0.0) for p in run.flops.parts()})
    rank, world = run.state.rank, run.state.world_size
    out.update({f"rank_flops/{r}": sum(totals.flops.values()) if r == rank else 0.0 for r in range(world)})
    out.update({f"reduce_wait_s/{r}": wait if r == rank else 0.0 for r in range(world)})
    out.update({f"loss_sum/{k}": totals.part_sums.get(k, 0.0) for k in parts})
    out.update({f"targets/{k}": float(totals.part_counts.get(k, 0)) for k in parts})
    out["data_wait_s"] = run.data.take_wait()
    out.update({f"seen/{name}": float(n) for name, n in zip(names, seen)})
    out.update({f"skipped/{name}": float(n) for name, n in zip(names, skipped)})
    out.update({f"signal/{s.name}": flag for s, flag in zip(SIGNALS, signal_flags(run.stop))})
    out["stop/logger"] = 1.0 if run.loggers.stop_request is not None else 0.0
    return out


def reduce_wait(run: Run) -> float:
    """Seconds this rank waits at the step's gradient reduction for the slowest rank: its queued
    device work drained first (CUDA), then one all-reduce of a number, which returns when every rank
    has reached it (:mod:`omnicore.train.metrics`); 0.0 on one process."""
    state = run.state
    if not state.distributed:
        return 0.0
    if state.device.type == "cuda":
        torch.cuda.synchronize(state.device)
    t0 = time.perf_counter()
    state.all_reduce_sum(0.0)
    return time.perf_counter() - t0


def _flops_figures(run: Run, sums: dict[str, float], total: float) -> dict[str, Any]:
    """``flops_share/<part>`` (each part's fraction of the step's model FLOPs, every rank) and the
    balance figures (:func:`~omnicore.train.metrics.balance_figures`) from the step's sums."""
    world = run.state.world_size
    out: dict[str, Any] = {f"flops_share/{p}": sums[f"flops/{p}"] / total if total > 0 else 0.0 for p in run.flops.parts()}
    out.update(balance_figures([sums[f"rank_flops/{r}"] for r in range(world)], [sums[f"reduce_wait_s/{r}"] for r in range(world)]))
    return out


def _data_figures(run: Run, sums: dict[str, float]) -> dict[str, Any]:
    """Metrics of the data side from the step's all-reduced sums (:func:`_step_sums`):
    ``data_wait_s`` (mean over ranks of the step's seconds spent waiting for micro-batches),
    ``samples/<source>`` and ``skipped/<source>`` (run totals, every data group counted once)."""
    names = run.data.source_names
    out: dict[str, Any] = {"data_wait_s": sums["data_wait_s"] / run.state.world_size}
    out.update({f"samples/{name}": int(round(sums[f"seen/{name}"] / run.replicas)) for name in names})
    out.update({f"skipped/{name}": int(round(sums[f"skipped/{name}"] / run.replicas)) for name in names})
    return out


def apply_update(run: Run, step: int, loss: float, grad_norm: float, n_global: float) -> str | None:
    """The optimizer step of 0-based ``step``, or none: returns None when the update was applied, else
    why not (``"nonfinite"``, ``"no_targets"``); the gradients are cleared and the LR schedule
    advances either way (module docstring).

    Every rank takes the same decision from the same numbers: ``loss`` is the all-reduced loss sum
    over the global count (a NaN or inf on any rank makes it non-finite everywhere), ``grad_norm`` is
    global (:func:`clip_grad_norm_` makes sharded norms whole; replicated gradients are already
    reduced) and ``n_global`` is all-reduced.

    Raises:
        NonFiniteError: ``loss`` or ``grad_norm`` is NaN or inf under ``train.on_nonfinite: stop``, or
            after ``train.max_skipped_steps`` skipped non-finite steps in a row; raised before any
            change to weights, optimizer state or schedule.
    """
    reason = None
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        run.nonfinite_in_row += 1
        t = run.cfg.train
        if t.on_nonfinite == "stop" or run.nonfinite_in_row > t.max_skipped_steps:
            # weights made non-finite by an earlier update (at a finite loss) are not "the last finite step's"
            bad = nonfinite_tensors(run.model)
            weights = describe_nonfinite(bad) if run.state.all_reduce_sum(float(len(bad))) else None  # every rank calls it
            raise NonFiniteError(nonfinite_message(run.cfg, step + 1, loss, grad_norm, run.nonfinite_in_row, weights))
        reason = "nonfinite"
        run.log(f"step {step + 1}: skipped (loss {loss:.6g}, gradient norm {grad_norm:.6g}; train.on_nonfinite=skip)")
    elif n_global == 0:
        reason = "no_targets"  # AdamW with zero gradients would still decay the weights and move its moments
    if reason is None:
        run.optimizer.step()
        run.nonfinite_in_row = 0
    else:
        run.skipped_steps += 1
    run.optimizer.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        # a skipped first step calls scheduler.step() without optimizer.step(), which torch warns about
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
        run.scheduler.step()
    return reason


def check_target_split(run: Run, n_global: float, model_targets: float) -> None:
    """The targets the model computed losses over, summed over every rank, must be the step's global
    target count: ranks that read the same micro-batches (a strategy's ``data_split``) must each
    take their own part of the targets (Ulysses slices the sequence), and hooks must not drop any.

    Raises:
        ParallelizeError: the counts differ (the loss and gradients would be scaled by their ratio,
            silently, since AdamW hides a constant factor); the message names the strategies and the
            replication.
    """
    if abs(model_targets - n_global) < 0.5:
        return
    from omnicore.parallel.parallelize import ParallelizeError

    names = ", ".join(n for n, _ in run.strategies)
    raise ParallelizeError(
        f"the model computed losses over {model_targets:.0f} targets on all ranks together, but the step's micro-batches hold "
        f"{n_global:.0f} (strategies: {names}; {run.data_size} data group(s) for {run.state.world_size} rank(s), each micro-batch read "
        f"by {run.replicas} rank(s)); ranks that read the same micro-batches must each compute the loss of their own part of the "
        "targets (for example in a sequence hook, as Ulysses slices the sequence), or the loss and gradients are scaled by the ratio"
    )


def _metrics_row(
    run: Run, step: int, *, loss: float, lr: float, grad_norm: float, n_global: float, tokens_global: float, flops_global: float, dt: float
) -> dict[str, Any]:
    """The metrics row of step ``step`` (0-based) from its all-reduced figures and its time ``dt``."""
    cfg, accum = run.cfg, run.cfg.train.grad_accum
    tflops = flops_global / dt / run.state.world_size / 1e12  # achieved, per device, every part of the model
    return {
        "step": step + 1,
        "loss": loss,
        "lr": lr,
        "grad_norm": grad_norm,
        "targets": int(round(n_global)),
        "tokens": int(round(tokens_global)),
        "tokens_per_s": tokens_global / dt,
        "step_time_s": dt,
        "tflops": tflops,
        "mfu": tflops / run.peak_tflops if run.peak_tflops else None,
        "padding_waste": padding_waste(int(round(tokens_global)), accum * run.data_size, cfg.data.max_tokens),
        "peak_mem_mib": peak_memory_mib(run.state.device),
    }


def log_step(run: Run, row: dict[str, Any]) -> None:
    """Hand ``row`` to the run's loggers (``run.loggers``; the built-in ``jsonl`` appends it to
    ``metrics.jsonl``) every ``train.log_every`` steps and at the last one, and advance the progress
    bar; rank 0 only."""
    if not run.state.is_main:
        return
    done = row["step"]
    if done % run.cfg.train.log_every == 0 or done == run.cfg.train.max_steps:
        run.loggers.log_metrics(done, row, "train")
    if run.bar is not None:
        post = {"loss": f"{row['loss']:.4f}", "tok_s": f"{row['tokens_per_s']:.0f}"}
        if row["mfu"] is not None:
            post["mfu"] = f"{100 * row['mfu']:.1f}%"
        run.bar.set_postfix(post)
        run.bar.update(1)


def save(run: Run, done: int) -> None:
    """Checkpoint the run after ``done`` steps (model, optimizer, LR schedule and the data position
    of every data shard, gathered from all ranks). Collective.

    Raises:
        NonFiniteError: on every rank, before anything is written, when any rank's weights or
            optimizer state hold NaN or inf (:func:`~omnicore.train.optim.nonfinite_tensors`): an
            update at a finite loss made them so, and a checkpoint of them would resume into NaN.
        CheckpointError: as :func:`~omnicore.checkpoint.dcp.save_checkpoint` (a full disk).
    """
    from omnicore.checkpoint.dcp import save_checkpoint

    cfg = run.cfg
    bad = nonfinite_tensors(run.model, run.optimizer)
    if run.state.all_reduce_sum(float(len(bad))):
        latest = run.ckpt_root / "latest"
        named = latest.read_text().strip() if latest.is_file() else None
        raise NonFiniteError(nonfinite_save_message(cfg, done, bad, str(run.ckpt_root / named) if named else None))
    local = run.data.state_dict()
    if run.state.distributed:
        import torch.distributed as dist

        gathered: list[Any] = [None] * run.state.world_size
        dist.all_gather_object(gathered, local)
        local = merge_states(gathered)
    extra = {"data": local, "seed": cfg.run.seed, "config": run.given_config}  # the config: for --resume to list what changed
    extra.update(skipped_steps=run.skipped_steps, nonfinite_in_row=run.nonfinite_in_row)
    save_checkpoint(run.ckpt_root, done, run.model, run.optimizer, run.scheduler, extra, run.state, cfg.train.keep_checkpoints)
    run.saved_at = done


def _after_step(run: Run, done: int) -> bool:
    """Save when due; False when the run stops here. ``train.stop_after`` ends this process early (a
    time-limited job; --resume goes on); a stop signal on any rank saves and raises
    :class:`~omnicore.train.signals.Interrupted` on every rank (the same step everywhere); so does
    a logger that asked to end the run (:class:`~omnicore.train.loggers.LoggerStopped`; at the last
    step the run finishes first, see :func:`_logger_stop_at_end`)."""
    cfg = run.cfg
    last = done == cfg.train.max_steps
    stop_after = cfg.train.stop_after is not None and done >= cfg.train.stop_after
    signum = run.stop_signal
    # one process acts on a logger's request at once; several agree on it in the next step's all-reduce
    by_logger = run.logger_stop or (not run.state.distributed and run.loggers.stop_request is not None)
    saved = last or stop_after or signum is not None or by_logger or bool(cfg.train.save_every and done % cfg.train.save_every == 0)
    if saved:
        save(run, done)
    if signum is not None:
        name = signal.Signals(signum).name
        where = run.ckpt_root / f"step-{done:08d}"
        cmd = continue_command(cfg)  # the user's overrides and torchrun prefix kept
        raise Interrupted(signum, f"stopped by {name} after step {done} of {cfg.train.max_steps}; saved {where}; continue with: {cmd}")
    if by_logger and not last:
        request = run.loggers.stop_request
        asked = request.describe() if request is not None else "a logger on rank 0 asked to end the run"
        where = run.ckpt_root / f"step-{done:08d}"
        raise LoggerStopped(
            request.exit_code if request is not None else 1,
            f"stopped after step {done} of {cfg.train.max_steps}: {asked}; saved {where}; continue with: {continue_command(cfg)}",
        )
    if stop_after and not last:
        run.log(f"stopped after step {done} (train.stop_after); continue with: {continue_command(cfg)}")
        return False
    return True


class EvaluationFailed(RuntimeError):
    """Validation or sampling raised during training; the steps trained were saved first and the
    message names the checkpoint and the command that continues the run (the cause is chained)."""


@contextlib.contextmanager
def _saved_on_failure(run: Run, done: int, what: str) -> Iterator[None]:
    """A failure inside (validation, sampling: a plugin's generation path, a bad held-out file)
    never loses the ``done`` steps trained: they are saved (unless just saved), then
    :class:`EvaluationFailed` is raised with the cause chained (a user's error, such as a bad
    held-out line, is raised again as its own type, so the CLI still prints it as one line, now
    naming the checkpoint). Saving is collective: a failure
    that reaches every rank (the usual case: the same code on the same data) saves on every rank."""
    try:
        yield
    except Exception as exc:
        if run.saved_at != done:
            save(run, done)
        where = run.ckpt_root / f"step-{done:08d}"
        go_on = "continue with: " + continue_command(run.cfg) if done < run.cfg.train.max_steps else "the run's last step: it is complete"
        message = f"the {done} steps trained are saved in {where}: fix the cause, then {go_on}"
        if isinstance(exc, (SampleError, ConfigError)):  # a user's error (a bad held-out line): still one line, of its type
            raise type(exc)(f"{' '.join(str(exc).split())}; {message}") from exc
        raise EvaluationFailed(f"{what} after step {done} failed: {type(exc).__name__}: {' '.join(str(exc).split())}; {message}") from exc


def _out_of_data(run: Run, done: int) -> None:
    """The data ran out before step ``done + 1``: save (unless just saved) and say so."""
    if done > run.start and run.saved_at != done:
        save(run, done)
    run.log(
        f"data: a source with on_exhausted: stop ran out after step {done} of {run.cfg.train.max_steps}; the run ends here "
        "(set on_exhausted: restart on that source for more epochs)"
    )


# ---------------------------------------------------------------------------------------------
# the recipe
# ---------------------------------------------------------------------------------------------


def train(
    cfg: Config, *, resume: bool | str = False, registry: Registry | None = None, state: ParallelState | None = None
) -> list[dict[str, Any]]:
    """Run training as configured; returns the per-step metrics (on every rank).

    ``resume``: True continues from the newest checkpoint that verifies (a corrupt newest one is
    skipped, and the log says so); a path or a name such as ``step-00000004`` continues from that
    one. False starts afresh (refused when the folder already holds a run).

    Raises:
        SampleError: a bad training sample (``FILE:LINE: ...``) when ``data.on_error`` is ``raise``.
        RegistryError: a component or strategy cannot be resolved.
        CheckpointError: ``resume`` with no usable checkpoint, a fresh run into an output folder
            that already holds one, or (``RunLockError``) a folder another live run holds.
        NonFiniteError: a non-finite loss or gradient norm (``train.on_nonfinite``); nothing of that
            step is saved or exported. Or weights that became NaN or inf at a finite loss, found when
            saving (:func:`save`): nothing non-finite is written.
        Interrupted: SIGTERM or SIGINT; the step was finished and saved on every rank.
        LoggerStopped: a logger raised ``SystemExit`` or ``KeyboardInterrupt`` in a hook; the step was
            finished and saved as for a signal (an :class:`Interrupted` whose ``exit_code`` is the
            status the logger asked for).
        LoggerError: a ``run.loggers`` entry is unknown, has bad options, or its ``start`` raised
            (before step 1; see :mod:`omnicore.train.loggers`).
    """
    state = state or init_parallel_state(cfg.run.device, cfg.parallel.backend, cfg.parallel)
    log = logger.info  # shown on rank 0 (omnicore.logs)
    # SIGTERM/SIGINT (a scheduler's notice, Ctrl-C) from here on: finish the step, save, stop;
    # and one run at a time in the output folder
    with GracefulStop(announce=state.is_main) as stop, run_lock(cfg, state, log):
        # ---- set-up: model and data, parallelism, optimizer (restored on resume), outputs ------
        registry = registry or _discover(cfg)
        check_loggers(cfg, registry)  # a misspelt logger fails now, not after the model build
        run = setup(cfg, resume=resume, registry=registry, state=state)
        run.stop = stop
        try:
            # run.loggers on rank 0; one that cannot start stops the run here, before step 1
            with Phase(logger, "starting the loggers") as ph:
                run.loggers = start_loggers(run.cfg, registry, is_main=state.is_main, resume=bool(resume), start_step=run.start,
                                            distributed=state.distributed)  # fmt: skip
                ph.detail = ", ".join(c.name for c in run.cfg.run.logger_list()) or "none (run.loggers: [])"
            _loop(run)
        finally:
            run.data.close()
            run.loggers.close()
    return run.history


def build_validator(run: Run) -> Validator:
    """The run's :class:`~omnicore.eval.validate.Validator` (its loggers started: rows go to them).

    Raises:
        ConfigError: as the validator does (task accuracy under sequence parallelism).
    """
    return Validator(run.cfg, tokenizer=run.tokenizer, processor=run.processor, state=run.state, data_rank=run.data_rank,
                     data_size=run.data_size, replicas=run.replicas, autocast=run.autocast, log_row=run.loggers.log_metrics,
                     log=run.log)  # fmt: skip


def build_sampler(run: Run) -> Sampler:
    """The run's :class:`~omnicore.eval.samples.Sampler` (its loggers started: images go to them).

    Raises:
        ConfigError, SampleError: as the sampler does (sequence parallelism, a prompt that cannot encode).
    """
    return Sampler(run.cfg, tokenizer=run.tokenizer, processor=run.processor, state=run.state, out_dir=run.out_dir,
                   replicas=run.replicas, log_images=run.loggers.log_images, log=run.log)  # fmt: skip


def _discover(cfg: Config) -> Registry:
    """:func:`registry_for`, timed: loading the plugins imports their hook modules."""
    with Phase(logger, "loading the plugins") as ph:
        registry = registry_for(cfg)
        providers = {r.provider for r in registry.rows}
        ph.detail = f"{sum(r.kind != '-' for r in registry.rows)} components from {len(providers)} providers (built-ins included)"
    return registry


def _first_step(run: Run, step: int) -> dict[str, Any] | None:
    """:func:`train_step` of this process's first step, timed as the last phase of start-up: the data
    workers start, decode and tokenise the first windows, then the first forward and backward run."""
    d = run.cfg.data
    workers = f"{d.num_workers} data worker(s) per rank" if d.num_workers else "the training process (data.num_workers 0)"
    with Phase(logger, f"step {step + 1}: reading the first micro-batches in {workers}, then forward and backward") as ph:
        row = train_step(run, step)
        if row is not None:
            ph.detail = f"{row['data_wait_s']:.1f} s of it waiting for data"
    return row


def _loop(run: Run) -> None:
    """The steps, then the wrap-up (throughput summary, export of a finished run)."""
    from omnicore.checkpoint.export import export_model

    cfg = run.cfg
    # refused here, before step 1: generation under sequence parallelism, a prompt that cannot encode
    validator, sampler = build_validator(run), build_sampler(run)
    # ---- the loop ------------------------------------------------------------------------
    out_of_data = False
    for step in range(run.start, cfg.train.max_steps):
        row = train_step(run, step) if step > run.start else _first_step(run, step)
        if row is None:  # a source with on_exhausted: stop ran out on some rank
            out_of_data = True
            _out_of_data(run, step)
            if sampler.due(step, final=True):  # samples/final.png (every rank)
                with _saved_on_failure(run, step, "sampling"):
                    sampler.run(run.model, step, final=True)
            break
        run.history.append(row)
        log_step(run, row)
        done = step + 1
        with _saved_on_failure(run, done, "validation or sampling"):
            if validator.due(done):  # held-out loss (+ accuracy): a "split": "val" row (every rank)
                validator.run(run.model, done)
            if sampler.due(done):  # samples/step-N.png, final.png at the end (every rank)
                sampler.run(run.model, done)
        if not _after_step(run, done):
            break
    # ---- wrap-up: throughput summary, then export of a finished run ------------------------
    if run.bar is not None:
        run.bar.close()
    if run.history:
        run.log(summarize(run.history))
        skipped = skipped_summary(run.history[-1], run.data.source_names)
        if skipped and run.state.is_main:
            logger.warning(skipped)
    cache = getattr(run.model, "code_cache", None)
    if cache is not None and cache.hits + cache.misses:  # train.code_cache_mb: how much encoding it saved
        run.log(cache.describe())
    # a resume of a finished run (its export failed, say) trains no step and exports it again
    finished = out_of_data or (run.history[-1]["step"] if run.history else run.start) == cfg.train.max_steps
    if cfg.train.export and finished:
        path = export_model(run.model, run.tokenizer, cfg, run.out_dir / "export", run.state, run.registry)
        run.log(f"exported to {path}")
    if run.state.is_main:  # loss.png from metrics.jsonl; a failure is a warning line, never an error
        from omnicore.plot import plot_after_training

        run.log(plot_after_training(run.out_dir))
    _logger_stop_at_end(run)


def _logger_stop_at_end(run: Run) -> None:
    """A logger that asked to end the run after the last step's agreement (or at the last step) is
    still answered: the run is complete (saved, exported), and the process ends with the status the
    logger asked for, naming it (rank 0, where loggers run).

    Raises:
        LoggerStopped: ``run.loggers.stop_request`` is set.
    """
    request = run.loggers.stop_request
    if request is None:
        return
    done = run.history[-1]["step"] if run.history else run.start
    raise LoggerStopped(
        request.exit_code, f"{request.describe()} at step {done}; the run had finished: saved in {run.ckpt_root / f'step-{done:08d}'}"
    )


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def skipped_summary(row: dict[str, Any], sources: list[str]) -> str | None:
    """The count of bad samples a run skipped (``data.on_error: skip``), from its last metrics row's
    ``skipped/<source>`` (run totals, every rank's shards): ``data: bad samples skipped 3 times in
    all (train 2, captions 1; data.on_error: skip; ...); the first are named above``; None when there
    were none. A bad line is skipped again at each pass over its source (as ``samples/<source>``
    counts a sample at each pass), so the line says that the count is of skips, not of bad lines."""
    counts = {name: int(row.get(f"skipped/{name}", 0)) for name in sources}
    total = sum(counts.values())
    if not total:
        return None
    per = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
    times = "once" if total == 1 else f"{total} times"
    return (
        f"data: bad samples skipped {times} in all ({per}; data.on_error: skip; a bad line counts again at each pass over its "
        "source); the first are named above"
    )


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
    first, last = rows[0]["step"], rows[-1]["step"]
    span = f"step {first}, warm-up included" if len(rows) == 1 else f"median over steps {first}..{last}"
    return f"throughput ({span}): " + ", ".join(parts)
