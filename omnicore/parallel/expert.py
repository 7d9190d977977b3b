"""Expert parallelism (EP) for transformers' mixture-of-experts foundations, applied from outside.

What it does, for every experts module the plan matches (Qwen2-MoE, Qwen3-MoE and any transformers
MoE whose experts class is decorated with ``@use_experts_implementation`` and stores its experts as
3-D ``gate_up_proj (E, 2I, H)`` / ``down_proj (E, H, I)`` parameters):

1. **Shard the experts** (a declarative plan, module-name wildcards to DTensor placements)::

       DEFAULT_PLAN = {"*.mlp.experts.gate_up_proj": Shard(0), "*.mlp.experts.down_proj": Shard(0)}

   Each matched parameter becomes a DTensor ``Shard(0)`` over the ``ep`` mesh: rank ``r`` of ``P``
   holds experts ``[r*E/P, (r+1)*E/P)``. ``E`` must be divisible by ``P``.
2. **Route tokens through the registry**, not by editing model code: the function
   :func:`ep_experts_forward` is registered in transformers' ``ALL_EXPERTS_FUNCTIONS`` under
   :data:`IMPL_NAME` and the experts' config switched to it. The router still runs on each rank's
   own tokens; the experts function then

   * sorts this rank's ``(token, k)`` pairs by expert (a token whose top-k names one expert twice
     sends two rows; the weights are applied per row, so duplicates add up as on one process),
   * exchanges the per-expert counts (one small even all-to-all) and **dispatches** the rows to the
     experts' owners with an all-to-all of uneven splits (zero splits are fine: an expert, or a
     whole rank, that receives no tokens computes on empty tensors and still joins every collective,
     so its weight gradient is an exact zero, never ``None``),
   * runs its local experts (gate-up, the module's own gate/activation, down),
   * **combines**: the reverse all-to-all brings each row home, where it is scaled by its routing
     weight (router gradients stay local) and summed over ``k`` in the same order as transformers'
     ``grouped_mm``.

   The all-to-alls are autograd functions (the backward is the reverse all-to-all), so the expert
   weights' gradients on their owner already sum the contributions of every rank's tokens.
3. **FSDP2 over the rest**: when given an ``fsdp_mesh`` (the ``dp_shard x sp`` ranks that hold the
   *same* experts; size 1 is fine), each experts module is ``fully_shard``-ed over it (FSDP2 on a
   DTensor parameter: 2-D, sharded again on dim 0) with the gradient divide factor of the dense
   parameters (applied as a gradient scale), so experts and dense parameters end up with the same
   gradient scale. A later FSDP2 of
   the blocks and the root skips the experts' parameters. EP size x FSDP size need not equal the
   number of experts (4 experts, EP 2 x dp_shard 2 on 4 ranks: each rank computes 2 experts and
   stores half of each).

The dispatch-combine step is pluggable: :class:`EPContext` ``dispatcher`` gets the sorted rows and
the count tables and returns the expert outputs in the same order. :func:`all_to_all_dispatcher` is
plain EP; ``omnicore-parallel-comet`` supplies a chunked, overlapped one (COMET).

Mesh: the strategy uses the ``ep`` dim of omnicore's mesh (``state.submesh("ep")``). Given a plain
1-D DeviceMesh without an ``ep`` name, the whole mesh is the ep group (tests build one that way).

Data parallelism of the dense (non-expert) parameters is not this module's job: every ep rank reads
different samples, so combine EP with ``fsdp2`` (or all-reduce dense gradients over ``ep`` yourself).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

IMPL_NAME = "omnicore_ep"
"""The name under which :func:`ep_experts_forward` is registered in transformers' experts registry."""

DEFAULT_PLAN: dict[str, str] = {
    "*.mlp.experts.gate_up_proj": "Shard(0)",
    "*.mlp.experts.down_proj": "Shard(0)",
}
"""Parameter-name wildcards (``fnmatch``, ``*`` crosses dots) to placements over ``ep``. Values may
be the strings ``"Shard(0)"`` (as config YAML writes them) or ``torch.distributed.tensor.Shard(0)``."""

_FALLBACK: dict[int, str | None] = {}  # id(config) -> the experts implementation before EP


