"""Loading a trained model, generation (text and decoder media), held-out accuracy and loss per task.

Generation itself is :mod:`omnicore.model.generation` (batched, left-padded, KV-cached; greedy by
default, ``generate.temperature: 0``); :func:`generate` is re-exported here. ``omnicore eval`` and
``omnicore generate`` run on ``run.device`` (:func:`eval_device`), ``generate.batch_size`` prompts
per forward; eval writes every answer to ``eval.json`` in the run folder. Every task of
``data.eval`` (a sample's ``task`` key) gets its held-out loss per target; tasks whose answers are
text also get their exact-match accuracy.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from omnicore.config import Config, ModelConfig
from omnicore.data.chat import ChatProcessor
from omnicore.data.jsonl import Message, Part, Sample
from omnicore.logs import Phase
from omnicore.model.generation import Sampling, generate, generate_batch  # generate: also the public name here
from omnicore.train.progress import progress_bar
from omnicore.train.validate import task_of

logger = logging.getLogger(__name__)


def model_config_from_export(export_dir: str | Path) -> ModelConfig:
    """The ``model:`` section written by an export, with its relative checkpoint paths made absolute."""
    import yaml

    export_dir = Path(export_dir).resolve()  # absolute: component paths must not depend on the config's folder
    path = export_dir / "omnicore.yaml"
    if not path.is_file():
        from omnicore.checkpoint.dcp import CheckpointError

        raise CheckpointError(f"{export_dir} is not an omnicore export (no omnicore.yaml)")
    section = yaml.safe_load(path.read_text())["model"]
    section["foundation"]["options"]["checkpoint"] = str(export_dir / section["foundation"]["options"]["checkpoint"])
    for kind in ("encoders", "decoders"):
        for comp in section.get(kind, {}).values():
            comp["options"]["checkpoint"] = str(export_dir / comp["options"]["checkpoint"])
    return ModelConfig.model_validate(section)


def load_trained(cfg: Config, checkpoint: str | None = None, export: str | None = None) -> tuple[Any, Any, ChatProcessor]:
    """``(model, tokenizer, processor)`` in eval mode on CPU, from an export or a DCP checkpoint.

    Without either argument, the latest checkpoint under ``run.output_dir`` is used.

    Raises:
        CheckpointError: if there is no such checkpoint or export.
    """
    from omnicore.checkpoint.dcp import latest_checkpoint, load_checkpoint
    from omnicore.model.build import build_omni_model
    from omnicore.model.lora import apply_lora, load_lora_adapter
    from omnicore.parallel.state import ParallelState

    if export is not None:
        cfg = cfg.model_copy(update={"model": model_config_from_export(export)})
        model, tokenizer = build_omni_model(cfg)
        if (Path(export) / "foundation_lora").is_dir():  # model.lora.export: adapter
            load_lora_adapter(model.lm, Path(export) / "foundation_lora")
    else:
        model, tokenizer = build_omni_model(cfg)
        apply_lora(model, cfg.model.lora)  # a LoRA run's checkpoint holds the adapter layers
        folder = Path(checkpoint) if checkpoint else latest_checkpoint(Path(cfg.run.output_dir) / "checkpoints")
        load_checkpoint(folder, model, None, None, ParallelState(0, 1, 0, torch.device("cpu")))
    model.eval()
    processor = ChatProcessor.for_model(tokenizer, model, cfg.data)
    return model, tokenizer, processor


def _load_on_device(cfg: Config, checkpoint: str | None, export: str | None) -> tuple[Any, Any, ChatProcessor]:
    """:func:`load_trained`, then the model on :func:`eval_device`; one timed log line."""
    with Phase(logger, "loading the trained model") as ph:
        model, tokenizer, processor = load_trained(cfg, checkpoint, export)
        device = eval_device(cfg)
        model.to(device)
        n = sum(p.numel() for p in model.parameters())
        ph.detail = f"{n / 1e6:.2f} M parameters from {export or checkpoint or 'the latest checkpoint'}, on {device}"
    return model, tokenizer, processor


def _answer(sample: Sample) -> str | None:
    last = sample.messages[-1]
    if last.role != "assistant" or any(p.type != "text" for p in last.parts):
        return None
    return "".join(p.value for p in last.parts).strip()


def heldout_loss_of(cfg: Config, model: Any, processor: ChatProcessor, *, by_task: bool = False) -> dict[str, Any]:
    """The held-out loss of a loaded model on ``data.eval``, as validation during training computes
    it (:func:`omnicore.train.validate.heldout_loss`: the same samples, ``train.eval_max_samples``
    included, packing budget, autocast and normalisation), on one process; comparable with the
    ``"split": "val"`` rows of ``metrics.jsonl``. Returns ``{"loss", "loss/text",
    "loss/decoder.<m>"..., "loss_targets"}`` (a part without targets is left out); with
    ``by_task`` (rows packed per task, same pass) also ``"tasks": {task: {"loss", "loss_targets",
    "loss_samples"}}``, sorted by task: the loss per target of that task's samples alone (``"loss"``
    left out for a task without targets).

    Raises:
        SampleError: a bad held-out sample (``FILE:LINE: ...``) when ``data.on_error`` is ``raise``.
    """
    import contextlib

    from omnicore.train.validate import heldout_loss

    device = next(model.parameters()).device
    bf16 = cfg.train.mixed_precision == "bf16"
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    path = cfg.resolve_path(cfg.data.eval or "")
    figures = heldout_loss(model, processor, path, cfg.data.max_tokens, max_samples=cfg.train.eval_max_samples,
                           on_error=cfg.data.on_error, autocast=autocast, by_task=by_task)  # fmt: skip
    out: dict[str, Any] = {k[4:]: v for k, v in figures.items() if k.startswith("val_loss") and not k.startswith("val_loss/task/")}
    out["loss_targets"] = figures["val_targets"]
    if by_task:
        out["tasks"] = {}
        for t in sorted(k[len("val_targets/task/") :] for k in figures if k.startswith("val_targets/task/")):
            loss = {"loss": figures[f"val_loss/task/{t}"]} if f"val_loss/task/{t}" in figures else {}
            out["tasks"][t] = {**loss, "loss_targets": figures[f"val_targets/task/{t}"], "loss_samples": figures[f"val_samples/task/{t}"]}
    return out


def eval_device(cfg: Config) -> torch.device:
    """Where ``omnicore eval`` and ``generate`` run: ``run.device`` (``auto``: the GPU when torch
    sees one, else the CPU).

    Raises:
        ConfigError: ``run.device: cuda`` on a machine where ``torch.cuda.is_available()`` is False.
    """
    from omnicore.config import ConfigError

    want = cfg.run.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{cfg.source}: run.device: cuda, but torch sees no CUDA device here; use auto or cpu")
    return torch.device("cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu")


def sampling_of(cfg: Config) -> Sampling:
    """The config's ``generate`` section (temperature, top_k, top_p) as a :class:`Sampling`."""
    g = cfg.generate
    return Sampling(g.temperature, g.top_k, g.top_p)


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


