"""Scoring generated answers, and ``omnicore eval``.

A sample's expected answer is its last message when that is the assistant's and text only; the
generated answer is right when it equals that text after ``strip`` (exact match). Samples are
scored per task (their ``task`` key, else ``default``). :func:`evaluate` is ``omnicore eval``: the
held-out loss of every task of ``data.eval`` (:func:`omnicore.eval.heldout.heldout_loss_of`) and the
accuracy of the tasks whose answers are text, written to ``eval.json`` in the run folder.
Validation during training scores the same first samples with the same code (:func:`task_accuracy`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omnicore.config import Config
from omnicore.data.chat import ChatProcessor
from omnicore.data.jsonl import Part, Sample
from omnicore.eval.generate import generating, sampling_of
from omnicore.eval.heldout import heldout_loss_of, task_of
from omnicore.eval.loading import load_on_device
from omnicore.logs import Phase
from omnicore.model.generation import generate_batch
from omnicore.progress import progress_bar

logger = logging.getLogger(__name__)


def _answer(sample: Sample) -> str | None:
    last = sample.messages[-1]
    if last.role != "assistant" or any(p.type != "text" for p in last.parts):
        return None
    return "".join(p.value for p in last.parts).strip()


def prompt_text(sample: Sample) -> str:
    """The prompt of ``sample`` as one line for ``eval.json``: the messages before its answer,
    ``role: text``, media as ``<image: PATH>`` (``<image: N bytes>`` for media read from a table)."""
    messages = sample.messages[:-1] if sample.messages and sample.messages[-1].role == "assistant" else sample.messages

    def part(p: Part) -> str:
        if p.type == "text":
            return str(p.value)
        return f"<{p.type}: {len(p.value)} bytes>" if isinstance(p.value, bytes) else f"<{p.type}: {p.value}>"

    return " | ".join(f"{m.role}: " + " ".join(part(p) for p in m.parts) for m in messages)


def score_samples(
    cfg: Config, model: Any, tokenizer: Any, processor: ChatProcessor, samples: list[Sample], *, progress: bool = True
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Generate the answers of ``samples`` (each with a text answer) ``generate.batch_size`` prompts
    per forward on the model's device, and score them by exact match.

    Prompts are batched in order of length (less padding); sample ``i`` draws with seed
    ``run.seed + i`` whatever its batch, so the answers do not depend on the batch size.

    Returns:
        ``(summary, rows)``: ``{"accuracy", "correct", "total", "seconds", "seconds_per_sample",
        "batch_size", "device", "tasks": {task: {"accuracy", "correct", "total"}}}`` (tasks from each
        sample's ``task`` key, else ``default``), and one row per sample in input order:
        ``{"where", "task", "prompt", "expected", "answer", "correct"}``.

    Raises:
        SampleError: a prompt that cannot be encoded (``FILE:LINE: ...``).
    """
    t0 = time.perf_counter()
    prompts = [processor.encode(s, prompt_only=True) for s in samples]
    order = sorted(range(len(samples)), key=lambda i: len(prompts[i]))
    size = cfg.generate.batch_size
    answers: dict[int, str] = {}
    bar = progress_bar(len(samples), desc="eval", unit="sample", logger=logger) if progress else None
    for b in range(0, len(order), size):
        idx = order[b : b + size]
        outs = generate_batch(
            model,
            tokenizer,
            [prompts[i] for i in idx],
            max_new_tokens=cfg.generate.max_new_tokens,
            sampling=sampling_of(cfg),
            seeds=[cfg.run.seed + i for i in idx],
            stop_id=processor.end_of_turn_id,
        )
        answers.update((i, o["text"].strip()) for i, o in zip(idx, outs))
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    rows = [_row(s, answers[i]) for i, s in enumerate(samples)]
    seconds = time.perf_counter() - t0
    summary = _summary(rows)
    summary.update(seconds=seconds, seconds_per_sample=seconds / max(len(rows), 1), batch_size=size)
    summary["device"] = str(next(model.parameters()).device)
    return summary, rows