# ---------------------------------------------------------------------------------------------
# collectives
# ---------------------------------------------------------------------------------------------


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits over ``group``; backward is the reverse exchange."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
        ctx.splits = (out_splits, in_splits)
        ctx.group = group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
    """Differentiable uneven all-to-all: send ``in_splits[p]`` rows of ``x`` to rank ``p`` of
    ``group``, receive ``out_splits[p]`` rows from it (rows in source-rank order)."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)


def exchange_counts(counts: torch.Tensor, group: Any) -> torch.Tensor:
    """``counts[c, p, e]``: rows of chunk ``c`` this rank sends to local expert ``e`` of rank ``p``.
    Returns ``recv[c, p, e]``: rows of chunk ``c`` rank ``p`` sends to *this* rank's expert ``e``
    (one even all-to-all of ``C*P*E_local`` integers)."""
    C, P, El = counts.shape
    send = counts.permute(1, 0, 2).contiguous().view(-1)  # by destination rank
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.view(P, C, El).permute(1, 0, 2).contiguous()


# ---------------------------------------------------------------------------------------------
# local expert computation
# ---------------------------------------------------------------------------------------------


def regroup(recv_counts: list[list[int]], device: Any) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Rows arrive ordered by (source rank, local expert) with ``recv_counts[p][e]`` rows each.
    Returns ``(perm, inverse, tokens_per_expert)``: ``rows[perm]`` is expert-major (stable) and
    ``expert_rows[inverse]`` restores arrival order."""
    P, El = len(recv_counts), len(recv_counts[0])
    n = torch.tensor(recv_counts, dtype=torch.long).view(-1)
    ids = torch.arange(El).repeat(P).repeat_interleave(n)
    perm = torch.argsort(ids, stable=True).to(device)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=device)
    per_expert = [sum(recv_counts[p][e] for p in range(P)) for e in range(El)]
    return perm, inverse, per_expert


def local_experts_forward(
    module: nn.Module, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, tokens_per_expert: list[int]
) -> torch.Tensor:
    """Rows ``x`` sorted by local expert (``tokens_per_expert[e]`` each) through their experts:
    ``down(gate(up_gate(x)))`` with the module's own gate/activation. Every expert runs, also on
    zero rows, so every local weight is in the graph (its gradient is 0, not None)."""
    outs = []
    start = 0
    gate = getattr(module, "_apply_gate", None)
    for e, n in enumerate(tokens_per_expert):
        xs = x[start : start + n].to(w1.dtype)
        h = F.linear(xs, w1[e])
        if gate is not None:
            h = gate(h)
        else:
            g, u = h.chunk(2, dim=-1)
            h = module.act_fn(g) * u
        outs.append(F.linear(h, w2[e]))
        start += n
    return torch.cat(outs, dim=0) if outs else x.new_zeros((0, w2.shape[1]))


def all_to_all_dispatcher(
    module: nn.Module, x: torch.Tensor, send: list, recv: list, w1: torch.Tensor, w2: torch.Tensor, group: Any
) -> torch.Tensor:
    """Plain EP: for each chunk (one unless the context asks for more), dispatch, compute, combine,
    one after another. ``x`` holds the rows sorted by (chunk, expert); ``send[c][p][e]`` and
    ``recv[c][p][e]`` are the count tables of :func:`exchange_counts`. Returns the expert outputs
    for ``x``'s rows, in ``x``'s order."""
    outs = []
    start = 0
    for send_c, recv_c in zip(send, recv):
        in_splits = [sum(r) for r in send_c]
        out_splits = [sum(r) for r in recv_c]
        xc = x[start : start + sum(in_splits)]
        start += sum(in_splits)
        arrived = all_to_all(xc, out_splits, in_splits, group)
        perm, inverse, per_expert = regroup(recv_c, x.device)
        y = local_experts_forward(module, arrived[perm], w1, w2, per_expert)[inverse]
        outs.append(all_to_all(y, in_splits, out_splits, group))
    return torch.cat(outs, dim=0)


Dispatcher = Callable[[nn.Module, torch.Tensor, list, list, torch.Tensor, torch.Tensor, Any], torch.Tensor]


