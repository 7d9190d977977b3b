"""Checkpoints with torch.distributed.checkpoint (DCP): model, optimizer, scheduler, step, data
position and RNG, written atomically, checksummed, and loaded without running code from the files.

Layout under ``<output_dir>/checkpoints/``::

    step-00000020/        DCP shards of {"model", "optim"} (``.metadata``, ``__<rank>_0.distcp``),
                          trainer_state.json, rng-rank<r>.json, manifest.json (size and sha256 of
                          every other file, see omnicore.checkpoint.manifest)
    latest                text file naming the newest complete checkpoint folder

A checkpoint is written to ``.tmp-step-NNNNNNNN`` (the step, zero-padded to 8 digits) and renamed
only once every rank has finished, then ``latest`` is replaced atomically (``os.replace``): a crash
or an I/O error mid-save (a full disk) leaves the previous checkpoint and ``latest`` intact, and a
failed save raises :class:`CheckpointError` on every rank. The saved state can be loaded at any
world size (DCP reshards). Loading verifies the manifest first, then reads through
:mod:`omnicore.checkpoint.safety` (no pickle code runs).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from omnicore.checkpoint.errors import CheckpointError
from omnicore.checkpoint.manifest import (
    MANIFEST,
    NO_VERIFY,
    merge_manifest,
    missing_manifest,
    rank_files,
    verify_manifest,
    write_manifest_part,
)
from omnicore.checkpoint.safety import read_rng_state, rng_file, safe_dcp_load_args, write_rng_state

__all__ = [
    "CheckpointError",
    "checkpoint_step",
    "latest_checkpoint",
    "load_checkpoint",
    "read_latest",
    "save_checkpoint",
    "verify_checkpoint",
]

_STEP_DIR = re.compile(r"^step-(\d+)$")
_LEFT_OVER = re.compile(r"^\.(?:tmp|old)-step-(\d+)$")  # what an interrupted save leaves (save_checkpoint, replace_folder)


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


def checkpoint_step(folder: Path) -> int | None:
    """The step of a ``step-NNNNNNNN`` folder name, else None."""
    m = _STEP_DIR.match(folder.name)
    return int(m.group(1)) if m else None


def _folder_bytes(folder: Path | None) -> int:
    if folder is None or not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _gather_errors(state: Any, error: str | None) -> list[str]:
    """Every rank's error of one save phase (a collective on several ranks, so all ranks agree)."""
    if not state.distributed:
        return [error] if error else []
    import torch.distributed as dist

    errors: list[str | None] = [None] * state.world_size
    dist.all_gather_object(errors, error)
    return [e for e in errors if e]


def _os_error_of(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: itself, its cause, or one rank's failure inside DCP's
    ``CheckpointException`` (a BaseException holding ``{rank: (exception, traceback)}``)."""
    seen: list[BaseException] = [exc]
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        seen += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    for e in seen:
        while e is not None:
            if isinstance(e, OSError):
                return e
            e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return None


FULL_DISK_MARGIN = 64 * 2**20
"""Bytes of free space below which a failed save is blamed on a full disk (torch's writers report
some full-disk failures as ``RuntimeError: ... unexpected pos``, not as an OSError)."""


def _full_disk(final: Path, previous: Path | None) -> OSError | None:
    """An ENOSPC error for ``final``'s folder when its file system has less free space than the
    previous checkpoint's size (or :data:`FULL_DISK_MARGIN`), else None."""
    try:
        free = shutil.disk_usage(final.parent).free
    except OSError:
        return None
    if free >= max(FULL_DISK_MARGIN, _folder_bytes(previous)):
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final.parent))


def _save_error(final: Path, exc: OSError, previous: Path | None) -> str:
    """One line: which checkpoint failed, why, and what to do."""
    keep = f"; the previous checkpoint {previous} is intact" if previous else ""
    where = exc.filename or final.parent
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        need = _folder_bytes(previous)
        size = f" (a checkpoint takes about {need / 1e6:.1f} MB, the size of {previous.name})" if need and previous else ""
        return f"cannot save checkpoint {final}: the disk is full at {where}{size}; free space or set run.output_dir elsewhere{keep}"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot save checkpoint {final}: {where} is not writable ({exc.strerror}); fix its permissions or set run.output_dir elsewhere{keep}"
    if exc.errno == errno.EFBIG:
        return f"cannot save checkpoint {final}: a file exceeds the file-size limit at {where} ({exc.strerror}); raise the limit (ulimit -f) or use another file system{keep}"
    return f"cannot save checkpoint {final}: {exc.strerror or exc} at {where}{keep}"


def _phase(state: Any, final: Path, previous: Path | None, fn: Callable[[], None], *, main_only: bool = False) -> None:
    """Run one save phase on every rank (or rank 0), then agree: any rank's OSError becomes the
    same :class:`CheckpointError` on all ranks (no rank is left waiting in a collective)."""
    error = None
    try:
        if state.is_main or not main_only:
            fn()
    except CheckpointError as e:
        error = str(e)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        os_error = _os_error_of(e) or _full_disk(final, previous)
        if os_error is None:
            raise
        error = _save_error(final, os_error, previous)
    errors = _gather_errors(state, error)
    if errors:
        if state.is_main:
            shutil.rmtree(final.with_name(f".tmp-{final.name}"), ignore_errors=True)
        raise CheckpointError(errors[0])


