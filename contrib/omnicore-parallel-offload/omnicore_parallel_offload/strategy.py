"""``fsdp2_offload``: FSDP2 with activation offloading to CPU, applied from outside the model.

What it does, in order (:meth:`FSDP2Offload.apply`):

1. Around the forward of every transformer block (``OmniModel.blocks()``), a forward pre-hook enters
   and a forward hook leaves a ``torch.autograd.graph.saved_tensors_hooks`` context built on
   ``torch.autograd.graph.save_on_cpu``: every tensor autograd saves for the backward pass inside a
   block is copied to CPU memory (pinned when ``pin_memory``), and copied back to the block's device
   when the backward pass needs it. Parameters are left where they are: under FSDP2 they are the
   all-gathered weights that FSDP2 frees after the forward and gathers again for the backward, so a
   CPU copy would only cost memory and bandwidth.
2. FSDP2 (``torch.distributed.fsdp.fully_shard``) exactly as omnicore's built-in ``fsdp2``: each
   block, each encoder, then the root (embeddings, LM head and decoders), over the mesh's
   ``dp_shard`` dim. The offload hooks are registered first, so FSDP2's own pre-forward hook (the
   all-gather, registered with ``prepend=True``) runs before the context is entered, and its
   post-forward reshard after it is left.

The arithmetic is unchanged (the same tensors, moved and moved back), so the losses and gradients are
those of ``fsdp2``. Activation memory on the accelerator drops to roughly the activations of the
embedding, the LM head and the block being computed; the cost is device-host traffic. On a CPU-only
run ``save_on_cpu`` keeps the tensor where it is (``Tensor.cpu()`` of a CPU tensor is itself).

Counting: :class:`OffloadStats` counts what was packed and unpacked. With the environment variable
``OMNICORE_OFFLOAD_STATS`` set to a folder, every rank writes ``rank<N>.json`` there each time all the
activations packed so far have been read back (the end of each micro-batch's backward pass), so a
test or a curious user can see that the strategy did its work in a run started from the CLI.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

STATS_ENV = "OMNICORE_OFFLOAD_STATS"


class OffloadOptions(BaseModel):
    """Options of ``fsdp2_offload`` (validated by the registry before the factory is called)."""

    model_config = ConfigDict(extra="forbid")

    pin_memory: bool | None = Field(
        default=None,
        description="copy activations into pinned host memory (asynchronous copies); None: when the model is on an accelerator",
    )


@dataclass
class OffloadStats:
    """What the offload hooks did on this rank, since the strategy was applied.

    ``packed``/``packed_bytes``: activations moved to CPU; ``unpacked``: activations moved back for
    the backward pass; ``kept_parameters``: saved tensors that were parameters (or views of them), left in place;
    ``stored_devices``: the device types the packed copies lived on (``["cpu"]``);
    ``pinned``: how many of the copies were in pinned memory; ``block_forwards``: block forwards run
    inside the context.
    """

    packed: int = 0
    packed_bytes: int = 0
    unpacked: int = 0
    kept_parameters: int = 0
    pinned: int = 0
    block_forwards: int = 0
    stored_devices: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _BlockOffload(torch.autograd.graph.saved_tensors_hooks):
    """``save_on_cpu``'s pack/unpack pair, minus parameters, with counting.

    One instance is entered and left around each block forward; blocks do not nest, so one object
    serves them all.
    """

    def __init__(self, pin_memory: bool, device_type: str, stats: OffloadStats, stats_path: Path | None):
        inner = torch.autograd.graph.save_on_cpu(pin_memory=pin_memory, device_type=device_type)
        self.stats = stats
        self.param_storages: set[int] = set()  # storages of the running block's parameters

        def pack(tensor: torch.Tensor) -> tuple[bool, Any]:
            # autograd saves a weight as a view (``weight.t()``), so compare storages, not objects
            if tensor.untyped_storage().data_ptr() in self.param_storages:
                stats.kept_parameters += 1
                return (False, tensor)
            device, stored = inner.pack_hook(tensor)
            stats.packed += 1
            stats.packed_bytes += stored.numel() * stored.element_size()
            stats.pinned += int(stored.is_pinned()) if stored.device.type == "cpu" else 0
            if stored.device.type not in stats.stored_devices:
                stats.stored_devices.append(stored.device.type)
            return (True, (device, stored))

        def unpack(packed: tuple[bool, Any]) -> torch.Tensor:
            offloaded, value = packed
            if not offloaded:
                return value
            stats.unpacked += 1
            if stats_path is not None and stats.unpacked == stats.packed:
                stats_path.write_text(json.dumps(stats.as_dict()))
            return inner.unpack_hook(value)

        super().__init__(pack, unpack)


def offload_block_activations(
    blocks: list[nn.Module], *, pin_memory: bool, device_type: str = "cuda", stats_path: Path | None = None
) -> OffloadStats:
    """Register hooks on ``blocks`` so that the activations they save for backward live on CPU.

    Args:
        blocks: the modules whose forwards run inside the offload context (``OmniModel.blocks()``).
        pin_memory: copy into pinned host memory, which lets the copies run asynchronously; only
            meaningful when the blocks run on an accelerator.
        device_type: the accelerator's device type, used by ``save_on_cpu`` to check that pinning is
            possible.
        stats_path: a file rewritten with the stats each time every packed activation has been read
            back (``None``: keep them in memory only).

    Returns:
        the live :class:`OffloadStats` the hooks update.
    """
    stats = OffloadStats()
    ctx = _BlockOffload(pin_memory, device_type, stats, stats_path)

    def enter(module: nn.Module, args: Any) -> None:
        stats.block_forwards += 1
        # read after FSDP2's pre-forward hook: these are the all-gathered (unsharded) parameters
        ctx.param_storages = {p.untyped_storage().data_ptr() for p in module.parameters()} - {0}
        ctx.__enter__()

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        ctx.__exit__(None, None, None)

    for block in blocks:
        block.register_forward_pre_hook(enter)
        # always_call: leave the context even when the forward raises, so later code is not offloaded
        block.register_forward_hook(leave, always_call=True)
    return stats


class FSDP2Offload:
    """The ``fsdp2_offload`` strategy: activation offloading to CPU per block, then FSDP2.

    Args:
        options: :class:`OffloadOptions` as a dict (the registry validates them).
    """

    mesh_dims: tuple[str, ...] = ("dp_shard",)

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = OffloadOptions.model_validate(options or {})
        self.stats: OffloadStats | None = None

    def apply(self, model: Any, state: Any) -> Any:
        """Offload hooks on ``model.blocks()``, then ``fully_shard`` per block, per encoder, and the
        root, over the ``dp_shard`` dim of ``state.mesh`` (the whole mesh when it has no such dim)."""
        mesh = getattr(state, "mesh", None)
        from torch.distributed.fsdp import fully_shard

        device = next(model.parameters()).device
        pin = self.options.pin_memory if self.options.pin_memory is not None else device.type != "cpu"
        sub = mesh["dp_shard"] if mesh is not None and mesh.mesh_dim_names and "dp_shard" in mesh.mesh_dim_names else mesh
        rank = sub.get_local_rank() if sub is not None else 0
        stats_path = None
        if os.environ.get(STATS_ENV):
            folder = Path(os.environ[STATS_ENV])
            folder.mkdir(parents=True, exist_ok=True)
            stats_path = folder / f"rank{rank}.json"
        blocks = model.blocks()
        self.stats = offload_block_activations(
            blocks, pin_memory=pin, device_type=device.type if device.type != "cpu" else "cuda", stats_path=stats_path
        )
        if rank == 0:
            print(f"fsdp2_offload: activations of {len(blocks)} blocks saved on CPU (pin_memory={pin})", flush=True)
        for block in blocks:
            fully_shard(block, mesh=sub)
        for module in model.encoders.values():
            fully_shard(module, mesh=sub)
        # decoders stay in the root's group, as in the built-in fsdp2 (they are called a different
        # number of times on ranks whose batch lacks the modality)
        fully_shard(model, mesh=sub)
        return model