@dataclass
class EPContext:
    """Per experts-module EP state (stored on the module as ``_omnicore_ep``: nothing process-wide).

    Attributes:
        group: the ep ProcessGroup; ``size``/``rank``: this rank's place in it.
        num_experts: ``E`` of the full model; each rank holds ``E / size``.
        chunks: split each rank's tokens into this many chunks (COMET-style pipelines need > 1).
        dispatcher: dispatch-compute-combine function (:func:`all_to_all_dispatcher` by default).
        grad_scale: multiplies the local expert weights' gradients (see ``gradient_divide_factor``
            of :func:`apply_expert_parallel`).
    """

    group: Any
    size: int
    rank: int
    num_experts: int
    chunks: int = 1
    dispatcher: Dispatcher = field(default=all_to_all_dispatcher)
    grad_scale: float = 1.0

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.size


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad * ctx.scale, None


def _local_weight(w: torch.Tensor, ctx: EPContext) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(w, DTensor):
        return w.to_local()
    n = ctx.local_experts
    return w if w.shape[0] == n else w[ctx.rank * n : (ctx.rank + 1) * n]


def _fallback_forward(module: nn.Module) -> Callable:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    name = _FALLBACK.get(id(module.config), "grouped_mm") or "grouped_mm"
    if name == "eager" or name not in ALL_EXPERTS_FUNCTIONS:
        return type(module).forward.__wrapped__  # the class's own loop (use_experts_implementation wraps it)
    return ALL_EXPERTS_FUNCTIONS[name]


def ep_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The experts function registered as :data:`IMPL_NAME` (same signature as transformers'
    ``grouped_mm_experts_forward``): ``hidden_states [T, H]``, ``top_k_index``/``top_k_weights``
    ``[T, K]`` of this rank's tokens -> ``[T, H]``. A module without an :class:`EPContext` (not in
    the plan) runs the implementation it had before."""
    ctx: EPContext | None = getattr(self, "_omnicore_ep", None)
    if ctx is None:
        return _fallback_forward(self)(self, hidden_states, top_k_index, top_k_weights)
    T, H = hidden_states.shape
    K = top_k_index.size(-1)
    E, P, El, C = ctx.num_experts, ctx.size, ctx.local_experts, max(1, int(ctx.chunks))
    dev = hidden_states.device
    ids = top_k_index.reshape(-1).long()
    chunk = torch.arange(T * K, device=dev) // K * C // max(T, 1)  # balanced contiguous token chunks
    key = chunk * E + ids
    order = torch.argsort(key, stable=True)
    x = hidden_states[order // K]
    counts = torch.bincount(key, minlength=C * E).view(C, P, El)
    recv = exchange_counts(counts, ctx.group)
    w1 = _local_weight(self.gate_up_proj, ctx)
    w2 = _local_weight(self.down_proj, ctx)
    if ctx.grad_scale != 1.0:
        w1, w2 = _ScaleGrad.apply(w1, ctx.grad_scale), _ScaleGrad.apply(w2, ctx.grad_scale)
    y = ctx.dispatcher(self, x, counts.tolist(), recv.tolist(), w1, w2, ctx.group)
    y = y * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=dev)
    return y[inverse].view(T, K, H).sum(dim=1).to(hidden_states.dtype)


def register_experts_implementation() -> None:
    """Register :func:`ep_experts_forward` in transformers' experts registry (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    type(ALL_EXPERTS_FUNCTIONS).register(IMPL_NAME, ep_experts_forward)


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------


def _placement(value: Any) -> Any:
    from torch.distributed.tensor import Shard

    if isinstance(value, Shard) and value.dim == 0:
        return value
    if isinstance(value, str) and value.replace(" ", "").lower() in ("shard(0)", "shard0"):
        return Shard(0)
    raise ValueError(f"expert plan placement {value!r} is not supported; expert weights are split Shard(0) over ep")


def match_plan(model: nn.Module, plan: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """``{experts module name: [parameter leaf names]}`` for the parameters the plan's wildcards
    match (checked against each full parameter name with ``fnmatch``)."""
    plan = plan or DEFAULT_PLAN
    out: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, pat) for pat in plan):
            mod, _, leaf = name.rpartition(".")
            out.setdefault(mod, []).append(leaf)
    return out


