"""Built-in parallel strategies: FSDP2 over ``dp_shard``, and none."""

from __future__ import annotations

from typing import Any


class NoParallel:
    """One process, the model as built: the reference every strategy is compared with."""

    mesh_dims: tuple[str, ...] = ()

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def apply(self, model: Any, mesh: Any) -> Any:
        return model


class FSDP2:
    """FSDP2 (``torch.distributed.fsdp.fully_shard``): each transformer block, each encoder, then
    the root (which holds the embeddings, the LM head and the decoders), sharded over the mesh's ``dp_shard`` dim.

    Sharding per block lets FSDP2 all-gather one block's parameters at a time (Zhao et al. 2023,
    "PyTorch FSDP"; torchtitan's ``apply_fsdp``). Gradients are reduce-scattered and averaged over the
    ranks; the training loop scales the loss so the average equals the one-process gradient.
    """

    mesh_dims: tuple[str, ...] = ("dp_shard",)

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def apply(self, model: Any, mesh: Any) -> Any:
        from torch.distributed.fsdp import fully_shard

        sub = mesh["dp_shard"] if mesh is not None and mesh.mesh_dim_names and "dp_shard" in mesh.mesh_dim_names else mesh
        for block in model.blocks():
            fully_shard(block, mesh=sub)
        for module in model.encoders.values():
            fully_shard(module, mesh=sub)
        # Decoders stay in the root's group: they are called through several methods (encode,
        # embed, head), a different number of times on a rank whose batch lacks the modality, so
        # a group of their own would issue mismatched all-gathers across ranks.
        fully_shard(model, mesh=sub)
        return model
