"""Checksums of a checkpoint folder: ``manifest.json`` maps each file to its size and sha256.

At save, each rank hashes the files it wrote (its ``__<rank>_*.distcp`` shards and its RNG file)
into ``manifest-rank<r>.json``; after the barrier rank 0 adds the files it writes alone
(``.metadata``, ``trainer_state.json``) and merges the parts into ``manifest.json``::

    {"format": 1, "files": {".metadata": {"size": 1234, "sha256": "ab..."}, ...}}

At load, :func:`verify_manifest` checks every listed file (and that no unlisted file is present)
before DCP reads anything. Hashing costs about one more read of the files (sha256 is about as
fast as a disk; files are hashed on several threads, and with several ranks each verifies its share
of the files).

A folder without ``manifest.json`` cannot be verified (a save that did not finish, or a checkpoint
written before checksums existed) and is refused; ``run.verify: false`` (``--no-verify``) loads
it unchecked when the user asks.

An export (:mod:`omnicore.checkpoint.export`) carries the same ``manifest.json`` at its top, with
the path of every file under it (``foundation/model.safetensors``): :func:`write_tree_manifest`,
:func:`verify_export`.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from omnicore.checkpoint.errors import CheckpointError

MANIFEST = "manifest.json"
_CHUNK = 1 << 22  # 4 MiB reads
_THREADS = min(8, os.cpu_count() or 1)  # sha256 releases the GIL: files hash in parallel

NO_VERIFY = "or load it unchecked with --no-verify (run.verify: false)"
"""The way past a refusal, at the end of the messages that refuse what cannot be verified."""


def file_digest(path: Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of one file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return {"size": path.stat().st_size, "sha256": h.hexdigest()}


def _part(folder: Path, rank: int) -> Path:
    return folder / f"manifest-rank{rank}.json"


def write_manifest_part(folder: Path, rank: int, names: list[str]) -> None:
    """Hash ``names`` (files of ``folder`` written by ``rank``) into ``manifest-rank<rank>.json``."""
    digests = {n: file_digest(folder / n) for n in sorted(names)}
    _part(folder, rank).write_text(json.dumps(digests))


def rank_files(folder: Path, rank: int) -> list[str]:
    """The files of ``folder`` that ``rank`` wrote: its DCP shards ``__<rank>_*.distcp`` and its
    RNG file (DCP names each rank's shards with that prefix, torch 2.13 ``filesystem.py``)."""
    return [p.name for p in folder.glob(f"__{rank}_*") if p.is_file()] + [p.name for p in folder.glob(f"rng-rank{rank}.*")]


def merge_manifest(folder: Path, world_size: int, own: list[str]) -> None:
    """On rank 0, after every rank wrote its part: hash ``own`` (the files only rank 0 writes),
    merge the ``world_size`` parts into ``manifest.json`` and delete the parts.

    Raises:
        CheckpointError: a rank's part is missing (that rank did not finish its save).
    """
    files: dict[str, Any] = {n: file_digest(folder / n) for n in own}
    for r in range(world_size):
        part = _part(folder, r)
        if not part.is_file():
            raise CheckpointError(f"{folder}: rank {r} wrote no {part.name}; its save did not finish")
        files.update(json.loads(part.read_text()))
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"format": 1, "files": dict(sorted(files.items()))}, indent=1))
    os.replace(tmp, folder / MANIFEST)
    for r in range(world_size):
        _part(folder, r).unlink()


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The ``files`` table of ``folder/manifest.json``; None for a checkpoint written before
    checksums existed (no manifest).

    Raises:
        CheckpointError: the manifest is not valid JSON of that form.
    """
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        ok = all(isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str) for v in files.values())
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path}: unreadable checksum manifest ({e}); the checkpoint is damaged, use an earlier one") from e
    if not ok:
        raise CheckpointError(f"{path}: entries need an integer size and a sha256; the checkpoint is damaged, use an earlier one")
    return files


def check_files(folder: Path, files: dict[str, Any], names: list[str]) -> str | None:
    """The first problem among ``names`` (entries of ``files``, paths relative to ``folder``), as
    ``"<path>: <what>"``, or None: missing files and sizes first (cheap), then the sha256 of each
    (on :data:`_THREADS` threads)."""
    for name in names:
        path, want = folder / name, files[name]
        if not path.is_file():
            return f"{path}: missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{path}: {size} bytes, the manifest says {want['size']}"
    with ThreadPoolExecutor(max_workers=_THREADS) as pool:
        digests = list(pool.map(lambda n: file_digest(folder / n)["sha256"], names))
    for name, got in zip(names, digests):
        if got != files[name]["sha256"]:
            return f"{folder / name}: sha256 differs from the manifest (corrupt bytes)"
    return None


def verify_manifest(folder: str | Path, shard: tuple[int, int] = (0, 1)) -> str | None:
    """Check ``folder`` against its manifest before anything is read from it.

    Args:
        folder: a checkpoint folder.
        shard: ``(i, n)``: check only every n-th listed file starting at i (ranks share the work);
            unlisted files are reported by shard 0.

    Returns:
        None when the folder matches; else ``"<path>: <what>"`` naming the first bad file, or the
        missing manifest (:func:`missing_manifest`).

    Raises:
        CheckpointError: the manifest itself is unreadable.
    """
    folder = Path(folder)
    files = read_manifest(folder)
    if files is None:
        return missing_manifest(folder)
    i, n = shard
    if i == 0:
        extra = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST and p.name not in files)
        if extra:
            return f"{folder / extra[0]}: not in the checkpoint's manifest (a file added after the save)"
    return check_files(folder, files, sorted(files)[i::n])


def missing_manifest(folder: Path) -> str:
    """The problem of a folder without ``manifest.json``: nothing in it can be verified."""
    return f"{folder / MANIFEST}: missing, so its files cannot be verified (a save that did not finish, or written before checksums)"


# ---- exports ----------------------------------------------------------------------------------------


def _tree(folder: Path) -> list[str]:
    """Every file under ``folder`` but the manifest, as sorted POSIX paths relative to it."""
    names = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return sorted(n for n in names if n not in (MANIFEST, f".{MANIFEST}.tmp"))


def write_tree_manifest(folder: str | Path) -> None:
    """Hash every file under ``folder`` (an export, written last: nothing may change after it) into
    ``folder/manifest.json``, keyed by its path relative to ``folder``."""
    folder = Path(folder)
    names = _tree(folder)
    with ThreadPoolExecutor(max_workers=_THREADS) as pool:
        digests = list(pool.map(lambda n: file_digest(folder / n), names))
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"format": 1, "files": dict(zip(names, digests))}, indent=1))
    os.replace(tmp, folder / MANIFEST)


def verify_export(folder: str | Path) -> None:
    """Check every file of the export ``folder`` against its ``manifest.json`` (and that no file
    was added) before anything is read from it.

    Raises:
        CheckpointError: one line naming the first bad file (missing, another size, another
            sha256, not listed) or the missing manifest (an export written before exports carried
            checksums), and what to do.
    """
    folder = Path(folder)
    files = read_manifest(folder)
    if files is None:
        raise CheckpointError(
            f"export {folder} cannot be verified: {missing_manifest(folder)}; export the run again (--resume of a finished run "
            f"exports it), {NO_VERIFY}"
        )
    extra = [n for n in _tree(folder) if n not in files]
    problem = f"{folder / extra[0]}: not in the export's manifest (a file added after the export)" if extra else None
    problem = problem or check_files(folder, files, sorted(files))
    if problem:
        raise CheckpointError(
            f"export {folder} is damaged: {problem}; restore it from a copy or export the run again from its checkpoint, {NO_VERIFY}"
        )