def plan_problems(model: nn.Module, ep_size: int, plan: dict[str, Any] | None = None) -> list[str]:
    """What stops EP of ``ep_size`` on this model (empty when it fits), each with what to change."""
    groups = match_plan(model, plan)
    if not groups:
        pats = ", ".join(sorted(plan or DEFAULT_PLAN))
        return [
            f"no parameter matches the expert plan ({pats}); the foundation has no experts there: set parallel.ep: 1 or give the strategy a plan that names the experts' parameters"
        ]
    out = []
    for mod_name, leaves in groups.items():
        m = model.get_submodule(mod_name)
        if set(leaves) != {"gate_up_proj", "down_proj"}:
            out.append(
                f"{mod_name}: the plan shards {sorted(leaves)}, but expert parallelism needs exactly gate_up_proj and down_proj of an experts module"
            )
            continue
        if not hasattr(m, "num_experts") or getattr(getattr(m, "config", None), "_experts_implementation", "?") == "?":
            out.append(
                f"{mod_name} ({type(m).__name__}) does not use transformers' experts registry (@use_experts_implementation); expert parallelism cannot route its tokens"
            )
            continue
        if getattr(m, "has_bias", False) or getattr(m, "is_transposed", False) or not getattr(m, "has_gate", True):
            out.append(f"{mod_name} ({type(m).__name__}): experts with bias, transposed or gate-less weights are not supported yet")
        if m.num_experts % ep_size:
            out.append(
                f"{mod_name} has {m.num_experts} experts, not divisible by parallel.ep = {ep_size}; set parallel.ep to a divisor of {m.num_experts}"
            )
    return out


def _distribute_expert_weights(m: nn.Module, mod_name: str, ep_mesh: Any, placements: dict[str, Any]) -> None:
    """Replace ``gate_up_proj`` and ``down_proj`` of the experts module ``m`` (named ``mod_name``)
    by DTensor parameters over ``ep_mesh``, placed as the first plan wildcard that matches says."""
    from torch.distributed.tensor import distribute_tensor

    for leaf in ("gate_up_proj", "down_proj"):
        p = getattr(m, leaf)
        full = f"{mod_name}.{leaf}"
        pl = next(v for pat, v in placements.items() if fnmatch.fnmatchcase(full, pat))
        dt = distribute_tensor(p.detach(), ep_mesh, [pl])
        m.register_parameter(leaf, nn.Parameter(dt, requires_grad=p.requires_grad))


def apply_expert_parallel(
    model: nn.Module,
    ep_mesh: Any,
    *,
    plan: dict[str, Any] | None = None,
    chunks: int = 1,
    dispatcher: Dispatcher | None = None,
    fsdp_mesh: Any = None,
    gradient_divide_factor: float | None = None,
) -> list[str]:
    """Expert-parallelise ``model`` in place over the 1-D ``ep_mesh``; returns the names of the
    experts modules it changed.

    Args:
        plan: parameter wildcards to placements (:data:`DEFAULT_PLAN`).
        chunks: split each rank's tokens into this many chunks before dispatch.
        dispatcher: the dispatch-compute-combine function (:func:`all_to_all_dispatcher`).
        fsdp_mesh: if given, ``fully_shard`` each experts module over it (the ranks holding the same
            experts: ``dp_shard x sp``, or HSDP's ``(dp_replicate, dp_shard_sp)``).
        gradient_divide_factor: what the experts' summed gradients are divided by; pass the dense
            parameters' factor (the ranks FSDP2 averages them over: ``fsdp x dp_replicate``). The
            expert gradient on its owner already sums the tokens of the whole ep group, so FSDP2's
            own average over ``fsdp_mesh`` alone would leave it ``ep`` times too large. Applied as a
            gradient scale of ``fsdp_mesh.size() / factor`` inside the experts function (FSDP2's
            ``set_gradient_divide_factor`` needs ``PREMUL_SUM``, which gloo lacks).

    Raises:
        ValueError: the plan matches nothing, an experts module is unsupported, or the experts do
            not divide over ``ep`` (every problem listed).
    """
    size = ep_mesh.size()
    plan = plan or DEFAULT_PLAN
    problems = plan_problems(model, size, plan)
    if problems:
        raise ValueError("cannot apply expert parallelism:\n" + "\n".join(f"  {p}" for p in problems))
    placements = {pat: _placement(v) for pat, v in plan.items()}
    register_experts_implementation()
    group = ep_mesh.get_group()
    rank = ep_mesh.get_local_rank()
    scale = 1.0
    if fsdp_mesh is not None and gradient_divide_factor is not None:
        scale = fsdp_mesh.size() / float(gradient_divide_factor)
    names = list(match_plan(model, plan))
    for mod_name in names:
        m = model.get_submodule(mod_name)
        _distribute_expert_weights(m, mod_name, ep_mesh, placements)
        m._omnicore_ep = EPContext(group, size, rank, m.num_experts, chunks, dispatcher or all_to_all_dispatcher, scale)
        cfg = m.config
        if cfg._experts_implementation != IMPL_NAME:
            _FALLBACK[id(cfg)] = cfg._experts_implementation
            cfg._experts_implementation = IMPL_NAME
        if fsdp_mesh is not None:
            from torch.distributed.fsdp import fully_shard

            fully_shard(m, mesh=fsdp_mesh)
    return names