def short_answer_warnings(cfg: Config, processor: ChatProcessor, samples: list[Sample]) -> list[str]:
    """One message per task whose expected text answers need more tokens than
    ``generate.max_new_tokens``: generation stops there, so those answers can never match and
    would silently score 0. A message names the task, how many of its ``samples`` are affected,
    the longest answer in tokens and the field to raise; none when every answer fits.

    An answer's length is that of its text parts in the processor's tokenizer, as training encodes
    them (the end-of-turn token is not needed: an answer cut at ``max_new_tokens`` right after its
    last token still matches).
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
        f"(--max-new-tokens {max(ns)}, or in the config's generate section)"
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
    Validation during training (``train.eval_task_samples``) scores the same first samples.

    Raises:
        SampleError: ``data.eval`` is missing or holds a bad line (``FILE:LINE: ...``).
    """
    from omnicore.data.jsonl import read_jsonl

    samples = [s for s in read_jsonl(cfg.resolve_path(cfg.data.eval or "")) if _answer(s) is not None]
    return samples[:limit] if limit else samples


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
    ``"loss/text"``, ...; over every sample of ``data.eval`` up to ``train.eval_max_samples``, not
    only those with a text answer, and not limited by ``limit``). ``"tasks"`` holds every task, in
    name order: ``{"loss", "loss_targets", "loss_samples"}``, plus ``{"accuracy", "correct",
    "total"}`` for tasks with text answers.

    Raises:
        ConfigError: if ``data.eval`` is not set, or ``run.device: cuda`` without a GPU.
    """
    from omnicore.config import ConfigError

    if not cfg.data.eval:
        raise ConfigError(f"{cfg.source}: data.eval: required for `omnicore eval` (a held-out JSONL)")
    model, tokenizer, processor = _load_on_device(cfg, checkpoint, export)
    with Phase(logger, "held-out loss over data.eval") as ph:
        loss = heldout_loss_of(cfg, model, processor, by_task=True)  # as train.eval_every computes it, and per task
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


def _generate(cfg: Config, model: Any, tokenizer: Any, processor: ChatProcessor, sample: Sample) -> dict[str, Any]:
    """:func:`generate` of ``sample``'s prompt with the config's ``generate`` section and seed, stopping
    at the end-of-turn token of ``processor``'s chat format."""
    g = cfg.generate
    return generate(
        model,
        tokenizer,
        processor.encode(sample, prompt_only=True),
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_k=g.top_k,
        top_p=g.top_p,
        seed=cfg.run.seed,
        stop_id=processor.end_of_turn_id,
    )


