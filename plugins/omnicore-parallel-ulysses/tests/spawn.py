"""A small spawn-based helper: run ``fn(rank, world, *args)`` on ``world`` gloo processes.

(Written because ``omnicore/testing/distributed.py``, the core's harness, did not exist yet when
these tests were written.) Each rank initialises gloo through a ``file://`` rendezvous, runs the
function, then ends with barrier, ``destroy_process_group``, flushing output and ``os._exit(0)``
(the sequence that avoids gloo's exit-time SIGABRT, see CPU-NOTES).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Callable


def _entry(rank: int, fn: Callable[..., Any], world: int, init: str, args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    fn(rank, world, *args)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_on_processes(fn: Callable[..., Any], world: int, *args: Any) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned processes; raises if any rank fails.
    ``fn`` must be importable at module level."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.start_processes(_entry, args=(fn, world, init, args), nprocs=world, start_method="spawn", join=True)