# ---------------------------------------------------------------------------------------------
# the registered strategy
# ---------------------------------------------------------------------------------------------


class ExpertParallelOptions(BaseModel):
    """Options of ``parallel/ep`` (and of strategies built on :class:`ExpertParallel`)."""

    model_config = ConfigDict(extra="forbid")

    plan: dict[str, str] | None = Field(
        default=None,
        description="module-path wildcard -> placement of the expert weights (only 'Shard(0)'); default: every MoE experts module",
    )
    chunks: int = Field(default=1, ge=1, description="token chunks per dispatch (1: plain all-to-all; more: pipelined, as comet_ep)")


class ExpertParallel:
    """Parallel strategy ``ep``: experts ``Shard(0)`` over the ``ep`` mesh dim, tokens dispatched
    and combined by all-to-all (see the module docstring).

    Options: ``plan`` (wildcard -> ``"Shard(0)"``, default :data:`DEFAULT_PLAN`) and ``chunks``
    (default 1). Runs in the ``experts`` phase, before FSDP2: with omnicore's ParallelState the
    experts are also ``fully_shard``-ed over ``dp_shard_sp`` (HSDP: ``(dp_replicate,
    dp_shard_sp)``) with the dense parameters' gradient divide factor.
    """

    mesh_dims: tuple[str, ...] = ("ep",)
    phase = "experts"
    chunks_default = 1

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = dict(options or {})
        self.expert_plan = dict(self.options.get("plan") or DEFAULT_PLAN)
        self.chunks = int(self.options.get("chunks", self.chunks_default))

    def dispatcher(self) -> Dispatcher:
        return all_to_all_dispatcher

    def apply(self, model: Any, state: Any) -> Any:
        """Shard the experts ``Shard(0)`` over ``state.submesh("ep")`` and FSDP them over
        ``dp_shard_sp``; the model as it is on one process or with ``ep`` of size 1."""
        if state is None or not state.distributed or state.size("ep") == 1:
            return model
        factor = state.size("fsdp") * state.size("dp_replicate")
        apply_expert_parallel(
            model,
            state.submesh("ep"),
            plan=self.expert_plan,
            chunks=self.chunks,
            dispatcher=self.dispatcher(),
            fsdp_mesh=state.fsdp_mesh("dp_shard_sp"),
            gradient_divide_factor=factor,
        )
        return model

    def validate(self, model_or_config: Any, state: Any) -> list[Any]:
        if not isinstance(model_or_config, nn.Module) or state.size("ep") == 1:
            return []
        from omnicore.components import Violation

        return [Violation("parallel.ep", p, "ep") for p in plan_problems(model_or_config, state.size("ep"), self.expert_plan)]

    def plan_of(self, model: Any, ep: int) -> dict[str, tuple[str, int]]:
        return {f"{m}.{leaf}": ("ep", ep) for m, leaves in match_plan(model, self.expert_plan).items() for leaf in leaves}

    def plan(self, model: Any, state: Any, prior: dict[str, list[tuple[str, int]]]) -> Any:
        from omnicore.components import StrategyPlan

        groups = match_plan(model, self.expert_plan)
        shards = self.plan_of(model, state.size("ep"))
        return StrategyPlan(
            list(groups), shards, f"EP: {len(groups)} experts modules split over ep={state.size('ep')}, dispatch by all-to-all"
        )
