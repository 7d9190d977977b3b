"""Checkpoints with torch.distributed.checkpoint (DCP): model, optimizer, scheduler, step, data
position and RNG, written atomically.

Layout under ``<output_dir>/checkpoints/``::

    step-00000020/        DCP shards of {"model", "optim"} + trainer_state.json + rng-rank<r>.pt
    latest                text file naming the newest complete checkpoint folder

A checkpoint is written to ``.tmp-step-N`` and renamed only once every rank has finished, then
``latest`` is replaced atomically (``os.replace``): a crash mid-save leaves the previous checkpoint
and ``latest`` intact. The saved state can be loaded at any world size (DCP reshards).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


class CheckpointError(Exception):
    """No checkpoint to resume from, or a checkpoint folder is incomplete; the message names it."""


@contextlib.contextmanager
def _quiet_single_process(state: Any) -> Iterator[None]:
    """Silence DCP's warning that it runs without a process group: one process is intended here."""
    with warnings.catch_warnings():
        if not state.distributed:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(
    root: str | Path, step: int, model: Any, optimizer: Any, scheduler: Any, trainer_state: dict[str, Any], state: Any, keep: int = 2
) -> Path:
    """Save a checkpoint for ``step`` (collective: every rank calls it). Returns the folder."""
    root = Path(root)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    if state.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    state.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _quiet_single_process(state):
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / f"rng-rank{state.rank}.pt")
    state.barrier()
    if state.is_main:
        meta = dict(trainer_state, step=step, scheduler=scheduler.state_dict(), world_size=state.world_size)
        (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _atomic_write_text(root / "latest", final.name)
        for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    state.barrier()
    return final


def latest_checkpoint(root: str | Path) -> Path:
    """The folder named by ``<root>/latest``.

    Raises:
        CheckpointError: if there is none, or the folder it names is missing or incomplete.
    """
    root = Path(root)
    pointer = root / "latest"
    if not pointer.is_file():
        raise CheckpointError(f"no checkpoint under {root} (missing {pointer}); train first, or name a checkpoint or export explicitly")
    folder = root / pointer.read_text().strip()
    if not (folder / "trainer_state.json").is_file():
        raise CheckpointError(f"checkpoint {folder} named by {pointer} is incomplete (no trainer_state.json)")
    return folder


def load_checkpoint(folder: str | Path, model: Any, optimizer: Any | None, scheduler: Any | None, state: Any) -> dict[str, Any]:
    """Load model (and optimizer, scheduler, RNG when given) in place; returns the trainer state."""
    folder = Path(folder)
    meta = json.loads((folder / "trainer_state.json").read_text())
    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        sd = {"model": model_sd, "optim": optim_sd}
        with _quiet_single_process(state):
            dcp.load(sd, checkpoint_id=str(folder))
        set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    else:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        sd = {"model": get_model_state_dict(model)}
        with _quiet_single_process(state):
            dcp.load(sd, checkpoint_id=str(folder))
        set_model_state_dict(model, sd["model"])
    if scheduler is not None:
        scheduler.load_state_dict(meta["scheduler"])
    rng_file = folder / f"rng-rank{state.rank}.pt"
    if rng_file.is_file() and meta.get("world_size") == state.world_size:
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
    return meta
