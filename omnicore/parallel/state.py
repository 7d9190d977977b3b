"""Process group and DeviceMesh set-up from torchrun's environment, and the query API strategies use.

``torchrun --nproc-per-node N -m omnicore train CONFIG`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; without them omnicore runs as one process with
no process group. The mesh has the named dims of :mod:`omnicore.parallel.mesh`
(``dp_replicate x dp_shard x ep x sp``, sizes from the config's ``parallel`` section) plus the
derived dims ``dp``, ``fsdp`` and ``dp_shard_sp``. On one process every dim has size 1, every rank
query answers 0 and every group is ``None``, so strategies need no special case.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from omnicore.parallel.mesh import FLAT_DIMS, MESH_DIMS, MeshLayout


@dataclass
class ParallelState:
    """Where this process stands: ``rank``/``world_size`` (1 with no process group), the torch
    ``device``, the ``mesh`` (a DeviceMesh with the named dims, or None on one process) and its
    ``layout`` (sizes and rank arithmetic, see :class:`~omnicore.parallel.mesh.MeshLayout`)."""

    rank: int
    world_size: int
    local_rank: int
    device: Any
    mesh: Any = None
    layout: MeshLayout = field(default=None)  # type: ignore[assignment]
    flat_meshes: dict[str, Any] = field(default_factory=dict, repr=False)
    """The 1-D meshes of the derived dims, as ``_flatten`` returned them (torch asks callers to
    keep these rather than slice flattened dims from the root mesh)."""
    mixed_precision: str = "none"
    """The run's ``train.mixed_precision`` (``none`` or ``bf16``): a sharding strategy that can
    gather parameters in low precision (FSDP2's ``MixedPrecisionPolicy``) reads it here, keeping
    parameters, gradient reductions and optimizer state in fp32."""

    def __post_init__(self) -> None:
        if self.layout is None:
            self.layout = MeshLayout.data_parallel(self.world_size)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.mesh is not None

    # ---- queries --------------------------------------------------------------------------------

    def size(self, dim: str) -> int:
        """Ranks in this rank's group of ``dim`` (``dp_replicate``, ``dp_shard``, ``ep``, ``sp``,
        or a derived dim ``dp``, ``fsdp``, ``dp_shard_sp``)."""
        return self.layout.size(dim)

    def rank_in(self, dim: str) -> int:
        """This rank's index within its group of ``dim``."""
        return self.layout.rank_in(dim, self.rank)

    def group(self, dim: str) -> Any:
        """The ProcessGroup of ``dim`` for this rank, or None on one process."""
        return self.submesh(dim).get_group() if self.distributed else None

    def group_ranks(self, dim: str) -> list[int]:
        """The global ranks of this rank's group of ``dim``, in group order."""
        return self.layout.group_of(dim, self.rank)

    def submesh(self, *dims: str) -> Any:
        """The DeviceMesh over ``dims`` (real or derived, outer first), or None on one process."""
        if not self.distributed:
            return None
        # a derived dim whose other parts have size 1 has exactly the groups of one real dim: use
        # that (plain slicing, no flattened dim involved)
        dims = tuple(self._real(d) for d in dims)
        if len(dims) == 1:
            return self.flat_meshes[dims[0]] if dims[0] in self.flat_meshes else self.mesh[dims[0]]
        if not any(d in self.flat_meshes for d in dims):
            return self.mesh[dims]
        import warnings

        with warnings.catch_warnings():
            # torch 2.13 warns that slicing a flattened dim from the root mesh "will be deprecated";
            # it is still the only way to get a 2-D (dp_replicate, fsdp) mesh for HSDP
            warnings.filterwarnings("ignore", message="Slicing a flattened dim")
            return self.mesh[dims]

    def _real(self, dim: str) -> str:
        parts = FLAT_DIMS.get(dim, ())
        big = [d for d in parts if self.layout.sizes[d] > 1]
        return big[0] if parts and len(big) == 1 else dim

    @property
    def dp_rank(self) -> int:
        """The data shard this rank reads: ranks that differ only in ``sp`` read the same samples."""
        return self.rank_in("dp")

    @property
    def dp_size(self) -> int:
        """How many different data shards one step reads (``dp_replicate x dp_shard x ep``)."""
        return self.size("dp")

    def fsdp_mesh(self, shard_dim: str = "fsdp") -> Any:
        """The mesh FSDP2 shards over: 1-D ``shard_dim``, or 2-D ``(dp_replicate, shard_dim)`` for
        HSDP when ``dp_replicate`` > 1. ``shard_dim`` is ``fsdp`` for dense parameters and
        ``dp_shard_sp`` for expert parameters already split over ``ep``."""
        if self.size("dp_replicate") > 1:
            return self.submesh("dp_replicate", shard_dim)
        return self.submesh(shard_dim)

    # ---- collectives ----------------------------------------------------------------------------

    def all_reduce_sum(self, value: float, dim: str | None = None) -> float:
        """Sum a Python number over all ranks, or over this rank's group of ``dim`` (identity on
        one process)."""
        return self.all_reduce_sums([value], dim)[0]

    def all_reduce_sums(self, values: list[float], dim: str | None = None) -> list[float]:
        """Sum several Python numbers element-wise over the ranks in one collective (float64)."""
        if not self.distributed:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t, group=self.group(dim) if dim is not None else None)
        return t.tolist()

    def all_reduce_named(self, values: dict[str, float], dim: str | None = None) -> dict[str, float]:
        """Sum named Python numbers over the ranks in one collective (:meth:`all_reduce_sums` of the
        values in the mapping's order, float64) and return the sums under the same names, so that
        callers read them by name instead of by position. Every rank must pass the same names in the
        same order (each name's position in the packed tensor must match on every rank)."""
        return dict(zip(values, self.all_reduce_sums(list(values.values()), dim)))

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()