def save_checkpoint(
    root: str | Path, step: int, model: Any, optimizer: Any, scheduler: Any, trainer_state: dict[str, Any], state: Any, keep: int = 2
) -> Path:
    """Save a checkpoint for ``step`` (collective: every rank calls it). Returns the folder.

    Writes ``.tmp-step-NNNNNNNN`` (DCP shards, RNG JSON, trainer state, manifest), renames it to
    ``step-NNNNNNNN``, points ``latest`` at it, then prunes (:func:`prune_checkpoints`).

    Raises:
        CheckpointError: on every rank, when any rank's write fails with an OSError (full disk,
            read-only folder, file-size limit): one line naming the folder and what to do; the
            previous checkpoint and ``latest`` are left as they were.
    """
    root = Path(root)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    previous = _previous(root)

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()

    def write_shards() -> None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        with _quiet_single_process(state):
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        write_rng_state(rng_file(tmp, state.rank))
        write_manifest_part(tmp, state.rank, rank_files(tmp, state.rank))

    def publish() -> None:
        meta = dict(trainer_state, step=step, scheduler=scheduler.state_dict(), world_size=state.world_size)
        (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=1))
        merge_manifest(tmp, state.world_size, [".metadata", "trainer_state.json"])
        replace_folder(tmp, final)
        _atomic_write_text(root / "latest", final.name)
        prune_checkpoints(root, final, keep)

    _phase(state, final, previous, prepare, main_only=True)
    _phase(state, final, previous, write_shards)
    _phase(state, final, previous, publish, main_only=True)
    return final


def _previous(root: Path) -> Path | None:
    """The folder ``latest`` names now, if it exists (the checkpoint a failed save leaves intact)."""
    pointer = root / "latest"
    try:
        folder = root / pointer.read_text().strip()
    except OSError:
        return None
    return folder if folder.is_dir() and folder != root else None


