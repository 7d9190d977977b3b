"""``omnicore plan CONFIG --world-size N``: check a parallel layout and size it, without processes.

No process group starts: the model is built on the meta device (shapes, no memory), the mesh is the
pure-Python :class:`~omnicore.parallel.mesh.MeshLayout`, and each strategy answers ``validate``
and ``plan`` (see :mod:`omnicore.parallel.parallelize`). The report lists the mesh and its groups,
which strategy wraps which modules, trainable and frozen parameters (``train.freeze``), per-rank
parameter memory and the gradient and AdamW memory of the trainable parameters, the model FLOPs of
a step per part (:func:`add_flops`), each data rank's encoder FLOPs of step 1 as the data puts them
and as a balancing strategy would assign them (:func:`add_encoder_costs`), and every violated
constraint with the config field to change.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omnicore.parallel.mesh import FLAT_DIMS, MESH_DIMS, MeshLayout, layout_errors
from omnicore.parallel.parallelize import StrategyPlan, Violation, build_strategies, data_split, phase_of, validate

ADAMW_STATES = 2
"""AdamW keeps two states (exp_avg, exp_avg_sq) per trainable parameter element, in the parameter's
dtype (``torch.optim.AdamW`` makes them with ``zeros_like(param)``): 8 bytes for fp32 parameters
(``train.mixed_precision: bf16`` included), 4 for ``run.dtype: bfloat16``."""

PLAN_WINDOW = 64
"""``omnicore plan`` packs its step of data from the first this many samples of each shard (training
packs ``data.packing_window``): enough to fill rows, cheap to read."""

MAX_GROUP_LISTING = 16
"""Print which ranks form which groups only up to this world size."""

MAX_COST_RANKS = 16
"""``omnicore plan`` reads step 1 of at most this many data ranks (the first ones) for the per-rank
encoder FLOPs (:func:`add_encoder_costs`): each is a read of its own shards."""


@dataclass
class EncoderCosts:
    """One encoder modality's FLOPs (forward + backward) of step 1 per data rank (:func:`add_encoder_costs`).

    Attributes:
        own: per data rank read, the FLOPs of encoding the items its own micro-batches hold (as the
            data puts them); None: the encoder cannot be counted on the meta device.
        balanced: per data rank, the FLOPs as ``by`` (a strategy with ``plan_encoder_costs``)
            would assign the items; None when no configured strategy moves this modality's items.
        by: the strategy behind ``balanced``.
        note: why ``own`` or ``balanced`` is missing, when one is.
    """

    own: list[float] | None
    balanced: list[float] | None = None
    by: str = ""
    note: str = ""


def spread(loads: list[float]) -> float:
    """``max / mean`` of per-rank loads; 1.0 when they are all zero (or there are none)."""
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean > 0 else 1.0


@dataclass
class PlanReport:
    """The result of :func:`make_plan`; :meth:`render` is what ``omnicore plan`` prints."""

    world_size: int
    layout: MeshLayout
    layout_ok: bool
    strategies: list[tuple[str, str, StrategyPlan | None]] = field(default_factory=list)  # name, phase, plan
    params: int = 0
    trainable_params: int = 0
    """Elements that train (``requires_grad`` after LoRA and ``train.freeze``); ``params`` counts all."""
    param_bytes_per_rank: int = 0
    frozen_param_bytes_per_rank: int = 0
    """The part of ``param_bytes_per_rank`` held by frozen parameters."""
    grad_bytes_per_rank: int = 0
    """Gradients of the trainable parameters (in their parameters' dtype); frozen ones have none."""
    optimizer_bytes_per_rank: int = 0
    """AdamW's two states of the trainable parameters (in their parameters' dtype); frozen ones have none."""
    total_param_bytes: int = 0
    violations: list[Violation] = field(default_factory=list)
    data: list[tuple[int, int]] = field(default_factory=list)
    """Per rank (up to :data:`MAX_GROUP_LISTING` ranks): ``(index, count)`` of the data group it
    reads, from the strategies' ``data_split`` (:func:`omnicore.parallel.parallelize.data_split`)."""
    kernels: dict[str, str] = field(default_factory=dict)
    """op -> kernel name (the ops a config sets, plus the attention and cross_entropy defaults)."""
    precision: str = "float32"
    flops: dict[str, float | None] = field(default_factory=dict)
    """Model FLOPs (forward + backward) of one step of one data group, per part (``foundation``,
    ``encoder.<m>``, ``decoder.<m>``; None: a part that cannot be counted on the meta device, it
    is measured in training); see :attr:`flops_basis` for the batch they are of."""
    flops_basis: str = ""
    """What :attr:`flops` counts: rank 0's first step of the configured data, or, when the data
    cannot be read, the token budget (foundation) and one dummy item (encoders and decoders)."""
    flops_from_data: bool = False
    """Whether :attr:`flops` are of a step of the configured data (else: the budget, dummy items)."""
    flops_note: str = ""
    """How the foundation is counted (weights per token; MoE experts)."""
    parts: dict[str, list[int]] = field(default_factory=dict)
    """Per part of the model, ``[parameters, trainable parameters, bytes per rank]`` (the bytes are
    parameters, gradients and AdamW states): a published family's part names
    (``Foundation.part_names``; a parameter goes to its longest matching prefix) or else ``lm``,
    ``encoders.<m>`` and ``decoders.<m>``."""
    encoder_costs: dict[str, EncoderCosts] = field(default_factory=dict)
    """Encoder modality -> its FLOPs of step 1 per data rank, own and balanced
    (:func:`add_encoder_costs`); empty with one data rank, without encoders, or when the data
    cannot be read (then :attr:`encoder_costs_basis` says why)."""
    encoder_costs_basis: str = ""
    """Which data ranks :attr:`encoder_costs` are of, or why there are none."""
    data_ranks: int = 1
    """Data ranks (groups that read different micro-batches) of the planned layout."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "mesh": dict(self.layout.sizes),
            "strategies": [
                {"name": n, "phase": ph, "modules": p.modules if p else None, "note": p.note if p else ""} for n, ph, p in self.strategies
            ],
            "params": self.params,
            "trainable_params": self.trainable_params,
            "frozen_params": self.params - self.trainable_params,
            "param_bytes_per_rank": self.param_bytes_per_rank,
            "frozen_param_bytes_per_rank": self.frozen_param_bytes_per_rank,
            "grad_bytes_per_rank": self.grad_bytes_per_rank,
            "optimizer_bytes_per_rank": self.optimizer_bytes_per_rank,
            "violations": [{"field": v.field, "message": v.message, "source": v.source} for v in self.violations],
            "kernels": dict(self.kernels),
            "precision": self.precision,
            "parts": {k: {"params": v[0], "trainable_params": v[1], "bytes_per_rank": v[2]} for k, v in self.parts.items()},
            "flops": {
                "per_part": dict(self.flops),
                "basis": self.flops_basis,
                "from_data": self.flops_from_data,
                "foundation": self.flops_note,
            },
            "encoder_costs": {
                "basis": self.encoder_costs_basis,
                "data_ranks": self.data_ranks,
                "ranks_read": len(next((c.own for c in self.encoder_costs.values() if c.own is not None), [])),
                "per_modality": {
                    m: {
                        "own": c.own,
                        "own_spread": spread(c.own) if c.own is not None else None,
                        "balanced": c.balanced,
                        "balanced_spread": spread(c.balanced) if c.balanced is not None else None,
                        "balanced_by": c.by or None,
                        "note": c.note,
                    }
                    for m, c in self.encoder_costs.items()
                },
            },
            "ok": self.ok,
        }

    def render(self) -> str:
        L = self.layout
        out = [f"mesh: {L.describe()}"]
        if self.layout_ok:
            for d in MESH_DIMS + tuple(FLAT_DIMS):
                parts = " x ".join(FLAT_DIMS.get(d, (d,)))
                line = f"  {d:<13} size {L.size(d)}" + (f"  (= {parts})" if d in FLAT_DIMS else "")
                if self.world_size <= MAX_GROUP_LISTING:
                    line += "  groups " + " ".join("[" + ",".join(map(str, g)) + "]" for g in L.groups(d))
                out.append(line)
            if self.data:
                count = self.data[0][1]
                out.append(f"  data: {count} shard(s); " + ", ".join(f"rank {r} reads shard {i}" for r, (i, _) in enumerate(self.data)))
        out.append("strategies (in the order applied):")
        for name, phase, p in self.strategies:
            if p is None:
                out.append(f"  {name} [{phase}]: no plan (applies to the whole model)")
                continue
            mods = ", ".join(p.modules[:8]) + (f", ... ({len(p.modules)} in all)" if len(p.modules) > 8 else "")
            out.append(f"  {name} [{phase}]: {p.note}" + (f"; wraps {mods}" if p.modules else ""))
        if self.kernels:
            out.append("kernels: " + ", ".join(f"{op}={k}" for op, k in self.kernels.items()) + f"; precision: {self.precision}")
        if self.layout_ok:
            out.extend(self._memory_lines())
        if self.flops:
            out.extend(self._flops_lines())
        if self.encoder_costs or self.encoder_costs_basis:
            out.extend(self._encoder_cost_lines())
        if self.violations:
            out.append(f"{len(self.violations)} violated constraint(s):")
            out.extend(f"  {v}" for v in self.violations)
        else:
            out.append("ok: no violated constraints")
        return "\n".join(out)

    def _memory_lines(self) -> list[str]:
        frozen = self.params - self.trainable_params
        share = 100.0 * self.trainable_params / self.params if self.params else 0.0
        return [
            f"parameters: {self.params:,} ({_fmt(self.total_param_bytes)} unsharded); trainable {self.trainable_params:,} ({share:.1f}%), "
            f"frozen {frozen:,}",
            f"memory per rank: parameters {_fmt(self.param_bytes_per_rank)} (frozen {_fmt(self.frozen_param_bytes_per_rank)}), "
            f"gradients of the trainable parameters {_fmt(self.grad_bytes_per_rank)}, AdamW states of the trainable parameters "
            f"{_fmt(self.optimizer_bytes_per_rank)}",
        ] + [
            f"  {name}: {n:,} parameters (trainable {t:,}); per rank {_fmt(b)} with gradients and AdamW states"
            for name, (n, t, b) in self.parts.items()
        ]

    def _flops_lines(self) -> list[str]:
        if not self.flops_from_data:  # the budget's foundation and one dummy item each: no step total, no shares
            out = [f"model FLOPs, forward + backward ({self.flops_basis}); foundation {self.flops_note}"]
            for part, v in self.flops.items():
                what = "per step" if part == "foundation" else "per dummy item"
                out.append(
                    f"  {part}: " + (f"{v:.3g} {what}" if v is not None else "not countable on the meta device; measured in training")
                )
            return out
        known = sum(v for v in self.flops.values() if v is not None)
        out = [f"model FLOPs per step, forward + backward ({self.flops_basis}): {known:.3g}; foundation {self.flops_note}"]
        for part, v in self.flops.items():
            share = f" ({100 * v / known:.1f}%)" if v is not None and known > 0 else ""
            out.append(f"  {part}: " + (f"{v:.3g}{share}" if v is not None else "not countable on the meta device; measured in training"))
        return out

    def _encoder_cost_lines(self) -> list[str]:
        if not self.encoder_costs:
            return [f"encoder FLOPs of step 1 per data rank: {self.encoder_costs_basis}"]
        out = [f"encoder FLOPs of step 1 per data rank, forward + backward ({self.encoder_costs_basis})"]
        for m, c in self.encoder_costs.items():
            if c.own is None or not any(c.own):
                out.append(f"  encoder.{m}: {c.note or 'no items in step 1'}")
                continue
            cols = [("own", c.own)] + ([("balanced", c.balanced)] if c.balanced is not None else [])
            head = f"  {'encoder.' + m:<16}" + "".join(f"{name:>11}" for name, _ in cols)
            if c.balanced is not None:
                head += f"   (balanced: as {c.by} would assign the items, micro-step by micro-step)"
            elif c.note:
                head += f"   ({c.note})"
            out.append(head)
            for r in range(len(c.own)):
                out.append(f"    {'rank ' + str(r):<14}" + "".join(f"{v[r]:>11.3g}" for _, v in cols))
            out.append(f"    {'max / mean':<14}" + "".join(f"{spread(v):>11.2f}" for _, v in cols))
        return out


def _fmt(n: int) -> str:
    return f"{n:,} B ({n / 2**20:.2f} MiB)"


def _per_rank_numel(shape: tuple[int, ...], splits: list[int]) -> int:
    """Elements one rank holds after dim 0 is split ``ways`` for each of ``splits`` in turn (FSDP2
    and ``Shard(0)`` pad the last chunk, so a rank holds ``ceil(dim0 / ways)`` rows)."""
    if not shape:
        return 1
    d0 = shape[0]
    for ways in splits:
        d0 = math.ceil(d0 / ways)
    return d0 * math.prod(shape[1:])


def _planned_layout(parallel: Any, world_size: int) -> tuple[MeshLayout, list[tuple[str, str]]]:
    raw = {d: int(getattr(parallel, d)) for d in MESH_DIMS}
    errors = layout_errors(raw, world_size)
    if not errors:
        return MeshLayout.from_config(parallel, world_size), []
    # still check the model against the sizes that were given (-1 read as 1)
    return MeshLayout(world_size, {d: (v if v > 0 else 1) for d, v in raw.items()}), errors


def make_plan(cfg: Any, world_size: int, registry: Any = None) -> PlanReport:
    """Check and size ``cfg``'s parallel layout on ``world_size`` ranks (no process group).

    Raises:
        RegistryError: a component or strategy cannot be resolved.
        ConfigError: a ``train.freeze`` or ``model.lora`` entry matches nothing, or nothing would train.
    """
    import torch

    from omnicore.model.build import build_omni_model
    from omnicore.model.lora import apply_lora
    from omnicore.model.trainable import apply_freeze
    from omnicore.parallel.state import ParallelState
    from omnicore.registry import registry_for

    registry = registry or registry_for(cfg)
    layout, errors = _planned_layout(cfg.parallel, world_size)
    report = PlanReport(world_size, layout, not errors)
    report.kernels = {op: c.name for op, c in cfg.model.kernel_choices().items()}
    report.kernels.setdefault("cross_entropy", "torch_cross_entropy")
    report.precision = (
        "bf16 mixed (fp32 parameters, gradient reductions and optimizer)" if cfg.train.mixed_precision == "bf16" else cfg.run.dtype
    )
    report.violations += [Violation(f, m) for f, m in errors]
    state = ParallelState(0, world_size, 0, torch.device("meta"), None, layout)
    strategies = build_strategies(cfg.parallel, registry, world_size > 1)
    with torch.device("meta"), warnings.catch_warnings():
        # loading checkpoints into meta tensors is a deliberate no-op here; torch warns per tensor
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
        model, tokenizer = build_omni_model(cfg, registry)
        apply_lora(model, cfg.model.lora)  # as the training set-up does: LoRA, then freeze, then the strategies
    apply_freeze(model, cfg.train.freeze)
    report.violations += validate(model, state, strategies)
    if not errors and world_size <= MAX_GROUP_LISTING:
        # data_split is a function of the state: ask it for every rank of the planned layout
        report.data = [
            data_split(strategies, ParallelState(r, world_size, 0, torch.device("meta"), None, layout)) for r in range(world_size)
        ]

    prior: dict[str, list[tuple[str, int]]] = {}
    for name, s in strategies:
        p = s.plan(model, state, prior) if hasattr(s, "plan") else None
        report.strategies.append((name, phase_of(s), p))
        for pname, split in p.shards.items() if p else ():
            prior.setdefault(pname, []).append(split)
    _add_memory(report, model, prior)
    add_flops(report, cfg, model, tokenizer, registry, data_split(strategies, state)[1] if not errors else 1, strategies)
    return report


def part_of(name: str, parts: dict[str, list[str]]) -> str:
    """The part a parameter belongs to: the family part (``parts``: name -> module prefixes) with
    the longest prefix of ``name``, else its top-level component (``lm``, ``encoders.image``)."""
    best, depth = "", -1
    for part, prefixes in parts.items():
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = part, len(prefix)
    if best:
        return best
    head = name.split(".")
    return ".".join(head[:2]) if head[0] in ("encoders", "decoders") else head[0]


def _add_memory(report: PlanReport, model: Any, prior: dict[str, list[tuple[str, int]]]) -> None:
    """Add each parameter's elements and per-rank bytes to ``report``: parameters all, gradients
    and AdamW states (:data:`ADAMW_STATES` per element, in the parameter's dtype) for the trainable
    ones only: a frozen parameter has neither. Also per part (:func:`part_of`)."""
    from omnicore.model.trainable import clean_name

    families = getattr(model, "part_names", None) or {}
    for pname, param in model.named_parameters():
        n_rank = _per_rank_numel(tuple(param.shape), [w for _, w in prior.get(pname, [])])
        row = report.parts.setdefault(part_of(clean_name(pname), families), [0, 0, 0])
        row[0] += param.numel()
        row[1] += param.numel() if param.requires_grad else 0
        row[2] += n_rank * param.element_size() * ((2 + ADAMW_STATES) if param.requires_grad else 1)
        report.params += param.numel()
        report.total_param_bytes += param.numel() * param.element_size()
        report.param_bytes_per_rank += n_rank * param.element_size()
        if param.requires_grad:
            report.trainable_params += param.numel()
            report.grad_bytes_per_rank += n_rank * param.element_size()
            report.optimizer_bytes_per_rank += n_rank * ADAMW_STATES * param.element_size()
        else:
            report.frozen_param_bytes_per_rank += n_rank * param.element_size()


def add_flops(
    report: PlanReport, cfg: Any, model: Any, tokenizer: Any, registry: Any, data_size: int, strategies: Sequence[tuple[str, Any]] = ()
) -> None:
    """Fill ``report.flops``: each part's model FLOPs (:mod:`omnicore.model.flops`) for one step of
    one data group. The batch is a step of data group 0 of the configured data, read here in this
    process (no workers, a short packing window: :data:`PLAN_WINDOW`): the foundation by formula over its samples, each encoder
    and decoder counted on the meta device on its real collated inputs. When the data cannot be
    read (the file is elsewhere), the foundation is counted on the token budget (``train.grad_accum``
    rows of ``data.max_tokens``, one sample each: attention's upper bound) and each encoder and
    decoder on one dummy item. With several data groups (``data_size``) step 1 of each of the
    first :data:`MAX_COST_RANKS` is read too, for :func:`add_encoder_costs` (``strategies``: the
    built ``(name, strategy)`` pairs, asked for their ``plan_encoder_costs``)."""
    from omnicore.model.flops import FOUNDATION, model_flops

    fm = model_flops(model)
    count = MetaFlops(model)
    report.flops_note = fm.foundation.describe()
    report.data_ranks = data_size
    ranks = min(data_size, MAX_COST_RANKS) if data_size > 1 and model.token_ids["encoder"] else 1
    steps, why = _first_steps(cfg, model, tokenizer, registry, data_size, ranks)
    if not steps:
        budget = cfg.data.max_tokens
        report.flops_basis = (
            f"data not read ({why}): {cfg.train.grad_accum} row(s) of {budget} tokens, one dummy item per encoder and decoder"
        )
        report.flops[FOUNDATION] = cfg.train.grad_accum * fm.foundation.step_flops([budget])
        report.flops.update({p: _meta_or_none(model, p, None) for p in fm.parts()[1:]})
        if ranks > 1:
            report.encoder_costs_basis = "not counted: the data was not read (above)"
        return
    micro = steps[0]
    report.flops_from_data = True
    report.flops_basis = (
        f"one step of data group 0 packed from the first {min(cfg.data.packing_window, PLAN_WINDOW)} samples of each shard: "
        f"{len(micro)} micro-batch(es), {sum(mb.num_tokens for mb in micro)} tokens"
    )
    report.flops[FOUNDATION] = sum(fm.estimate(mb)[FOUNDATION] for mb in micro)
    for part in fm.parts()[1:]:
        kind, modality = part.split(".", 1)
        batches = [(mb.encoder_inputs if kind == "encoder" else mb.decoder_inputs).get(modality) for mb in micro]
        try:
            report.flops[part] = float(sum(count(part, b) for b in batches))
        except Exception:  # noqa: BLE001 - a component whose code needs values (not shapes); training measures it
            report.flops[part] = None
    if ranks > 1:
        if len(steps) < ranks:
            report.encoder_costs_basis = f"not counted: data rank {len(steps)} could not be read ({why})"
        else:
            add_encoder_costs(report, model, steps, strategies, count)


class MetaFlops:
    """:func:`omnicore.model.flops.meta_part_flops` with a memo: ``count(part, batch)`` is the
    FLOPs (forward + backward) of one encoder or decoder part on a collated batch, 0.0 for None.
    On the meta device only shapes count, so batches whose tensors have the same shapes and dtypes
    (and equal other values) share one count; a component with its own ``flops`` is asked each
    time (it may read values).

    Raises:
        Exception: what the component raises on meta tensors (see ``meta_part_flops``).
    """

    def __init__(self, model: Any):
        self.model = model
        self.memo: dict[tuple[str, Any], float] = {}

    def __call__(self, part: str, batch: Any) -> float:
        from omnicore.model.flops import meta_part_flops

        if batch is None:
            return 0.0
        kind, modality = part.split(".", 1)
        m = self.model
        module = m.decoders[modality] if kind == "decoder" else m.encoders[m.shared[modality][0] if modality in m.shared else modality]
        if getattr(module, "flops", None) is not None:
            return float(meta_part_flops(m, part, batch))
        key = (part, _shapes(batch))
        if key not in self.memo:
            self.memo[key] = float(meta_part_flops(m, part, batch))
        return self.memo[key]


def _shapes(x: Any) -> Any:
    """A hashable key of ``x`` for :class:`MetaFlops`: tensors (torch or numpy) by type, shape and
    dtype, containers by structure, anything else by ``repr``."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return (type(x).__name__, tuple(x.shape), str(x.dtype))
    if isinstance(x, dict):
        return ("dict", tuple((repr(k), _shapes(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_shapes(v) for v in x))
    return repr(x)


def add_encoder_costs(
    report: PlanReport, model: Any, steps: list[list[Any]], strategies: Sequence[tuple[str, Any]], count: MetaFlops | None = None
) -> None:
    """Fill ``report.encoder_costs``: per encoder modality, each data rank's encoder FLOPs (forward
    + backward) of step 1 (``steps[r]``: data rank ``r``'s micro-batches), counted on the meta
    device as :func:`add_flops` counts rank 0's (:class:`MetaFlops`; ``count``: one to share).

    ``own``: each rank's own items, micro-batch by micro-batch. ``balanced``: what the first
    strategy (in the order applied) with an answering ``plan_encoder_costs``
    (:class:`omnicore.components.ParallelStrategyOptional`) gives, asked once per micro-step with
    every rank's batch of that micro-step, as its encoder hook sees them at run time; the sum over
    the micro-steps. A strategy that raises, or answers with another number of values than ranks,
    is reported in the modality's note, not raised: the rest of the plan stands."""
    count = count or MetaFlops(model)
    ranks, data_size = len(steps), report.data_ranks
    report.encoder_costs_basis = (
        f"the {data_size} data ranks"
        if ranks == data_size
        else (f"the first {ranks} of {data_size} data ranks: the plan reads at most {MAX_COST_RANKS}; balanced over these {ranks} only")
    )
    report.encoder_costs_basis += f", {len(steps[0])} micro-batch(es) each; own: each rank's items, as the data puts them"
    members = [(name, getattr(s, "plan_encoder_costs", None)) for name, s in strategies]
    members = [(name, fn) for name, fn in members if callable(fn)]
    processors = model.encoder_processors()
    for m in model.token_ids["encoder"]:
        part = f"encoder.{m}"
        module = model.encoders[model.shared[m][0] if m in model.shared else m]

        def flops(batch: Any, part: str = part) -> float:
            return count(part, batch)

        micro_steps = [[mbs[k].encoder_inputs.get(m) if k < len(mbs) else None for mbs in steps] for k in range(max(map(len, steps)))]
        try:
            own_steps = [[flops(b) for b in batches] for batches in micro_steps]
        except Exception as exc:  # noqa: BLE001 - a component whose code needs values (not shapes)
            report.encoder_costs[m] = EncoderCosts(None, note=f"not countable on the meta device ({type(exc).__name__})")
            continue
        costs = EncoderCosts([sum(step[r] for step in own_steps) for r in range(ranks)])
        if not any(b is not None for batches in micro_steps for b in batches):
            costs.note = "no items in step 1"
            report.encoder_costs[m] = costs
            continue
        balanced: list[float] = [0.0] * ranks
        for batches, own in zip(micro_steps, own_steps):
            got, by, problem = _balanced(members, m, module, processors[m], batches, flops, ranks)
            if problem:
                costs.note, costs.by = problem, ""
                break
            if got is not None:
                costs.by = by
            balanced = [x + y for x, y in zip(balanced, got if got is not None else own)]
        else:
            costs.balanced = balanced if costs.by else None
        report.encoder_costs[m] = costs


def _balanced(
    members: list[tuple[str, Any]], modality: str, module: Any, processor: Any, batches: list[Any], flops: Any, ranks: int
) -> tuple[list[float] | None, str, str]:
    """``(per-rank FLOPs, strategy, "")`` from the first member that answers for one micro-step,
    ``(None, "", "")`` when none does, or ``(None, strategy, what went wrong)``."""
    for name, fn in members:
        try:
            got = fn(modality, module, processor, batches, flops)
        except Exception as exc:  # noqa: BLE001 - a strategy's plan must not stop the plan
            first = str(exc).splitlines()[0][:100] if str(exc) else ""
            return None, name, f"{name}: plan_encoder_costs raised {type(exc).__name__}: {first}"
        if got is None:
            continue
        if len(got) != ranks:
            return None, name, f"{name}: plan_encoder_costs gave {len(got)} values for {ranks} data ranks; ignored"
        return [float(v) for v in got], name, ""
    return None, "", ""


def _meta_or_none(model: Any, part: str, batch: Any) -> float | None:
    from omnicore.model.flops import meta_part_flops

    try:
        return meta_part_flops(model, part, batch)
    except Exception:  # noqa: BLE001 - a component whose code needs values (not shapes); training measures it
        return None


def _first_steps(cfg: Any, model: Any, tokenizer: Any, registry: Any, data_size: int, ranks: int) -> tuple[list[list[Any]], str]:
    """The micro-batches of step 1 of data ranks ``0 .. ranks - 1`` of ``data_size`` (read in this
    process, one after another), and why the list ends early (``""`` when it holds every rank)."""
    from omnicore.data.pipeline import DataPipeline
    from omnicore.model.build import open_data

    if not cfg.data.source_list():
        return [], "no data.train"
    steps: list[list[Any]] = []
    try:
        processor, sources = open_data(cfg, registry, tokenizer, rope=model.rope)
        d = cfg.data.model_copy(update={"num_workers": 0, "packing_window": min(cfg.data.packing_window, PLAN_WINDOW)})
        for r in range(ranks):
            data = DataPipeline(sources, processor, d, cfg.run.seed, data_rank=r, data_size=data_size, grad_accum=cfg.train.grad_accum)
            try:
                steps.append(data.step())
            finally:
                data.close(now=True)
        return steps, ""
    except Exception as exc:  # noqa: BLE001 - the plan stands without the data (a path on another machine)
        first = str(exc).splitlines()[0] if str(exc) else ""
        return steps, f"{type(exc).__name__}: {first[:100]}{'...' if len(first) > 100 else ''}"