def flatten_dims(mesh: Any, dims: tuple[str, ...], name: str) -> Any:
    """Flatten ``dims`` of ``mesh`` into one dim called ``name`` (reachable as ``mesh[name]``).

    The only place omnicore uses the private ``DeviceMesh._flatten`` (the one way to flatten dims
    in torch 2.13, as torchtitan does); if a torch release renames it, fix it here.
    """
    return mesh[dims]._flatten(name)


def build_device_mesh(device_type: str, layout: MeshLayout) -> tuple[Any, dict[str, Any]]:
    """The DeviceMesh of ``layout`` and the 1-D meshes of its derived dims (a collective: all
    ranks call it, in the same order)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, layout.shape, mesh_dim_names=MESH_DIMS)
    flat = {name: flatten_dims(mesh, dims, name) for name, dims in FLAT_DIMS.items()}
    return mesh, flat


def init_parallel_state(device: str = "auto", backend: str = "auto", parallel: Any = None) -> ParallelState:
    """Initialise the process group when launched by torchrun, and build the DeviceMesh.

    Args:
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
        backend: ``auto`` (nccl on CUDA, gloo on CPU), ``gloo`` or ``nccl``.
        parallel: the config's ``parallel`` section (or a dict) with the dim sizes; None puts every
            rank in ``dp_shard``.

    Raises:
        MeshError: the sizes do not fit the world size (raised before any process group starts).
    """
    import torch

    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    layout = MeshLayout.from_config(parallel, world) if parallel is not None else MeshLayout.data_parallel(world)
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world == 1:
        return ParallelState(0, 1, 0, dev, None, layout)
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    mesh, flat = build_device_mesh(dev.type, layout)
    return ParallelState(dist.get_rank(), world, local_rank, dev, mesh, layout, flat)


def shutdown(state: ParallelState, exit_code: int | None = None) -> None:
    """Barrier, destroy the process group, flush, and (when ``exit_code`` is given) ``os._exit``.

    ``os._exit`` sidesteps a gloo bug where exit-time destructors abort a correct run with SIGABRT,
    so that torchrun reports a correct run as a success; the barrier and destroy before it make the
    abort rarer still (how often each sequence aborted is in ``bench/README.md``).
    """
    if state.distributed:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    if exit_code is not None and state.distributed:
        os._exit(exit_code)
