"""``parallelize(model, state, strategies)``: apply the configured parallel strategies in one order.

The order (torchtitan's ``parallelize.py``; VeOmni applies its parallelisms the same way) is fixed by
each strategy's ``phase``, never by the order of the config list:

==================  ==========================================================================
phase               why it comes here
==================  ==========================================================================
``attention``       Ulysses and other attention/kernel wrappers change what a block computes;
                    everything after wraps the blocks as they will run.
``experts``         expert parallelism turns expert weights into DTensors ``Shard(0)`` over
                    ``ep`` (and may ``fully_shard`` them over ``dp_shard_sp``); FSDP2 then skips
                    modules already sharded.
``checkpointing``   activation checkpointing wraps whole blocks, including the wrappers above.
``compile``         ``torch.compile`` per block sees the final block code and its checkpointing.
``sharding``        FSDP2/HSDP last: ``fully_shard`` registers hooks around the final modules
                    and turns every remaining parameter into a DTensor.
==================  ==========================================================================

Within one phase strategies keep their config order. The members of a strategy this module reads
(``mesh_dims``, ``phase``, ``validate``, ``apply``, and ``data_split`` through
:func:`data_split`) are the contract :class:`omnicore.components.ParallelStrategy` and
:class:`omnicore.components.SequenceParallel`; the optional ones are read here and in
:mod:`omnicore.parallel.plan` (``plan``) only.
"""

from __future__ import annotations

from typing import Any

from omnicore.components import DEFAULT_PHASE, PHASES, StrategyPlan, Violation
from omnicore.parallel.mesh import FLAT_DIMS, MESH_DIMS

__all__ = [
    "DEFAULT_PHASE",
    "PHASES",
    "ParallelizeError",
    "StrategyPlan",
    "Violation",
    "build_strategies",
    "data_split",
    "order_strategies",
    "parallelize",
    "phase_of",
    "validate",
]

# which strategy must use a real dim when its size is above 1
_DIM_HINTS = {
    "dp_replicate": "add fsdp2 to parallel.strategies (HSDP) or set parallel.dp_replicate: 1",
    "dp_shard": "add fsdp2 to parallel.strategies or set parallel.dp_shard: 1",
    "ep": "add an expert-parallel strategy to parallel.strategies or set parallel.ep: 1",
    "sp": "add a sequence-parallel strategy (for example ulysses) to parallel.strategies or set parallel.sp: 1",
}


class ParallelizeError(ValueError):
    """The strategies cannot be applied to this model on this mesh; lists every violation."""


def phase_of(strategy: Any) -> str:
    """A strategy's phase (:data:`DEFAULT_PHASE` when it declares none).

    Raises:
        ParallelizeError: the declared phase is not one of :data:`PHASES`.
    """
    phase = getattr(strategy, "phase", None) or DEFAULT_PHASE
    if phase not in PHASES:
        raise ParallelizeError(f"parallel strategy {type(strategy).__name__} declares phase {phase!r}; phases are {', '.join(PHASES)}")
    return phase