def _row(sample: Sample, answer: str) -> dict[str, Any]:
    expected = _answer(sample)
    task = task_of(sample)
    return {
        "where": sample.where,
        "task": task,
        "prompt": prompt_text(sample),
        "expected": expected,
        "answer": answer,
        "correct": answer == expected,
    }


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tasks: dict[str, dict[str, Any]] = {}
    for r in rows:
        t = tasks.setdefault(r["task"], {"correct": 0, "total": 0})
        t["total"] += 1
        t["correct"] += int(r["correct"])
    for t in tasks.values():
        t["accuracy"] = t["correct"] / max(t["total"], 1)
    correct, total = sum(t["correct"] for t in tasks.values()), len(rows)
    return {"accuracy": correct / max(total, 1), "correct": correct, "total": total, "tasks": tasks}


def short_answer_warnings(cfg: Config, processor: ChatProcessor, samples: list[Sample], *, flag: str = "--max-new-tokens") -> list[str]:
    """One message per task whose expected text answers need more tokens than
    ``generate.max_new_tokens``: generation stops there, so those answers can never match and
    would silently score 0. A message names the task, how many of its ``samples`` are affected,
    the longest answer in tokens and the field to raise; none when every answer fits.

    An answer's length is that of its text parts in the processor's tokenizer, as training encodes
    them (the end-of-turn token is not needed: an answer cut at ``max_new_tokens`` right after its
    last token still matches). ``flag``: the command-line option the message offers
    (``omnicore eval``'s ``--max-new-tokens``; training's ``--generate.max_new_tokens``).
    """
    limit = cfg.generate.max_new_tokens
    totals: dict[str, int] = {}
    over: dict[str, list[int]] = {}
    for s in samples:
        task = task_of(s)
        totals[task] = totals.get(task, 0) + 1
        parts = [p.value for p in s.messages[-1].parts if p.type == "text"]
        n = sum(len(processor.tokenizer.encode(v, add_special_tokens=False, split_special_tokens=True)) for v in parts)
        if n > limit:
            over.setdefault(task, []).append(n)
    return [
        f"{task}: {len(ns)} of {totals[task]} expected answers need more than generate.max_new_tokens={limit} tokens (up to "
        f"{max(ns)}); they are cut short and score 0: raise generate.max_new_tokens to at least {max(ns)} "
        f"({flag} {max(ns)}, or in the config's generate section)"
        for task, ns in over.items()
    ]


def task_line(task: str, figures: dict[str, Any]) -> str:
    """One task of :func:`evaluate`'s ``"tasks"`` as the line ``omnicore eval`` prints, e.g.
    ``video_to_text: accuracy 0.950 (95/100), held-out loss 0.1234 per target (100 samples, 600
    targets)``; the accuracy only for tasks with text answers, the loss only when it was computed."""
    out = []
    if "accuracy" in figures:
        out.append(f"accuracy {figures['accuracy']:.3f} ({figures['correct']}/{figures['total']})")
    if "loss_targets" in figures:
        loss = f"{figures['loss']:.4f} per target" if "loss" in figures else "not computed (no targets)"
        out.append(f"held-out loss {loss} ({figures['loss_samples']} samples, {figures['loss_targets']} targets)")
    return f"{task}: " + (", ".join(out) or "no figures")


def answer_samples(cfg: Config, limit: int | None = None) -> list[Sample]:
    """The samples ``omnicore eval`` scores: those of ``data.eval`` whose answer (last message, from
    the assistant) is text only, in file order, the first ``limit`` of them (None or 0: all).
    Validation during training (``eval.task_samples``) scores the same first samples.

    Raises:
        ConfigError: ``data.eval`` names no file (:func:`~omnicore.eval.heldout.eval_files`).
        SampleError: ``data.eval`` holds a bad line (``FILE:LINE: ...``) before the ``limit``-th
            sample, under ``data.on_error: raise`` (``skip`` leaves it out).
    """
    import itertools

    from omnicore.data.jsonl import iter_jsonl
    from omnicore.eval.heldout import eval_files

    on_error = cfg.data.on_error  # a bad line is skipped here too under skip (validation's held-out loss names it)
    samples = (s for f in eval_files(cfg) for s in iter_jsonl(f, on_error=on_error) if _answer(s) is not None)
    return list(itertools.islice(samples, limit or None))


