"""Validation during training: the held-out loss every ``eval.every`` steps, and the task accuracy
of generated answers (``eval.task_samples``).

:class:`Validator` is built once before step 1 from the config and the run's parts; the training
loop asks it after every step: ``if validator.due(step): validator.run(model, step)``, on every rank
(the held-out loss and generation are collectives).

The figures (:func:`omnicore.eval.heldout.heldout_loss`, :func:`omnicore.eval.scoring.task_accuracy`)
are a row of their own, handed to the run's loggers with split ``val`` after the training row of the
same step; in ``metrics.jsonl`` (the ``jsonl`` logger): ``{"step": N, "split": "val", "val_loss":
..., "val_loss/text": ..., "val_loss/decoder.image": ..., "val_targets": ..., "val_samples": ...,
"val_skipped": ..., "val_time_s": ...}``. Training rows carry no ``split`` key. With
``eval.task_samples K`` the row also holds the exact-match accuracy of the generated answers of
the first ``K`` samples of ``data.eval`` with a text answer (those of ``omnicore eval --limit K``,
scored by the same code): ``val_acc``, ``val_acc/<task>`` (per sample ``task`` key, else
``default``) and ``val_acc_samples`` (how many were scored); ``val_time_s`` includes it.
Before step 1 the validator warns, as ``omnicore eval`` does, about tasks whose expected answers
need more than ``generate.max_new_tokens`` tokens (they are cut short and score 0:
:func:`omnicore.eval.scoring.short_answer_warnings`).

``data.eval`` may name several files (a folder, a glob or a list: :func:`omnicore.eval.heldout.eval_files`),
resolved once when the validator is built, so every validation of a run reads the same files. Under
``data.on_error: skip`` the first held-out samples skipped are named in the log (``FILE:LINE: why``,
:data:`~omnicore.data.pipeline.NAMED_SKIPS` per rank), once per run; ``val_skipped`` counts them all.

A validation (or sampling) that raises never loses the steps already trained: the loop saves them
first, then stops with ``EvaluationFailed`` naming the checkpoint and the command that continues
(``omnicore.train.loop``); it does not go on without the validation the config asked for.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from omnicore.config import Config
from omnicore.data.chat import ChatProcessor
from omnicore.data.pipeline import NAMED_SKIPS
from omnicore.eval.generate import check_no_sequence_parallelism
from omnicore.eval.heldout import eval_files, heldout_loss
from omnicore.eval.scoring import answer_samples, short_answer_warnings, task_accuracy
from omnicore.parallel.state import ParallelState

logger = logging.getLogger(__name__)


class Validator:
    """The validation of a training run (module docstring).

    Args:
        cfg: the run's config (the ``eval`` section, ``train.max_steps``, ``data.eval``,
            ``data.max_tokens``, ``data.on_error``, ``data.packing``, ``data.packing_window``; the
            ``generate`` section for the task accuracy).
        tokenizer, processor: the run's tokenizer and chat processor.
        state: the parallel state; every rank of it runs :meth:`run` together.
        data_rank, data_size: this rank's data group and the number of groups (training's split,
            :func:`omnicore.parallel.parallelize.data_split`).
        replicas: ranks that read each micro-batch (> 1 under sequence parallelism).
        autocast: the forward's autocast context factory (training's).
        log_row: the run's loggers' ``log_metrics(step, row, split)`` (rank 0).
        log: status lines (``logger.info``).

    Raises:
        ConfigError: ``eval.task_samples`` under sequence parallelism (generation cannot run), or
            ``data.eval`` names no file (with ``eval.every``).
        SampleError: a bad line among the held-out samples the task accuracy scores (with
            ``eval.task_samples``, under ``data.on_error: raise``): found before step 1.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        tokenizer: Any,
        processor: ChatProcessor,
        state: ParallelState,
        data_rank: int,
        data_size: int,
        replicas: int,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]],
        log_row: Callable[[int, dict[str, Any], str], None],
        log: Callable[..., None],
    ) -> None:
        self.cfg, self.tokenizer, self.processor, self.state = cfg, tokenizer, processor, state
        self.data_rank, self.data_size, self.autocast = data_rank, data_size, autocast
        self.log_row, self.log = log_row, log
        self.every, self.task_samples = cfg.eval.every, cfg.eval.task_samples
        self.files = eval_files(cfg) if self.every else []  # once: every validation reads the same files
        self.named: list[str] = []  # held-out samples skipped and named so far (NAMED_SKIPS at most)
        if self.every and self.task_samples:
            check_no_sequence_parallelism(cfg, replicas, "eval.task_samples")
            # as `omnicore eval` does: answers longer than generate.max_new_tokens can never match
            short = short_answer_warnings(cfg, processor, answer_samples(cfg, self.task_samples), flag="--generate.max_new_tokens")
            for message in short:
                if state.is_main:
                    logger.warning("eval.task_samples: %s", message)

    def due(self, step: int) -> bool:
        """Whether validation runs after step ``step`` (1-based): every ``eval.every`` steps and
        at ``train.max_steps``; never when ``eval.every`` is 0."""
        return bool(self.every) and (step % self.every == 0 or step == self.cfg.train.max_steps)

    def run(self, model: torch.nn.Module, step: int) -> dict[str, Any]:
        """The held-out loss of ``model`` (and the task accuracy, when asked) after step ``step``,
        the same on every rank; on rank 0 handed to the loggers with split ``val`` and logged as one
        line. Every rank calls this together. Returns the row, with ``"split": "val"``.

        Raises:
            SampleError: a bad held-out sample under ``data.on_error: raise``, on every rank together.
        """
        cfg = self.cfg
        t0 = time.perf_counter()
        skipped: list[str] = []
        figures = heldout_loss(
            model, self.processor, self.files, cfg.data.max_tokens, state=self.state,
            data_rank=self.data_rank, data_size=self.data_size, max_samples=cfg.eval.max_samples,
            on_error=cfg.data.on_error, autocast=self.autocast, device=self.state.device,
            window=cfg.data.packing_window, method=cfg.data.packing, errors=skipped,
        )  # fmt: skip
        self._name_skips(skipped)
        if self.task_samples:
            figures.update(task_accuracy(cfg, model, self.tokenizer, self.processor, self.task_samples))
        row = {"step": step, **figures, "val_time_s": time.perf_counter() - t0}
        if self.state.is_main:
            self.log_row(step, row, "val")  # the jsonl logger writes it with "split": "val" after "step"
            self.log(val_line(step, figures))  # logged (above a tqdm bar on a terminal: omnicore.logs)
        return {"step": step, "split": "val", **row}

    def _name_skips(self, skipped: list[str]) -> None:
        """Log the held-out samples this rank skipped (``data.on_error: skip``) that are not named
        yet, up to :data:`NAMED_SKIPS` in the run (every validation reads the same ones again)."""
        for message in skipped:
            if len(self.named) >= NAMED_SKIPS or message in self.named:
                continue
            self.named.append(message)
            logger.warning("validation: skipped a bad held-out sample (data.on_error: skip): %s", message)


def val_line(step: int, figures: dict[str, Any]) -> str:
    """The log line of a validation, e.g. ``step 20: val_loss 1.2345 (text 1.1000, decoder.image
    1.5000; 16 samples), accuracy 0.500 (constant 1.000, image_to_text 0.250; 10 samples)``."""
    parts = ", ".join(f"{k[9:]} {v:.4f}" for k, v in figures.items() if k.startswith("val_loss/"))
    line = f"step {step}: val_loss {figures['val_loss']:.4f} ({parts}; {figures['val_samples']} samples)"
    if "val_acc" in figures:
        tasks = ", ".join(f"{k[8:]} {v:.3f}" for k, v in figures.items() if k.startswith("val_acc/"))
        line += f", accuracy {figures['val_acc']:.3f} ({tasks}; {figures['val_acc_samples']} samples)"
    return line
