"""The parallel strategy ``encoder_balance``: every data-parallel rank encodes about the same cost.

One rank's micro-batch may hold ten images while another's holds text only; without balancing the
second rank waits at the gradient reduction (and at every FSDP2 all-gather after the encoders) for
the first. ``apply(model, state)`` registers an encoder hook (``OmniModel.register_encoder_hook``)
that, at each encoder call in training, moves items between the ranks of the ``dp`` group so that
each encodes about the same cost, and sends the output rows back to the items' owners; gradients
flow back through the same exchange (:mod:`omnicore_parallel_encoder_balance.exchange`). The
numbers are those of the run without it, up to float rounding of batches of another size.

Composition. It declares the phase ``attention`` (it wraps no module: it only registers a hook,
before anything wraps the model) and no mesh dim: it reduces no gradient, so a data-parallel run
still needs ``fsdp2`` (which the core's mesh check asks for). The group is the derived ``dp`` dim
(``dp_replicate x dp_shard x ep``): the ranks that read different micro-batches. Under Ulysses
(``sp`` above 1) the ranks of one sequence-parallel group hold the same micro-batch, and each
``sp`` position balances over its own ``dp`` group, so both halves of a group encode the same
items, as they would without balancing. Evaluation and generation (the model in eval mode) encode
where the items are.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from omnicore.api import StrategyPlan, Violation


class EncoderBalanceOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cost: Literal["auto", "elements", "tokens"] = Field(
        default="auto",
        description="cost of one item: auto = the encoder's own flops(batch) of the one-item batch when it has that member, else "
        "elements; elements = the item's floating-point input elements (omnicore.api.input_units: what the core's measured encoder "
        "FLOPs, ModelFlops.item_flops, scale with); tokens = the processor's num_tokens(features)",
    )
    min_spread: float = Field(
        default=1.05,
        ge=1.0,
        description="move items only when the ranks' own encoder costs of a call are further apart than this (max / mean); 1.0: always",
    )
    modalities: list[str] | None = Field(default=None, description="the encoder modalities balanced; default: every one")


class EncoderBalance:
    """Parallel strategy ``encoder_balance`` (module docstring)."""

    mesh_dims: tuple[str, ...] = ()
    phase = "attention"  # a hook only, registered before checkpointing, compile and FSDP2 wrap modules

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = EncoderBalanceOptions.model_validate(options or {})
        self.hook: Any = None
        """The :class:`~omnicore_parallel_encoder_balance.exchange.BalanceHook` once applied on
        several data-parallel ranks (its ``stats`` hold the costs per modality), else None."""

    def apply(self, model: Any, state: Any) -> Any:
        """Register the encoder hook over the ``dp`` group of ``state``; the model as it is on one
        process or with one data-parallel rank."""
        if state is None or not getattr(state, "distributed", False) or state.size("dp") <= 1:
            return model
        from omnicore_parallel_encoder_balance.exchange import BalanceHook

        o = self.options
        self.hook = BalanceHook(state.submesh("dp").get_group(), o.cost, o.min_spread, o.modalities)
        model.register_encoder_hook(self.hook)
        return model

    def validate(self, model_or_config: Any, state: Any) -> list[Violation]:
        """A modality in ``options.modalities`` that no encoder of the model encodes."""
        wanted = self.options.modalities
        encoders = getattr(model_or_config, "encoders", None)
        if not wanted or encoders is None:
            return []
        known = set(encoders)
        for enc in encoders.values():
            known |= set(getattr(enc, "modalities", ()) or ())
        return [
            Violation(
                "parallel.strategies",
                f"encoder_balance: options.modalities names {m!r}, which no encoder of this model encodes "
                f"(modalities: {', '.join(sorted(known)) or 'none'})",
                "encoder_balance",
            )
            for m in wanted
            if m not in known
        ]

    def plan_encoder_costs(self, modality: str, module: Any, processor: Any, batches: list[Any], flops: Any) -> list[float] | None:
        """Each data rank's encoder FLOPs of one encoder call as the hook would assign the items
        (:func:`~omnicore_parallel_encoder_balance.exchange.planned_flops`, with this strategy's
        ``cost`` and ``min_spread``), for ``omnicore plan``; None for a modality it does not
        balance, or with one rank (nothing moves)."""
        if len(batches) <= 1 or (self.options.modalities is not None and modality not in self.options.modalities):
            return None
        from omnicore_parallel_encoder_balance.exchange import planned_flops

        return planned_flops(self.options.cost, self.options.min_spread, module, processor, batches, flops)

    def plan(self, model: Any, state: Any, prior: dict[str, list[tuple[str, int]]]) -> StrategyPlan:
        """No module wrapped and nothing split; the note says over how many ranks it balances."""
        dp = state.size("dp") if state is not None else 1
        which = ", ".join(self.options.modalities) if self.options.modalities else "every encoder modality"
        if dp <= 1:
            return StrategyPlan(note="one data-parallel rank: nothing to balance")
        return StrategyPlan(
            note=f"{which}: items moved over the dp group of {dp} ranks so each encodes about the same cost "
            f"({self.options.cost}; when the ranks are further apart than {self.options.min_spread:g} x the mean)"
        )
