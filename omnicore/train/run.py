"""What one training run holds: :class:`Run`, built once by :func:`omnicore.train.loop.setup`.

The helpers of :mod:`omnicore.train.loop` take a :class:`Run`; each field below says what it is,
who sets it and whether it changes while the run goes on. Fields without a default are fixed by
set-up; those with one are the run's progress, updated by the loop (and, for ``skipped_steps`` and
``nonfinite_in_row``, restored from a checkpoint on ``--resume``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnicore.config import Config
from omnicore.data.chat import ChatProcessor
from omnicore.data.pipeline import DataPipeline
from omnicore.model.flops import ModelFlops
from omnicore.parallel.state import ParallelState
from omnicore.registry import Registry
from omnicore.train.loggers import Loggers
from omnicore.train.signals import GracefulStop


@dataclass
class Run:
    """Everything one training run holds from set-up to its last step."""

    cfg: Config
    """The validated config the run uses (after ``model.init_from`` re-pointed an export's components)."""
    state: ParallelState
    """This process's rank, world size, device and mesh."""
    model: torch.nn.Module
    """The :class:`~omnicore.model.omni.OmniModel`, as the parallel strategies wrapped it."""
    tokenizer: Any
    """The foundation's tokenizer (a transformers tokenizer)."""
    processor: ChatProcessor
    """Turns samples into token rows: the tokenizer and the components' processors."""
    data: DataPipeline
    """This rank's training micro-batches (reading, packing, resumable position)."""
    strategies: list[tuple[str, Any]]
    """The parallel strategies applied, in order: ``(name, strategy object)``."""
    optimizer: torch.optim.Optimizer
    """AdamW over the trainable parameters (:func:`omnicore.train.optim.build_optimizer`)."""
    scheduler: torch.optim.lr_scheduler.LRScheduler
    """Warm-up then cosine decay of the learning rate, stepped once per step."""
    data_rank: int
    """This rank's data group: which micro-batches it reads (:func:`omnicore.parallel.parallelize.data_split`)."""
    data_size: int
    """How many data groups (shards of the data) there are."""
    replicas: int
    """Ranks that read each micro-batch (> 1 with sequence parallelism); counts from the data are divided by it."""
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]
    """The forward's autocast context factory (bf16 under ``train.mixed_precision: bf16``, else a no-op)."""
    peak_tflops: float | None
    """The device's peak dense TFLOP/s for MFU; None where unknown."""
    flops: ModelFlops
    """The model's FLOPs per part (:mod:`omnicore.model.flops`): the foundation's formula, counted
    on the unsharded model, and the encoders' and decoders' measurements, made as their modality
    first appears."""
    out_dir: Path
    """``run.output_dir``."""
    ckpt_root: Path
    """``OUT_DIR/checkpoints``."""
    metrics_path: Path
    """``OUT_DIR/metrics.jsonl`` (written by the ``jsonl`` logger, rank 0)."""
    log: Callable[..., None]
    """Status lines: ``logger.info`` (shown on rank 0; see :mod:`omnicore.logs`)."""
    registry: Registry
    """The components the model was built from (the one :func:`omnicore.train.loop.train` was given, or
    the config's discovery); the export builds its copy and the foundation's export through it."""
    start: int = 0
    """Steps already done when this process began (a resumed run's checkpoint step)."""
    bar: Any = None
    """Rank 0 with ``train.progress``: a tqdm bar, or plain lines when stderr is no terminal (:mod:`omnicore.progress`)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """The metrics rows of this process's steps, in order (what :func:`omnicore.train.loop.train` returns)."""
    skipped_steps: int = 0
    """Steps without an update so far (non-finite or no targets); kept in checkpoints."""
    nonfinite_in_row: int = 0
    """Non-finite steps since the last applied update; kept in checkpoints."""
    stop: GracefulStop | None = None
    """The SIGTERM/SIGINT watcher while the loop runs."""
    stop_signal: int | None = None
    """A signal some rank received, agreed in the last step's all-reduce; None when none."""
    logger_stop: bool = False
    """A logger on rank 0 asked to end the run (``Loggers.stop_request``), agreed in the last step's
    all-reduce (one process: as soon as it asked)."""
    saved_at: int = -1
    """The step of the last checkpoint this process wrote (-1: none yet)."""
    loggers: Loggers = field(default_factory=Loggers)
    """``run.loggers``, started (rank 0; empty elsewhere and before they start)."""
    given_config: dict[str, Any] = field(default_factory=dict)
    """The config as the user gave it (JSON-ready, before ``model.init_from`` re-pointed components),
    kept in every checkpoint: a resume lists what changed (:mod:`omnicore.checkpoint.changes`)."""