def generate_cli(
    cfg: Config,
    *,
    prompts: list[str],
    image: str | None,
    audio: str | None,
    out_dir: str,
    checkpoint: str | None,
    export: str | None,
    num_samples: int = 1,
) -> Iterator[str]:
    """``omnicore generate``: yields lines to print: ``text: '...'`` (the generated text, quoted, so
    that text the model wrote after an image is not mistaken for an answer), then ``saved PATH``
    for each generated image. With several prompts or ``num_samples`` > 1 each answer's line starts
    with ``prompt P, sample S:`` (from 1) and its images are ``generated-pP-sS-MODALITY-I.png``
    (audio: ``.wav``, 16-bit PCM).

    ``image`` / ``audio`` go with every prompt. Runs on :func:`eval_device`, ``generate.batch_size``
    rows per forward, with the ``generate`` section's sampling; answer ``k`` (prompt-major) draws
    with seed ``run.seed + k``.

    Raises:
        ConfigError: ``num_samples`` < 1, or > 1 with greedy decoding (``generate.temperature: 0``
            would give identical answers), or ``run.device: cuda`` without a GPU.
    """
    from omnicore.config import ConfigError

    if num_samples < 1 or (num_samples > 1 and cfg.generate.temperature <= 0):
        raise ConfigError(f"--num-samples {num_samples}: needs 1, or more with sampling (--temperature > 0; greedy answers are all alike)")
    model, tokenizer, processor = _load_on_device(cfg, checkpoint, export)
    media = [Part(k, v) for k, v in (("image", image), ("audio", audio)) if v]
    encoded = [processor.encode(user_prompt(p, media), prompt_only=True) for p in prompts]
    jobs = [(p, s) for p in range(len(prompts)) for s in range(num_samples)]
    outs = generate_answers(cfg, model, tokenizer, processor, [encoded[p] for p, _ in jobs])
    for (p, s), out in zip(jobs, outs):
        multi = len(jobs) > 1
        label, stem = (f"prompt {p + 1}, sample {s + 1}: ", f"p{p + 1}-s{s + 1}-") if multi else ("", "")
        yield from _answer_lines(out, Path(out_dir), stem, label)


def user_prompt(text: str, media: list[Part] | None = None, where: str = "<command line>") -> Sample:
    """A one-message prompt as ``omnicore generate --prompt TEXT`` makes it: a user message of
    ``media`` (``image``/``audio`` parts) then ``text``; ``where`` names it in errors."""
    return Sample([Message("user", list(media or []) + [Part("text", text)])], where, 0)


def generate_answers(cfg: Config, model: Any, tokenizer: Any, processor: ChatProcessor, prompts: list[Any]) -> Iterator[dict[str, Any]]:
    """The answers to encoded ``prompts``, in order, as ``omnicore generate`` makes them:
    ``generate.batch_size`` per forward (:func:`generate_batch`), the ``generate`` section's
    ``max_new_tokens`` and sampling, answer ``k`` drawn with seed ``run.seed + k``, stopping at the
    processor's end-of-turn token. Yields each batch's answers as soon as it is done."""
    size = cfg.generate.batch_size
    for b in range(0, len(prompts), size):
        chunk = prompts[b : b + size]
        yield from generate_batch(
            model,
            tokenizer,
            chunk,
            max_new_tokens=cfg.generate.max_new_tokens,
            sampling=sampling_of(cfg),
            seeds=[cfg.run.seed + b + k for k in range(len(chunk))],
            stop_id=processor.end_of_turn_id,
        )


def _answer_lines(out: dict[str, Any], folder: Path, stem: str, label: str) -> Iterator[str]:
    """``LABELtext: '...'``, then ``saved PATH`` per decoded item (``generated-STEMMODALITY-I.png``,
    ``.wav`` for audio: :func:`save_decoded`)."""
    yield f"{label}text: {out['text']!r}"
    for m, imgs in out["images"].items():
        for i, img in enumerate(imgs):
            folder.mkdir(parents=True, exist_ok=True)
            yield f"saved {save_decoded(img, folder / f'generated-{stem}{m}-{i}')}"


def save_decoded(medium: Any, stem: Path) -> Path:
    """Write what a decoder's ``decode`` returned to ``stem`` plus a suffix and return the path: an
    :class:`omnicore.data.media.Audio` as ``STEM.wav`` (16-bit PCM at its own ``sample_rate``, samples
    clipped to [-1, 1]; soundfile), anything else (a ``PIL.Image``) as ``STEM.png``."""
    from omnicore.data.media import Audio

    if isinstance(medium, Audio):
        import numpy as np
        import soundfile as sf

        path = stem.with_name(stem.name + ".wav")
        sf.write(str(path), np.clip(np.asarray(medium.samples, dtype=np.float32), -1.0, 1.0), int(medium.sample_rate), subtype="PCM_16")
        return path
    path = stem.with_name(stem.name + ".png")
    medium.save(path)
    return path
