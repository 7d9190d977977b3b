"""The held-out loss: during training (``eval.every``) and in ``omnicore eval``.

Definition (the training loss's, on ``data.eval``): the sum of the per-target cross-entropies over
every target of the held-out samples (text tokens and decoder codes), divided by the global target
count; ``val_loss/text`` and ``val_loss/decoder.<m>`` divide each part's sum by that part's count,
as ``loss/text`` and ``loss/decoder.<m>`` do in the training rows. A part without targets in the
held-out set is left out.

The samples: ``data.eval``'s files (:func:`eval_files`: a file, folder or glob, or a list of them)
one after the other, each in file order (no shuffle), the first ``eval.max_samples`` when
set. Sample ``j`` belongs to data group ``j % data_size`` (the data-parallel groups of
:func:`omnicore.parallel.parallelize.data_split`; ranks of one sequence-parallel group read the same
samples), which packs its samples into rows of at most ``data.max_tokens`` tokens with training's
packer (:func:`omnicore.data.packing.pack_rows`: ``data.packing`` over windows of
``data.packing_window`` samples, in file order). Attention never crosses samples in a packed row, so
the loss does not depend on how samples are packed or sharded, up to the order of floating-point
sums. The file is read line by line (:func:`omnicore.data.jsonl.iter_jsonl`) and one window of
encoded samples is held per rank (one per task with ``by_task``).

Per task (``by_task``, what ``omnicore eval`` asks for): a sample's task is its ``task`` key
(``default`` without one). Each data group then packs every task's samples into rows of their own
(a window per task, packed when full and at the end), so each forward's loss sums belong to one task
and ``val_loss/task/<task>`` (that task's loss sum over its target count: the same normalisation,
per target, text tokens and decoder codes alike) comes from the same single pass. Only the packing
changes, so the overall figures are those of packing without tasks up to the order of
floating-point sums.

Collectives: every rank runs one forward per round, so FSDP2's all-gathers and Ulysses' all-to-alls
line up; a rank whose shard has run out runs a filler row (its last row, or the first sample of the
file) whose loss is dropped. One all-reduce per round says whether any rank still has a row (and
whether one failed on a bad sample: then every rank raises together); one at the end adds up the
sums and counts. Each rank's model output holds the loss of its own part of the row (sequence
parallelism slices it), so the all-reduced sums and counts are exact global totals.

The model runs under ``torch.no_grad`` in eval mode and every submodule is put back in its previous
mode after (a frozen part may train in eval mode); no parameter gets a gradient.

During training these figures are the ``split: val`` row of :class:`omnicore.eval.validate.Validator`.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnicore.config import Config, ConfigError
from omnicore.data.chat import ChatProcessor, Encoded
from omnicore.data.jsonl import SampleError, iter_jsonl
from omnicore.data.packing import collate, pack_rows, to_device
from omnicore.parallel.state import ParallelState

Paths = str | Path | Sequence[str | Path]
"""A held-out set: one JSONL file, or several read one after the other (:func:`eval_files`)."""


def resolve_eval(cfg: Config) -> tuple[list[Path], str | None]:
    """``data.eval``'s files and what is wrong with it: ``(files, None)``, or ``([], problem)`` where
    ``problem`` names the entry, as given and as resolved, e.g. ``data.eval: 'held-out.jsonl'
    (resolved to /runs/cfg/held-out.jsonl) is not a file``. Each entry (a string, or each of a
    list) is a file, a folder (its ``*.jsonl`` files, not recursive) or a glob (``**`` recursive),
    relative to the config file's folder; entries in the order given, a glob's or folder's files
    sorted, a file named twice read once. ``([], None)`` when ``data.eval`` is unset."""
    specs = [cfg.data.eval] if isinstance(cfg.data.eval, str) else list(cfg.data.eval or [])
    files: list[Path] = []
    for spec in specs:
        path = cfg.resolve_path(spec)
        where = f"{spec!r}" + (f" (resolved to {path})" if str(path) != spec else "")
        if any(c in spec for c in "*?["):
            found = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            problem = f"data.eval: {where} matches no file"
        elif path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == ".jsonl")
            problem = f"data.eval: {where} is a folder without *.jsonl files"
        else:
            found = [path] if path.is_file() else []
            problem = f"data.eval: {where} is not a file"
        if not found:
            return [], problem
        files += [f for f in found if f not in files]
    return files, None


def eval_files(cfg: Config) -> list[Path]:
    """``data.eval``'s held-out files, in reading order (:func:`resolve_eval`).

    Raises:
        ConfigError: ``data.eval`` is unset, or an entry names no file (``CONFIG: data.eval: 'SPEC'
            (resolved to PATH) is not a file`` / ``matches no file`` / ``is a folder without *.jsonl
            files``): fix the path, relative to the config file's folder.
    """
    if not cfg.data.eval:
        raise ConfigError(f"{cfg.source or 'config'}: data.eval: not set; give the held-out chat JSONL (a file, folder or glob)")
    files, problem = resolve_eval(cfg)
    if problem:
        raise ConfigError(f"{cfg.source or 'config'}: {problem}; fix the path (relative to the config file's folder)")
    return files


def _files(path: Paths) -> list[Path]:
    return [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]


def task_of(sample: Any) -> str:
    """The task of a :class:`~omnicore.data.jsonl.Sample`: its ``task`` key, else ``default``."""
    return str(sample.meta.get("task", "default"))


def eval_rows(
    path: Paths,
    processor: ChatProcessor,
    max_tokens: int,
    *,
    shard: int = 0,
    num_shards: int = 1,
    max_samples: int | None = None,
    on_error: str = "raise",
    skipped: list[str] | None = None,
    by_task: bool = False,
    window: int = 1024,
    method: str = "first_fit",
) -> Iterator[list[Encoded]]:
    """This data group's packed rows of the held-out set (see the module docstring).

    Args:
        path: the held-out JSONL, or several read one after the other (:func:`eval_files`).
        max_tokens: the row budget (``data.max_tokens``).
        shard, num_shards: this data group and the number of groups; sample ``j`` goes to group
            ``j % num_shards``.
        max_samples: only the first N samples of the file (``eval.max_samples``).
        on_error: ``raise`` or ``skip`` (``data.on_error``); skipped samples' messages go to ``skipped``.
        by_task: pack each task's samples into rows of their own (:func:`task_of`): each task's
            window is packed when it is full, the last window of each task at the end (in order of
            the tasks' first samples).
        window, method: training's packing (``data.packing_window``, ``data.packing``).

    Raises:
        SampleError: the file is missing; or (``on_error: raise``) a bad line, a sample that cannot
            be encoded, or one longer than ``max_tokens`` (``FILE:LINE: ...``).
    """
    items = _encoded(path, processor, max_tokens, shard, num_shards, max_samples, on_error, [] if skipped is None else skipped, {})
    for _, row in _pack(items, max_tokens, by_task, window, method):
        yield row


def _encoded(
    path: Paths,
    processor: ChatProcessor,
    max_tokens: int,
    shard: int,
    num_shards: int,
    max_samples: int | None,
    on_error: str,
    skipped: list[str],
    tasks: dict[str, None],
) -> Iterator[tuple[str, Encoded]]:
    """``(task, encoded sample)`` for this group's samples (:func:`eval_rows`' arguments); the task
    of every sample read, whichever group it belongs to, is added to ``tasks`` (so every rank ends
    with the same tasks)."""
    # every group reads every line: a bad line is reported by group 0 only, a bad sample by its own group
    bad_lines = skipped if shard == 0 else []
    files = _files(path)
    for f in files:
        if not f.is_file():
            raise SampleError(f"{f}: held-out data file (data.eval) not found")
    samples = itertools.chain.from_iterable(iter_jsonl(f, on_error=on_error, errors=bad_lines) for f in files)
    for j, sample in enumerate(samples):
        if max_samples is not None and j >= max_samples:
            break
        task = task_of(sample)
        tasks.setdefault(task, None)
        if j % num_shards != shard:
            continue
        try:
            enc = processor.encode(sample)
            if len(enc) > max_tokens:
                raise SampleError(f"{sample.where}: held-out sample has {len(enc)} tokens, more than data.max_tokens={max_tokens}")
        except SampleError as exc:
            if on_error != "skip":
                raise
            skipped.append(str(exc))
            continue
        yield task, enc


def _pack(
    items: Iterable[tuple[str, Encoded]], max_tokens: int, by_task: bool, window: int, method: str
) -> Iterator[tuple[str | None, list[Encoded]]]:
    """``items`` packed into rows by training's packer (:func:`pack_rows`, ``window`` samples at a
    time): ``(None, row)``, or with ``by_task`` ``(task, row)`` with a window per task, each packed
    when full and the rest at the end (in order of the tasks' first samples)."""
    if not by_task:
        yield from ((None, row) for row in pack_rows((enc for _, enc in items), max_tokens, window=window, method=method))
        return
    pending: dict[str, list[Encoded]] = {}  # insertion order: the tasks' first samples
    for task, enc in items:
        pending.setdefault(task, []).append(enc)
        if len(pending[task]) == window:
            yield from ((task, row) for row in pack_rows(pending.pop(task), max_tokens, window=window, method=method))
    for task, rest in pending.items():
        yield from ((task, row) for row in pack_rows(rest, max_tokens, window=window, method=method))


def _first_sample(path: Paths, processor: ChatProcessor) -> list[Encoded]:
    """A filler row: the first sample of the held-out files that encodes."""
    for f in _files(path):
        for sample in iter_jsonl(f, on_error="skip"):
            with contextlib.suppress(SampleError):
                return [processor.encode(sample)]
    raise SampleError(f"{', '.join(map(str, _files(path)))}: no usable held-out sample")


Row = tuple[str | None, list[Encoded]]
"""A packed row and its task (None when rows are not packed by task)."""


def _next_row(rows: Iterator[Row], state: ParallelState) -> tuple[bool, Row | None]:
    """``(any rank has a row left, this rank's next row or None when its shard is done)``, from one
    all-reduce, so that every rank leaves the loop at the same round.

    Raises:
        SampleError: this rank's data failed (its own message), or another rank's (naming it).
    """
    row, error = None, None
    try:
        row = next(rows, None)
    except SampleError as exc:
        error = exc
    has, failed = state.all_reduce_sums([0.0 if row is None else 1.0, 0.0 if error is None else 1.0])
    if failed:
        if error is not None:
            raise error
        raise SampleError(f"{failed:.0f} rank(s) stopped on a bad held-out sample (see that rank's error); rank {state.rank} stops too")
    return bool(has), row


@dataclass
class _Tally:
    """One rank's running loss sums and target counts: per part (``text``, ``decoder.<m>``) and,
    for rows packed by task, per task (with its sample count)."""

    parts: list[str]
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    tasks: dict[str, list[float]] = field(default_factory=dict)  # task -> [loss sum, targets, samples]
    samples: int = 0

    def add(self, out: Any, task: str | None, n_samples: int) -> None:
        """Add one counted forward's output (a :class:`~omnicore.model.omni.ModelOutput`) of a row
        of ``n_samples`` samples."""
        dec = out.decoder_targets or {}
        text = float(out.text_loss_sum)
        self.sums["text"] = self.sums.get("text", 0.0) + text
        self.counts["text"] = self.counts.get("text", 0.0) + out.n_targets - sum(dec.values())
        total = text
        for m, v in out.decoder_loss_sums.items():
            self.sums[f"decoder.{m}"] = self.sums.get(f"decoder.{m}", 0.0) + float(v)
            self.counts[f"decoder.{m}"] = self.counts.get(f"decoder.{m}", 0.0) + dec[m]
            total += float(v)
        self.samples += n_samples
        if task is not None:
            t = self.tasks.setdefault(task, [0.0, 0.0, 0.0])
            t[0], t[1], t[2] = t[0] + total, t[1] + out.n_targets, t[2] + n_samples


def heldout_loss(
    model: torch.nn.Module,
    processor: ChatProcessor,
    path: Paths,
    max_tokens: int,
    *,
    state: ParallelState | None = None,
    data_rank: int = 0,
    data_size: int = 1,
    max_samples: int | None = None,
    on_error: str = "raise",
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    device: torch.device | None = None,
    by_task: bool = False,
    window: int = 1024,
    method: str = "first_fit",
    errors: list[str] | None = None,
) -> dict[str, Any]:
    """The held-out loss of ``model`` on ``path`` (module docstring), the same on every rank.

    Args:
        model: an :class:`~omnicore.model.omni.OmniModel`, possibly wrapped by the parallel strategies.
        processor: the run's :class:`ChatProcessor`.
        path: the held-out JSONL, or several read one after the other (:func:`eval_files`).
        state: the parallel state (None: one process); every rank of it must call this together.
        data_rank, data_size: this rank's data group and the number of groups (training's split).
        autocast: the forward's autocast context factory (training's, for bf16 mixed precision).
        device: where the inputs go (the run's device; None: that of the model's first parameter,
            which is wrong for parameters offloaded to the CPU).
        by_task: also the loss of each task (rows packed per task, module docstring).
        window, method: training's packing (``data.packing_window``, ``data.packing``).
        errors: with ``on_error: skip``, the ``FILE:LINE: why`` of each sample this rank skipped is
            appended to it (bad lines on data group 0, samples that cannot be encoded on their own
            group), for the caller to name them; ``val_skipped`` counts every rank's.

    Returns:
        ``{"val_loss", "val_loss/text", "val_loss/decoder.<m>"..., "val_targets", "val_samples",
        "val_skipped"}``; ``val_loss`` is NaN when the set has no target. With ``by_task``, per
        task of the samples read (sorted): ``"val_loss/task/<task>"`` (left out when the task has
        no target), ``"val_targets/task/<task>"``, ``"val_samples/task/<task>"``.

    Raises:
        SampleError: as :func:`eval_rows`, on every rank together.
    """
    state = state or ParallelState(0, 1, 0, torch.device("cpu"))
    path = _files(path)
    skipped: list[str] = [] if errors is None else errors
    already = len(skipped)
    tasks: dict[str, None] = {}
    items = _encoded(path, processor, max_tokens, data_rank, data_size, max_samples, on_error, skipped, tasks)
    tally = _Tally(model.loss_parts())
    modes = [(m, m.training) for m in model.modules()]  # restored exactly: frozen parts may stay in eval mode
    model.eval()
    try:
        with torch.no_grad():
            rows = _pack(items, max_tokens, by_task, window, method)
            _forward_rows(model, processor, rows, path, state, device or next(model.parameters()).device, autocast, tally)
    finally:
        for m, training in modes:
            m.training = training
    return _totals(state, tally, sorted(tasks) if by_task else [], len(skipped) - already, data_size)


def _forward_rows(
    model: torch.nn.Module,
    processor: ChatProcessor,
    rows: Iterator[Row],
    path: Paths,
    state: ParallelState,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    tally: _Tally,
) -> None:
    """One forward per round on every rank (a filler row where this rank's shard is done), adding
    the counted rows' loss sums, target counts and samples into ``tally``."""
    filler = None
    while True:
        more, item = _next_row(rows, state)
        if not more:
            return
        counted = item is not None
        if item is None:  # keep the collectives in step with the ranks that still have rows
            item = filler or (None, _first_sample(path, processor))
        filler = item
        task, row = item
        mb = collate(row, processor.encoders, processor.decoders, decoder_keys=getattr(model, "code_cache", None) is not None)
        with autocast():
            out = model(to_device(mb, device))
        if counted:
            tally.add(out, task, len(row))


def _totals(state: ParallelState, tally: _Tally, tasks: list[str], skipped: int, data_size: int) -> dict[str, Any]:
    """All-reduce the per-part and per-task sums and counts (and the sample counts), by name in one
    collective, into the result row; ``tasks`` (the same list on every rank) are those to report."""
    replicas = state.world_size // max(data_size, 1)  # ranks that read the same rows count their samples alike
    parts = tally.parts
    local = {f"loss_sum/{k}": tally.sums.get(k, 0.0) for k in parts}
    local.update({f"targets/{k}": tally.counts.get(k, 0.0) for k in parts})
    local.update(samples=float(tally.samples), skipped=float(skipped))
    for t in tasks:
        loss_sum, targets, samples = tally.tasks.get(t, [0.0, 0.0, 0.0])
        local.update({f"task/{t}/loss_sum": loss_sum, f"task/{t}/targets": targets, f"task/{t}/samples": samples})
    total = state.all_reduce_named(local)
    part_sums = {k: total[f"loss_sum/{k}"] for k in parts}
    part_counts = {k: total[f"targets/{k}"] for k in parts}
    n_all = sum(part_counts.values())
    out: dict[str, Any] = {"val_loss": sum(part_sums.values()) / n_all if n_all else math.nan}
    out.update({f"val_loss/{k}": part_sums[k] / part_counts[k] for k in parts if part_counts[k]})
    out.update(val_targets=int(round(n_all)), val_samples=int(round(total["samples"] / replicas)))
    out["val_skipped"] = int(round(total["skipped"] / replicas))
    for t in tasks:
        targets = total[f"task/{t}/targets"]
        if targets:
            out[f"val_loss/task/{t}"] = total[f"task/{t}/loss_sum"] / targets
        out[f"val_targets/task/{t}"] = int(round(targets))
        out[f"val_samples/task/{t}"] = int(round(total[f"task/{t}/samples"] / replicas))
    return out


def heldout_loss_of(cfg: Config, model: Any, processor: ChatProcessor, *, by_task: bool = False) -> dict[str, Any]:
    """The held-out loss of a loaded model on ``data.eval``, as validation during training computes
    it (:func:`heldout_loss`: the same samples, ``eval.max_samples``
    included, packing budget, autocast and normalisation), on one process; comparable with the
    ``"split": "val"`` rows of ``metrics.jsonl``. Returns ``{"loss", "loss/text",
    "loss/decoder.<m>"..., "loss_targets"}`` (a part without targets is left out); with
    ``by_task`` (rows packed per task, same pass) also ``"tasks": {task: {"loss", "loss_targets",
    "loss_samples"}}``, sorted by task: the loss per target of that task's samples alone (``"loss"``
    left out for a task without targets).

    Raises:
        SampleError: a bad held-out sample (``FILE:LINE: ...``) when ``data.on_error`` is ``raise``.
        ConfigError: ``data.eval`` names no file (:func:`eval_files`).
    """
    device = next(model.parameters()).device
    bf16 = cfg.train.mixed_precision == "bf16"
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    path = eval_files(cfg)
    figures = heldout_loss(model, processor, path, cfg.data.max_tokens, max_samples=cfg.eval.max_samples, on_error=cfg.data.on_error,
                           autocast=autocast, by_task=by_task, window=cfg.data.packing_window, method=cfg.data.packing)  # fmt: skip
    out: dict[str, Any] = {k[4:]: v for k, v in figures.items() if k.startswith("val_loss") and not k.startswith("val_loss/task/")}
    out["loss_targets"] = figures["val_targets"]
    if by_task:
        out["tasks"] = {}
        for t in sorted(k[len("val_targets/task/") :] for k in figures if k.startswith("val_targets/task/")):
            loss = {"loss": figures[f"val_loss/task/{t}"]} if f"val_loss/task/{t}" in figures else {}
            out["tasks"][t] = {**loss, "loss_targets": figures[f"val_targets/task/{t}"], "loss_samples": figures[f"val_samples/task/{t}"]}
    return out