def replace_folder(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is moved aside first and deleted after, so
    there is no moment without one complete folder named ``dst`` or its replacement."""
    if dst.exists():
        aside = dst.with_name(f".old-{dst.name}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(dst, aside)
        os.replace(src, dst)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(src, dst)


def prune_checkpoints(root: Path, just_saved: Path, keep: int) -> list[Path]:
    """Delete checkpoints older than ``just_saved`` beyond the ``keep`` newest; returns those deleted.

    Only ``step-NNNNNNNN`` folders with a step below the step just saved are candidates (ordered by step
    number, not by name): the checkpoint just written, the one ``latest`` names, and folders of a
    later step (another run's, left in the folder) are never deleted. The ``.tmp-step-N`` and
    ``.old-step-N`` folders an interrupted save left behind (a resume may have started from one:
    :func:`omnicore.checkpoint.resume.find_good_checkpoint`) are deleted once a later step is saved.
    """
    current = checkpoint_step(just_saved)
    named = _previous(root)
    older = sorted(
        (p for p in root.iterdir() if p.is_dir() and (s := checkpoint_step(p)) is not None and current is not None and s < current),
        key=checkpoint_step,  # type: ignore[arg-type]
    )
    doomed = [p for p in older[: max(len(older) - (max(keep, 1) - 1), 0)] if p != named]
    for p in root.iterdir():
        m = _LEFT_OVER.match(p.name)
        if m and p.is_dir() and current is not None and int(m.group(1)) < current:
            doomed.append(p)
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def read_latest(root: str | Path) -> tuple[Path | None, str | None]:
    """The complete checkpoint folder ``<root>/latest`` names, or ``(None, what is wrong)``: the
    pointer is missing, empty or unreadable, names no ``step-NNNNNNNN`` folder, or names one that is
    missing (a crash while a save replaced it) or incomplete (no ``trainer_state.json``)."""
    root = Path(root)
    pointer = root / "latest"
    if not pointer.is_file():
        return None, f"{pointer} is missing"
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{pointer} is unreadable ({type(e).__name__})"
    if not name:
        return None, f"{pointer} is empty"
    if checkpoint_step(Path(name)) is None or "/" in name:
        return None, f"{pointer} holds {name[:40]!r}, not a step-NNNNNNNN folder name"
    folder = root / name
    if not folder.is_dir():
        return None, f"{pointer} names {name}, which does not exist (a save that replaced it was interrupted?)"
    if not (folder / "trainer_state.json").is_file():
        return None, f"{pointer} names {name}, which is incomplete (no trainer_state.json)"
    return folder, None


def latest_checkpoint(root: str | Path) -> Path:
    """The folder named by ``<root>/latest`` (:func:`read_latest`).

    Raises:
        CheckpointError: if there is none, or the pointer or the folder it names is bad (what is
            wrong is named; :func:`omnicore.checkpoint.resume.find_good_checkpoint` falls back to
            the newest checkpoint that verifies instead).
    """
    root = Path(root)
    folder, problem = read_latest(root)
    if folder is not None:
        return folder
    if not (root / "latest").is_file():
        raise CheckpointError(
            f"no checkpoint under {root} (missing {root / 'latest'}); train first, or name a checkpoint or export explicitly"
        )
    raise CheckpointError(
        f"{problem}; give a checkpoint folder explicitly ({root}/step-NNNNNNNN; `omnicore train --resume` takes the newest that verifies)"
    )


def verify_checkpoint(folder: str | Path, state: Any | None = None) -> None:
    """Check ``folder``'s files against its manifest (collective when ``state`` is distributed:
    each rank hashes its share of the files).

    Raises:
        CheckpointError: naming the first bad file (missing, other size, other sha256, unlisted);
            or the folder has no manifest, so nothing can be verified (a save that did not finish,
            or a checkpoint written before checksums): refused, with the way to load it unchecked
            when the user asks (``run.verify: false``, whose callers skip this check).
    """
    folder = Path(folder)
    if not (folder / "trainer_state.json").is_file():
        raise CheckpointError(f"checkpoint {folder} is incomplete (no trainer_state.json)")
    if not (folder / MANIFEST).is_file():  # the same answer on every rank: no collective needed
        raise CheckpointError(f"checkpoint {folder} cannot be verified: {missing_manifest(folder)}; use another checkpoint, {NO_VERIFY}")
    shard = (state.rank, state.world_size) if state is not None and state.distributed else (0, 1)
    problem = None
    try:
        problem = verify_manifest(folder, shard)
    except CheckpointError as e:
        problem = str(e)
    problems = _gather_errors(state, problem) if state is not None else [p for p in [problem] if p]
    if problems:
        raise CheckpointError(f"checkpoint {folder} is corrupt: {problems[0]}")


def _dcp_load(sd: dict[str, Any], folder: Path, state: Any) -> None:
    """``dcp.load`` through the safe reader; DCP's CheckpointException (a BaseException holding
    each rank's failure) becomes one :class:`CheckpointError` naming the folder."""
    try:
        with _quiet_single_process(state):
            dcp.load(sd, checkpoint_id=str(folder), **safe_dcp_load_args(folder))
    except CheckpointError:
        raise
    except BaseException as e:
        failures = getattr(e, "failures", None)
        if not isinstance(failures, dict):
            if isinstance(e, Exception):
                raise CheckpointError(f"checkpoint {folder} failed to load: {type(e).__name__}: {e}{_shape_hint(e)}") from e
            raise
        causes = [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        for c in causes:
            if isinstance(c, CheckpointError):
                raise c from e
        first = causes[0] if causes else e
        raise CheckpointError(f"checkpoint {folder} failed to load: {type(first).__name__}: {first}{_shape_hint(first)}") from e


def _shape_hint(exc: BaseException) -> str:
    """What a missing, unexpected or resized key means, for a load that failed on one: this run's
    model or the set of trained parameters (``train.freeze``, ``model.lora``) is not the
    checkpoint's. (A checkpoint that keeps its config is compared before loading:
    :mod:`omnicore.checkpoint.changes` names the setting.)"""
    text = str(exc)
    if not any(k in text for k in ("Missing key", "Unexpected key", "size mismatch")):
        return ""
    return (
        "; this run's model (its shape, model.lora) or its trained parameters (train.freeze) differ from the checkpoint's: "
        "resume with the settings that wrote it, or start a new run from its weights with model.init_from"
    )


def load_checkpoint(
    folder: str | Path, model: Any, optimizer: Any | None, scheduler: Any | None, state: Any, *, verify: bool = True
) -> dict[str, Any]:
    """Load model (and optimizer, scheduler, RNG when given) in place; returns the trainer state.

    Args:
        verify: check the manifest first (:func:`verify_checkpoint`); False when the caller just
            did (:func:`omnicore.checkpoint.resume.resolve_resume`), or the user asked to load it
            unchecked (``run.verify: false``).

    Raises:
        CheckpointError: the folder is incomplete, corrupt (naming the file) or has no manifest
            (when ``verify``), or a file holds anything but tensors, DCP metadata or JSON (it is
            refused, never run).
    """
    folder = Path(folder)
    if verify:
        verify_checkpoint(folder, state)
    try:
        meta = json.loads((folder / "trainer_state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder / 'trainer_state.json'}: unreadable ({e}); resume from an earlier checkpoint") from e
    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        sd = {"model": model_sd, "optim": optim_sd}
        _dcp_load(sd, folder, state)
        set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    else:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        sd = {"model": get_model_state_dict(model)}
        _dcp_load(sd, folder, state)
        set_model_state_dict(model, sd["model"])
    if scheduler is not None:
        scheduler.load_state_dict(meta["scheduler"])
    if meta.get("world_size") == state.world_size:
        for rng in (rng_file(folder, state.rank), folder / f"rng-rank{state.rank}.pt"):  # .pt: written before JSON
            if rng.is_file():
                read_rng_state(rng)
                break
    return meta
