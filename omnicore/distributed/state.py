"""Process group and DeviceMesh set-up from torchrun's environment.

``torchrun --nproc-per-node N -m omnicore train CONFIG`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; without them omnicore runs as one process with
no process group. The mesh has one named dim, ``dp_shard``, spanning every rank.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any


@dataclass
class ParallelState:
    """Where this process stands: ``rank``/``world_size`` (1 with no process group), the torch
    ``device``, and the ``mesh`` (a DeviceMesh with dim ``dp_shard``, or None on one process)."""

    rank: int
    world_size: int
    local_rank: int
    device: Any
    mesh: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.mesh is not None

    def all_reduce_sum(self, value: float) -> float:
        """Sum a Python number over all ranks (identity on one process)."""
        if not self.distributed:
            return float(value)
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(t)
        return float(t.item())

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()


def init_parallel_state(device: str = "auto", backend: str = "auto") -> ParallelState:
    """Initialise the process group when launched by torchrun, and build the DeviceMesh.

    Args:
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
        backend: ``auto`` (nccl on CUDA, gloo on CPU), ``gloo`` or ``nccl``.
    """
    import torch

    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world == 1:
        return ParallelState(0, 1, 0, dev, None)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("dp_shard",))
    return ParallelState(dist.get_rank(), world, local_rank, dev, mesh)


def shutdown(state: ParallelState, exit_code: int | None = None) -> None:
    """Barrier, destroy the process group, flush, and (when ``exit_code`` is given) ``os._exit``.

    ``os._exit`` sidesteps a gloo bug where exit-time destructors abort a correct run with SIGABRT
    (measured in ../shared/CPU-NOTES.md: none in 70 runs with this sequence).
    """
    if state.distributed:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    if exit_code is not None and state.distributed:
        os._exit(exit_code)
