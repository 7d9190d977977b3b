"""Built-in parallel strategies: FSDP2 (HSDP when ``parallel.dp_replicate`` > 1), and none."""

from __future__ import annotations

from typing import Any


class NoParallel:
    """One process, the model as built: the reference every strategy is compared with."""

    mesh_dims: tuple[str, ...] = ()
    phase = "sharding"

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def apply(self, model: Any, state: Any) -> Any:
        """The model as it is."""
        return model

    def validate(self, model_or_config: Any, state: Any) -> list[Any]:
        return []


class FSDP2:
    """FSDP2 (``torch.distributed.fsdp.fully_shard``): each transformer block, each encoder, then
    the root (which holds the embeddings, the LM head and the decoders).

    Sharding per block lets FSDP2 all-gather one block's parameters at a time (Zhao et al. 2023,
    "PyTorch FSDP"; torchtitan's ``apply_fsdp``). The shard dim is the derived ``fsdp`` dim
    (``dp_shard x ep x sp``: every rank of a replica holds its own shard and the gradients of all
    of them are reduced together). With ``dp_replicate`` > 1 the mesh is 2-D
    ``(dp_replicate, fsdp)``, which is HSDP: sharded within a replica, replicated across replicas
    (all-reduce of the reduce-scattered gradients). Gradients are averaged over every rank; the
    training loop scales the loss so the average equals the one-process gradient.

    Modules that an earlier strategy already passed to ``fully_shard`` (expert parallelism shards
    its experts over ``dp_shard_sp``) keep their own group; the parents' groups skip their
    parameters.
    """

    mesh_dims: tuple[str, ...] = ("dp_replicate", "dp_shard")
    phase = "sharding"

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def apply(self, model: Any, state: Any) -> Any:
        """Shard over ``state.fsdp_mesh()``: 1-D ``fsdp``, or 2-D HSDP ``(dp_replicate, fsdp)``.

        With ``state.mixed_precision == "bf16"`` the parameters are all-gathered and computed in
        bfloat16 while the sharded parameters, the gradient reduce-scatter/all-reduce and the
        optimizer stay fp32 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``).
        """
        if state is None or not state.distributed:
            return model
        return self._shard(model, state.fsdp_mesh(), getattr(state, "mixed_precision", "none"))

    @staticmethod
    def _shard(model: Any, mesh: Any, mixed_precision: str = "none") -> Any:
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        kw: dict[str, Any] = {"mesh": mesh}
        if mixed_precision == "bf16":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks():
            fully_shard(block, **kw)
        for module in model.encoders.values():
            fully_shard(module, **kw)
        # Decoders stay in the root's group: they are called through several methods (encode,
        # embed, head), a different number of times on a rank whose batch lacks the modality, so
        # a group of their own would issue mismatched all-gathers across ranks.
        fully_shard(model, **kw)
        return model

    def validate(self, model_or_config: Any, state: Any) -> list[Any]:
        return []  # FSDP2 pads uneven dim-0 shards; no size needs to divide anything

    def plan(self, model: Any, state: Any, prior: dict[str, list[tuple[str, int]]]) -> Any:
        """Blocks, encoders and the root; every parameter split over ``fsdp`` (over ``dp_shard_sp``
        when an earlier strategy already split it over ``ep``), replicated over ``dp_replicate``."""
        from omnicore.components import StrategyPlan

        names = {id(m): n for n, m in model.named_modules()}
        modules = [names[id(b)] for b in model.blocks()] + [f"encoders.{k}" for k in model.encoders] + ["(root)"]
        shards = {}
        for n, _ in model.named_parameters():
            dim = "dp_shard_sp" if any(d == "ep" for d, _ in prior.get(n, [])) else "fsdp"
            shards[n] = (dim, state.size(dim))
        kind = "HSDP" if state.size("dp_replicate") > 1 else "FSDP2"
        return StrategyPlan(modules, shards, f"{kind}: shard over {state.size('fsdp')} ranks, replicate x{state.size('dp_replicate')}")