def evaluate(
    cfg: Config,
    *,
    checkpoint: str | None = None,
    export: str | None = None,
    limit: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """``omnicore eval``: the held-out loss of every task of ``data.eval``, and the exact-match
    accuracy (after ``strip``) of generated answers on the samples whose answer is text (the first
    ``limit`` of them), on :func:`eval_device`, ``generate.batch_size`` prompts per forward
    (:func:`score_samples`), with a progress bar on stderr when ``progress``. Answers longer than
    ``generate.max_new_tokens`` are warned about first (:func:`short_answer_warnings`).

    Writes ``eval.json`` in ``run.output_dir``: ``{"summary": ..., "samples": [{"where", "task",
    "prompt", "expected", "answer", "correct"}, ...]}``. Returns the summary of
    :func:`score_samples` plus ``"eval_json"`` (the file's path), ``"warnings"`` (the messages
    logged) and the held-out loss of :func:`heldout_loss_of` with ``by_task`` (``"loss"``,
    ``"loss/text"``, ...; over every sample of ``data.eval`` up to ``eval.max_samples``, not
    only those with a text answer, and not limited by ``limit``). ``"tasks"`` holds every task, in
    name order: ``{"loss", "loss_targets", "loss_samples"}``, plus ``{"accuracy", "correct",
    "total"}`` for tasks with text answers.

    Raises:
        ConfigError: if ``data.eval`` is not set, or ``run.device: cuda`` without a GPU.
    """
    from omnicore.config import ConfigError

    if not cfg.data.eval:
        raise ConfigError(f"{cfg.source}: data.eval: required for `omnicore eval` (a held-out JSONL)")
    model, tokenizer, processor = load_on_device(cfg, checkpoint, export)
    with Phase(logger, "held-out loss over data.eval") as ph:
        loss = heldout_loss_of(cfg, model, processor, by_task=True)  # as validation (eval.every) computes it, and per task
        ph.detail = f"{loss['loss']:.4f} over {loss['loss_targets']} targets, {len(loss['tasks'])} task(s)"
    samples = answer_samples(cfg, limit)
    warnings = short_answer_warnings(cfg, processor, samples)
    for message in warnings:
        logger.warning(message)
    logger.info("generating the answers of %d samples, %d per forward", len(samples), cfg.generate.batch_size)
    summary, rows = score_samples(cfg, model, tokenizer, processor, samples, progress=progress)
    tasks = summary["tasks"]
    for task, figures in loss.pop("tasks").items():
        tasks.setdefault(task, {}).update(figures)
    summary.update(loss, tasks=dict(sorted(tasks.items())), warnings=warnings)
    path = Path(cfg.run.output_dir) / "eval.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": summary, "samples": rows}, indent=1) + "\n")
    return {**summary, "eval_json": str(path)}


def task_accuracy(cfg: Config, model: Any, tokenizer: Any, processor: ChatProcessor, limit: int) -> dict[str, Any]:
    """The task figures of a validation row: the exact-match accuracy of the generated answers of
    the first ``limit`` samples of ``data.eval`` with a text answer (:func:`answer_samples`, scored
    by :func:`score_samples`, as ``omnicore eval --limit N`` scores them): ``val_acc``,
    ``val_acc/<task>`` and ``val_acc_samples`` (how many were scored; only that key when none has a
    text answer). Every rank of a sharded model calls this together and gets the same figures."""
    samples = answer_samples(cfg, limit)
    if not samples:
        return {"val_acc_samples": 0}
    with generating(model):
        summary, _ = score_samples(cfg, model, tokenizer, processor, samples, progress=False)
    out: dict[str, Any] = {"val_acc": summary["accuracy"]}
    out.update({f"val_acc/{task}": t["accuracy"] for task, t in sorted(summary["tasks"].items())})
    out["val_acc_samples"] = summary["total"]
    return out