def order_strategies(named: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``(name, strategy)`` pairs sorted by phase; config order within a phase (a stable sort)."""
    return sorted(named, key=lambda ns: PHASES.index(phase_of(ns[1])))


def build_strategies(parallel: Any, registry: Any, distributed: bool) -> list[tuple[str, Any]]:
    """Build the strategies of the config's ``parallel`` section from the registry, in application
    order (:meth:`omnicore.config.ParallelConfig.strategy_list`; ``distributed`` resolves the
    default).

    Raises:
        RegistryError: a strategy is unknown or its options are invalid.
    """
    named = [(c.name, registry.build("parallel", c.name, c.options)) for c in parallel.strategy_list(distributed)]
    return order_strategies(named)


def validate(model_or_config: Any, state: Any, strategies: list[tuple[str, Any]]) -> list[Violation]:
    """Every violated constraint of ``strategies`` on ``state``'s mesh for this model (or config).

    Checks that each declared mesh dim exists, that each real dim above size 1 is used by some
    strategy (otherwise its ranks would silently train apart or duplicate work), the model against
    the mesh (:func:`model_violations`), and then each strategy's own ``validate``.
    """
    out: list[Violation] = []
    known = set(MESH_DIMS) | set(FLAT_DIMS)
    used: set[str] = set()
    for name, s in strategies:
        for d in getattr(s, "mesh_dims", ()):
            if d not in known:
                out.append(
                    Violation(
                        "parallel.strategies",
                        f"strategy {name!r} needs mesh dim {d!r}, which omnicore's mesh lacks (dims: {', '.join(sorted(known))})",
                        name,
                    )
                )
            used.update(FLAT_DIMS.get(d, (d,)))
    for d in MESH_DIMS:
        if state.size(d) > 1 and d not in used:
            names = ", ".join(n for n, _ in strategies) or "none"
            out.append(
                Violation(f"parallel.{d}", f"is {state.size(d)} but no strategy uses the {d!r} dim (strategies: {names}); {_DIM_HINTS[d]}")
            )
    out.extend(model_violations(model_or_config, state))
    out.extend(_unreduced_dense_gradients(state, strategies))
    for name, s in strategies:
        check = getattr(s, "validate", None)
        if check is not None:
            for v in check(model_or_config, state) or []:
                out.append(v if isinstance(v, Violation) else Violation("parallel", str(v), name))
    seen: set[str] = set()
    return [v for v in out if not (str(v) in seen or seen.add(str(v)))]  # type: ignore[func-returns-value]


_SHARD_DIMS = frozenset({"dp_replicate", "dp_shard", "fsdp", "dp_shard_sp"})


def _unreduced_dense_gradients(state: Any, strategies: list[tuple[str, Any]]) -> list[Violation]:
    """An expert-parallel strategy (one that uses the ``ep`` dim, size above 1) with no sharding
    strategy over the data-parallel dims: the ep ranks read different samples, and only the expert
    weights' gradients are combined (by the all-to-alls); the dense parameters' gradients would
    stay per-rank, and the ranks would silently train apart."""
    if state.size("ep") <= 1:
        return []
    ep = [n for n, s in strategies if "ep" in getattr(s, "mesh_dims", ())]
    sharding = [n for n, s in strategies if phase_of(s) == "sharding" and _SHARD_DIMS & set(getattr(s, "mesh_dims", ()))]
    if not ep or sharding:
        return []
    names = ", ".join(n for n, _ in strategies)
    return [
        Violation(
            "parallel.strategies",
            f"{ep[0]!r} splits the experts over parallel.ep = {state.size('ep')}, but no sharding strategy reduces the dense (non-expert) "
            f"gradients over the ep ranks, which read different samples (strategies: {names}); add fsdp2 to parallel.strategies",
            ep[0],
        )
    ]


def _foundation_config(model: Any) -> Any:
    lm = getattr(model, "lm", model)
    cfg = getattr(lm, "config", None)
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()
    return cfg


def model_violations(model: Any, state: Any) -> list[Violation]:
    """What the mesh needs from any model, whatever strategy implements the dim:

    * ``sp``: the foundation's attention heads divide evenly over the sp ranks (Ulysses gives each
      rank ``heads / sp`` whole heads), and the foundation has no media spans (its masks cover the
      whole row, which sequence parallelism cuts: ``FoundationOptional.media_span_inputs``);
    * ``ep``: the foundation's experts divide evenly over the ep ranks (``Shard(0)`` of the expert
      weights).
    """
    cfg = _foundation_config(model)
    if cfg is None:
        return []
    out = []
    sp = state.size("sp")
    heads = getattr(cfg, "num_attention_heads", None)
    if sp > 1 and heads is not None and heads % sp:
        ok = [d for d in range(1, heads + 1) if heads % d == 0 and state.world_size % d == 0]
        out.append(
            Violation(
                "parallel.sp",
                f"is {sp} but the foundation has {heads} attention heads, not divisible by {sp}; set parallel.sp to a divisor of {heads} that divides the world size ({', '.join(map(str, ok))})",
            )
        )
    if sp > 1 and getattr(model, "media_span_inputs", None) is not None:
        out.append(
            Violation(
                "parallel.sp",
                f"is {sp} but the foundation attends bidirectionally within each medium's placeholder tokens, through attention "
                "masks over the whole packed row, which sequence parallelism cannot cut; set parallel.sp: 1",
            )
        )
    ep = state.size("ep")
    experts = next(
        (getattr(cfg, a) for a in ("num_experts", "num_local_experts", "n_routed_experts") if isinstance(getattr(cfg, a, None), int)), None
    )
    if ep > 1 and experts is None:
        out.append(
            Violation(
                "parallel.ep",
                f"is {ep} but the foundation ({getattr(cfg, 'model_type', '?')}) has no experts; set parallel.ep: 1 or use a mixture-of-experts foundation",
            )
        )
    elif ep > 1 and experts % ep:
        ok = [d for d in range(1, experts + 1) if experts % d == 0 and state.world_size % d == 0]
        out.append(
            Violation(
                "parallel.ep",
                f"is {ep} but the foundation has {experts} experts, not divisible by {ep}; set parallel.ep to a divisor of {experts} that divides the world size ({', '.join(map(str, ok))})",
            )
        )
    return out


def parallelize(model: Any, state: Any, strategies: list[tuple[str, Any]] | list[Any]) -> Any:
    """Apply ``strategies`` to ``model`` in phase order (see the module docstring); returns the model.

    Args:
        model: the built model (an :class:`~omnicore.model.omni.OmniModel`), on ``state.device``.
        state: the :class:`~omnicore.parallel.state.ParallelState`.
        strategies: ``(name, strategy)`` pairs (as :func:`build_strategies` returns) or bare
            strategy objects.

    Raises:
        ParallelizeError: a violated constraint (all of them listed, each with what to change);
            nothing has been applied then.
    """
    named = [s if isinstance(s, tuple) else (type(s).__name__, s) for s in strategies]
    named = order_strategies(named)
    problems = validate(model, state, named)
    if problems:
        raise ParallelizeError("cannot parallelize:\n" + "\n".join(f"  {v}" for v in problems))
    for _, s in named:
        model = s.apply(model, state)
    return model


def data_split(strategies: list[tuple[str, Any]], state: Any) -> tuple[int, int]:
    """``(index, count)`` of this rank's data group: from the first strategy that implements
    :class:`omnicore.components.SequenceParallel` (its ranks share micro-batches), else the
    data-parallel default ``(state.dp_rank, state.dp_size)`` (every rank reads its own)."""
    for _, s in strategies:
        split = getattr(s, "data_split", None)
        if split is not None:
            return split(state)
    return state.dp_rank, state.dp_size
