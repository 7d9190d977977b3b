"""The encoder hook: items out to the ranks that encode them, rows back to the ranks that own them.

At each encoder call (``OmniModel.register_encoder_hook``; every rank of the data-parallel group
calls it for every encoder module and modality, in the same order, whether its micro-batch holds
items of that modality or not):

1. **Items.** This rank's collated batch is cut into items (:func:`split_items`) and each item's
   cost and token count are computed (:func:`item_cost`).
2. **Plan.** One ``all_gather_object`` gives every rank every rank's item metadata (cost, tokens,
   tensor shapes and dtypes); :func:`~omnicore_parallel_encoder_balance.assign.assign` then decides,
   identically on every rank, who encodes what.
3. **Features out.** Each item's tensors travel as raw bytes in one ``all_to_all_single`` (uneven
   splits; the sizes are known from the metadata, so no count exchange is needed). No gradient.
4. **Encode.** Each rank collates the items assigned to it (in source-rank, then item order) and
   calls the encoder once, on them or, with none, on its dummy batch; FSDP2's all-gather per call
   stays in step on every rank.
5. **Rows back.** The output rows (with any rows for the foundation's intermediate layers, side by
   side) go back to the items' owners by :func:`omnicore.api.all_to_all`, a differentiable
   all-to-all whose backward sends the rows' gradients to the ranks that encoded them; the owner
   puts the rows in its items' order.

A rank whose micro-batch holds no item of the modality gets back ``[0, H]`` rows that are still in
the graph, and the model adds them, times 0, to its loss: its backward then joins the reverse
all-to-all, as every rank must. The backward runs the all-to-alls in the same order on every rank
because autograd runs the nodes of one graph in the reverse order of their creation, and every rank
creates them in the same order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from omnicore.api import ITEM_SEEDS, EncoderOutput, all_to_all, collate_items, input_units
from omnicore_parallel_encoder_balance.assign import Assignment, assign

logger = logging.getLogger(__name__)


# ---- items -------------------------------------------------------------------------------------


def split_items(processor: Any, batch: Any) -> list[dict[str, torch.Tensor]] | None:
    """The items of a collated ``batch``, each a ``dict[str, Tensor]`` that ``processor.collate``
    takes, or None when the batch cannot be cut so.

    A processor with a ``split(batch) -> list[features]`` member (the inverse of its ``collate``) is
    asked; otherwise a dict of tensors with one leading size ``B`` is cut into its ``B`` rows (what
    stacking processors such as SigLIP's and Whisper's collate). A training batch's item seeds
    (:data:`omnicore.api.ITEM_SEEDS`, which the processor never sees) go with their items, so an
    encoder's augmentation draws the same for an item wherever it is encoded. Either way the items
    must collate back to the very batch (:func:`omnicore.api.collate_items`, checked with
    ``torch.equal``), or the batch is not cut."""
    own = getattr(processor, "split", None)
    try:
        if callable(own):
            seeds = batch.get(ITEM_SEEDS) if isinstance(batch, dict) else None
            items = list(own({k: v for k, v in batch.items() if k != ITEM_SEEDS} if seeds is not None else batch))
            if seeds is not None:
                if len(items) != seeds.numel():
                    return None
                items = [{**it, ITEM_SEEDS: seed} for it, seed in zip(items, seeds.reshape(-1))]
        elif isinstance(batch, dict) and batch and all(isinstance(v, torch.Tensor) and v.dim() >= 1 for v in batch.values()):
            sizes = {v.shape[0] for v in batch.values()}
            if len(sizes) != 1:
                return None
            items = [{k: v[i] for k, v in batch.items()} for i in range(sizes.pop())]
        else:
            return None
        if not items or not all(isinstance(it, dict) and all(isinstance(v, torch.Tensor) for v in it.values()) for it in items):
            return None
        again = collate_items(processor, items)  # a training batch's item seeds travel with their items
    except Exception:  # noqa: BLE001 - a batch this rule cannot cut is encoded where it is
        return None
    if not isinstance(again, dict) or set(again) != set(batch):
        return None
    same = all(
        isinstance(again[k], torch.Tensor) and again[k].shape == batch[k].shape and torch.equal(again[k].to(batch[k].device), batch[k])
        for k in batch
    )
    return items if same else None


def item_cost(mode: str, module: Any, processor: Any, features: dict[str, torch.Tensor]) -> float:
    """The cost of one item (``mode``: the strategy's ``cost`` option). ``tokens`` is
    ``processor.num_tokens(features)``. ``elements`` is :func:`omnicore.api.input_units` of the
    item (its floating-point input elements: pixels x channels, mel bins x frames), the unit in
    which the core scales an encoder's measured FLOPs: ``ModelFlops.item_flops`` of an encoder
    without ``flops`` is a per-modality constant times it, and each call balances one modality, so
    the assignment is the one those FLOPs would give. ``auto`` is the encoder's own ``flops`` of
    the one-item batch when it has that member (what ``item_flops`` answers then), else
    ``elements``."""
    if mode == "tokens":
        return float(processor.num_tokens(features))
    own = getattr(module, "flops", None) if mode == "auto" else None
    if callable(own):
        return float(own(collate_items(processor, [features])))
    return float(input_units(features))


def planned_flops(
    cost: str, min_spread: float, module: Any, processor: Any, batches: list[Any], flops: Callable[[Any], float]
) -> list[float]:
    """Each rank's encoder FLOPs of one encoder call as :class:`BalanceHook` would distribute it,
    computed in one process (``omnicore plan``; the strategy's ``plan_encoder_costs``).

    ``batches[r]``: rank ``r``'s collated items of the call (None: none); ``flops(batch)``: the
    FLOPs of encoding a collated batch. The decisions are the hook's, made the same way: the
    batches cut by :func:`split_items` (a batch that cannot be cut keeps every rank's items where
    they are), each item costed by :func:`item_cost` in the ``cost`` unit, the items assigned by
    :func:`~omnicore_parallel_encoder_balance.assign.assign` with ``min_spread``, and each rank's
    assigned items collated in source-rank, then item order; a rank's figure is ``flops`` of
    that batch (0.0 with none), or of its own batch when nothing moves.
    """
    own = [flops(b) if b is not None else 0.0 for b in batches]
    items = [split_items(processor, b) if b is not None else [] for b in batches]
    if any(row is None for row in items):
        return own
    cut: list[list[dict[str, torch.Tensor]]] = [row or [] for row in items]
    plan = assign([[item_cost(cost, module, processor, it) for it in row] for row in cut], min_spread)
    if plan.moved == 0:
        return own
    assigned: list[list[dict[str, torch.Tensor]]] = [[] for _ in batches]
    for p, row in enumerate(cut):
        for i, it in enumerate(row):
            assigned[plan.dest[p][i]].append(it)
    return [flops(collate_items(processor, got)) if got else 0.0 for got in assigned]


# ---- moving features as bytes ------------------------------------------------------------------


def _spec(item: dict[str, torch.Tensor]) -> tuple[tuple[str, tuple[int, ...], torch.dtype], ...]:
    return tuple((k, tuple(item[k].shape), item[k].dtype) for k in sorted(item))


def _nbytes(spec: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]) -> int:
    total = 0
    for _, shape, dtype in spec:
        n = 1
        for s in shape:
            n *= s
        total += n * dtype.itemsize
    return total


def _as_bytes(item: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [item[k].detach().contiguous().reshape(-1).view(torch.uint8) for k in sorted(item)]


def _from_bytes(buf: torch.Tensor, spec: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for key, shape, dtype in spec:
        n = 1
        for s in shape:
            n *= s
        size = n * dtype.itemsize
        out[key] = buf[at : at + size].clone().view(dtype).reshape(shape)  # clone: aligned storage for view(dtype)
        at += size
    return out


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


# ---- the hook ------------------------------------------------------------------------------------


@dataclass
class _Meta:
    """What one rank tells the others about its items of one encoder call."""

    cuttable: bool
    costs: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    specs: list[Any] = field(default_factory=list)


@dataclass
class ModalityStats:
    """Running totals of one modality's encoder calls on this rank (the same on every rank of the
    group: they come from the gathered metadata).

    Attributes:
        calls: encoder calls balanced (training mode, items cut on every rank).
        local_calls: calls encoded where the items were (a batch could not be cut, or eval mode).
        items: items over all ranks; ``moved``: of those, encoded on another rank than their own.
        before: per rank, the summed cost of its own items; ``after``: of the items it encoded.
        spread_before: per call, max over mean of the ranks' own costs; ``spread_after``: as encoded.
    """

    calls: int = 0
    local_calls: int = 0
    items: int = 0
    moved: int = 0
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    spread_before: list[float] = field(default_factory=list)
    spread_after: list[float] = field(default_factory=list)

    def add(self, a: Assignment) -> None:
        from omnicore_parallel_encoder_balance.assign import spread

        self.calls += 1
        self.items += sum(len(d) for d in a.dest)
        self.moved += a.moved
        if not self.before:
            self.before, self.after = [0.0] * len(a.before), [0.0] * len(a.after)
        self.before = [x + y for x, y in zip(self.before, a.before)]
        self.after = [x + y for x, y in zip(self.after, a.after)]
        self.spread_before.append(spread(a.before))
        self.spread_after.append(spread(a.after))


class BalanceHook:
    """The encoder hook of ``encoder_balance`` (module docstring) over the process ``group``.

    Args:
        group: the data-parallel process group (ranks that hold different micro-batches).
        cost: ``auto``, ``elements`` or ``tokens`` (:func:`item_cost`).
        min_spread: move items only when the ranks' own costs are further apart than this
            (``max / mean``).
        modalities: the modalities balanced (None: all).
    """

    def __init__(self, group: Any, cost: str = "auto", min_spread: float = 1.0, modalities: list[str] | None = None):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.cost = cost
        self.min_spread = min_spread
        self.modalities = None if modalities is None else set(modalities)
        self.stats: dict[str, ModalityStats] = {}
        self._warned: set[str] = set()

    def __call__(self, model: Any, call: Any) -> Any:
        if not model.training or (self.modalities is not None and call.modality not in self.modalities):
            return call.encode(call.batch)
        items = split_items(call.processor, call.batch) if call.batch is not None else []
        mine = _Meta(items is not None)
        for it in items or []:
            mine.costs.append(item_cost(self.cost, call.module, call.processor, it))
            mine.tokens.append(int(call.processor.num_tokens(it)))
            mine.specs.append(_spec(it))
        metas: list[Any] = [None] * self.size
        dist.all_gather_object(metas, mine, group=self.group)
        stats = self.stats.setdefault(call.modality, ModalityStats())
        if not all(m.cuttable for m in metas):
            self._warn_once(call.modality, [r for r, m in enumerate(metas) if not m.cuttable])
            stats.local_calls += 1
            return call.encode(call.batch)
        plan = assign([m.costs for m in metas], self.min_spread)
        stats.add(plan)
        if sum(len(m.costs) for m in metas) == 0:  # no rank holds this modality: every rank runs its dummy pass
            return call.encode(None)
        if plan.moved == 0:
            return call.encode(call.batch)
        return self._exchange(call, items or [], metas, plan)

    def _warn_once(self, modality: str, ranks: list[int]) -> None:
        if modality not in self._warned:
            self._warned.add(modality)
            logger.warning(
                "encoder_balance: the %s batches of rank(s) %s cannot be cut into items that collate back to the batch; their %s "
                "items are encoded where they are (give the processor a split(batch) member)",
                modality,
                ranks,
                modality,
            )

    def _exchange(self, call: Any, items: list[dict[str, torch.Tensor]], metas: list[_Meta], plan: Assignment) -> Any:
        me, size, dest = self.rank, self.size, plan.dest
        device = next((v.device for it in items for v in it.values()), None) or _device_of(call.module)
        # features out: my items to the ranks that encode them, in item order per destination
        send = [[i for i, d in enumerate(dest[me]) if d == p] for p in range(size)]
        recv = [[i for i, d in enumerate(dest[p]) if d == me] for p in range(size)]
        parts = [b for p in range(size) for i in send[p] for b in _as_bytes(items[i])]
        out_bytes = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
        in_splits = [sum(_nbytes(metas[me].specs[i]) for i in send[p]) for p in range(size)]
        out_splits = [sum(_nbytes(metas[p].specs[i]) for i in recv[p]) for p in range(size)]
        got = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
        dist.all_to_all_single(got, out_bytes, out_splits, in_splits, group=self.group)
        assigned, at = [], 0
        for p in range(size):
            for i in recv[p]:
                n = _nbytes(metas[p].specs[i])
                assigned.append(_from_bytes(got[at : at + n], metas[p].specs[i]))
                at += n
        # encode: my assigned items, or the dummy batch (same number of module calls on every rank)
        out = call.encode(_to(collate_items(call.processor, assigned), device) if assigned else None)
        embeds, layers = (out.embeds, list(out.layer_embeds)) if isinstance(out, EncoderOutput) else (out, [])
        want = sum(metas[p].tokens[i] for p in range(size) for i in recv[p])
        if assigned and embeds.shape[0] != want:
            raise ValueError(
                f"encoder_balance: the {call.modality} encoder gave {embeds.shape[0]} rows for {len(assigned)} items whose "
                f"num_tokens add up to {want}"
            )
        rows = torch.cat([embeds, *layers], dim=-1) if layers else embeds
        if not assigned:
            rows = rows[:0]  # nothing to send, but still in the graph: the backward reaches the dummy pass
        # rows back: to each item's owner, differentiably; they arrive by encoding rank, then item order
        back = all_to_all(
            rows,
            [sum(metas[me].tokens[i] for i in send[p]) for p in range(size)],
            [sum(metas[p].tokens[i] for i in recv[p]) for p in range(size)],
            self.group,
        )
        back = back[_item_order(metas[me].tokens, send, back.device)]
        if not layers:
            return back
        width = embeds.shape[-1]
        cols = back.split([width] + [r.shape[-1] for r in layers], dim=-1)
        return EncoderOutput(cols[0], list(cols[1:]))


def _item_order(tokens: list[int], send: list[list[int]], device: Any) -> torch.Tensor:
    """Row indices that put rows arriving by destination rank (``send[p]``: my items rank ``p``
    encoded, in item order) back in my items' order (``tokens[i]`` rows each)."""
    start, at = {}, 0
    for group in send:
        for i in group:
            start[i] = at
            at += tokens[i]
    idx = [start[i] + k for i in range(len(tokens)) for k in range(tokens[i])]
    return torch.tensor(idx, dtype=torch.long, device=device)


def _device_of(module: Any) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
