"""Run a function on N gloo processes and compare it with one process: the harness behind every
"N ranks equal one rank" test of omnicore and its parallel plugins.

::

    from omnicore.testing.distributed import run_distributed, max_rel_diff

    def step(n_layers):                  # module level: spawned ranks import it by name
        state = init_parallel_state("cpu", "gloo", {"dp_shard": -1})
        ...
        return {"loss": loss, "grads": grads}   # anything torch.save can write

    def test_fsdp2_matches_one_process():
        ref = step(2)                               # the one-process reference, in this process
        ranks = run_distributed(step, 2, args=(2,)) # [rank0_result, rank1_result]
        assert max_rel_diff(ranks[0]["loss"], ref["loss"]) <= 1e-5

How it runs: ``torch.multiprocessing.start_processes(..., "spawn")``; each rank gets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``OMP_NUM_THREADS=1`` in its environment and a process group
initialised through a ``file://`` store in a fresh temporary folder, so
:func:`omnicore.parallel.state.init_parallel_state` finds it ready. A rank writes its return value
with ``torch.save`` to that folder, then runs ``barrier``, ``destroy_process_group``, flushes and
``os._exit(0)`` (gloo's exit-time destructors sometimes abort a correct run; see CPU-NOTES). A rank
that raises writes its traceback and exits 1; the harness then stops the other ranks (they would
wait forever in a collective) and raises :class:`DistributedTestError` with every traceback.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


class DistributedTestError(AssertionError):
    """A rank raised, died or timed out; the message holds each failing rank's traceback."""


def _worker(rank: int, fn: Callable[..., Any], world_size: int, folder: str, backend: str, args: tuple, kwargs: dict) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1"
    )
    out = Path(folder)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(backend, init_method=f"file://{out / 'store'}", rank=rank, world_size=world_size)
        result = fn(*args, **kwargs)
        torch.save(result, out / f"rank-{rank}.tmp")
        os.replace(out / f"rank-{rank}.tmp", out / f"rank-{rank}.pt")
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:
        (out / f"rank-{rank}.err").write_text(traceback.format_exc())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _wait(processes: list[Any], out: Path, timeout: float) -> str | None:
    """Wait for the spawned ranks; on the first failure (an error file, a non-zero exit) or after
    ``timeout`` seconds kill the ranks still alive and return why, else return None."""
    deadline = time.monotonic() + timeout
    failed: str | None = None
    while any(p.is_alive() for p in processes):
        if any(out.glob("rank-*.err")) or any(p.exitcode not in (None, 0) for p in processes):
            time.sleep(0.5)  # let the failing rank finish writing; others may fail too
            failed = "a rank failed"
            break
        if time.monotonic() > deadline:
            failed = f"timed out after {timeout:.0f} s"
            break
        time.sleep(0.05)
    if failed:
        for p in processes:  # only the ranks this call started
            if p.is_alive():
                p.kill()
    return failed


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    args: Iterable[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    backend: str = "gloo",
    timeout: float = 300.0,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` spawned ranks; return their results by rank.

    Args:
        fn: a module-level function (spawned ranks import it by its qualified name). It may call
            ``init_parallel_state``; the default process group already exists.
        world_size: number of processes (keep it at 2 or 4 on a small CPU machine).
        args, kwargs: passed to ``fn``; must pickle.
        backend: ``gloo`` (CPU) or ``nccl``.
        timeout: seconds for the whole run before every rank is stopped.

    Raises:
        DistributedTestError: a rank raised (its traceback is in the message), exited without a
            result, or the run exceeded ``timeout``.
    """
    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="omnicore-dist-") as folder:
        ctx = mp.start_processes(
            _worker,
            args=(fn, world_size, folder, backend, tuple(args), dict(kwargs or {})),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        out = Path(folder)
        failed = _wait(ctx.processes, out, timeout)
        for p in ctx.processes:
            p.join(5)
        errors = []
        for r in range(world_size):
            err = out / f"rank-{r}.err"
            if err.is_file():
                errors.append(f"--- rank {r} raised:\n{err.read_text()}")
            elif not (out / f"rank-{r}.pt").is_file():
                code = ctx.processes[r].exitcode
                errors.append(f"--- rank {r} gave no result (exit code {code}{', stopped by the harness' if failed else ''})")
        if failed or errors:
            raise DistributedTestError(
                f"{world_size}-process run of {fn.__module__}.{fn.__qualname__}: {failed or 'a rank failed'}\n" + "\n".join(errors)
            )
        return [torch.load(out / f"rank-{r}.pt", weights_only=False) for r in range(world_size)]


def max_rel_diff(got: Any, want: Any, eps: float = 1e-12) -> float:
    """``max |got - want| / max(max |want|, eps)`` over tensors, numbers or dicts/lists of them
    (the largest over all entries); dict keys must match."""
    import torch

    if isinstance(want, dict):
        if set(got) != set(want):
            raise AssertionError(
                f"keys differ: only in result {sorted(set(got) - set(want))}, only in reference {sorted(set(want) - set(got))}"
            )
        return max((max_rel_diff(got[k], want[k], eps) for k in want), default=0.0)
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            raise AssertionError(f"lengths differ: {len(got)} vs {len(want)}")
        return max((max_rel_diff(g, w, eps) for g, w in zip(got, want)), default=0.0)
    g = torch.as_tensor(got, dtype=torch.float64)
    w = torch.as_tensor(want, dtype=torch.float64)
    if g.shape != w.shape:
        raise AssertionError(f"shapes differ: {tuple(g.shape)} vs {tuple(w.shape)}")
    if w.numel() == 0:
        return 0.0
    return float((g - w).abs().max() / max(float(w.abs().max()), eps))
