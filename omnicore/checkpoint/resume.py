"""Which checkpoint a resume starts from: the one asked for, ``latest`` verified, or the newest
good one with a word about what was skipped.

Two ways for the training loop to pick a folder (each verifies checksums before anything is read):

* :func:`resolve_resume` (``--resume`` / ``--resume PATH``) is strict: a corrupt newest checkpoint
  fails with the bad file named and the previous good checkpoint offered as ``--resume PATH``.
* :func:`find_good_checkpoint` falls back by itself to the newest good checkpoint and returns a
  message saying what it skipped and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnicore.checkpoint.dcp import checkpoint_step, latest_checkpoint, verify_checkpoint
from omnicore.checkpoint.errors import CheckpointError


def _candidates(root: Path) -> list[Path]:
    """Checkpoint folders to try, best first: the one ``latest`` names, then every complete
    ``step-NNNNNNNN`` folder of a lower step, newest first (folders of a later step than ``latest``,
    left by another run, are not this run's)."""
    named = latest_checkpoint(root)
    top = checkpoint_step(named)
    older = [p for p in root.iterdir() if p.is_dir() and (s := checkpoint_step(p)) is not None and (top is None or s < top)]
    return [named] + sorted(older, key=lambda p: checkpoint_step(p) or 0, reverse=True)


def _check(folder: Path, state: Any | None) -> str | None:
    """None when ``folder`` verifies, else the reason."""
    try:
        verify_checkpoint(folder, state)
    except CheckpointError as e:
        return str(e)
    return None


def find_good_checkpoint(root: str | Path, state: Any | None = None) -> tuple[Path, str]:
    """The newest checkpoint under ``root`` that verifies, and a message saying what was done.

    Args:
        root: the checkpoints folder (``<output_dir>/checkpoints``).
        state: the run's ParallelState on several ranks (verification is then shared and agreed;
            every rank must call this); None on one process.

    Returns:
        ``(folder, message)``: message is ``"resuming from <folder>"``, or names each skipped
        checkpoint with its bad file, then the one used.

    Raises:
        CheckpointError: no checkpoint (naming ``latest``), or none verifies (listing each reason).
    """
    root = Path(root)
    skipped: list[str] = []
    for folder in _candidates(root):
        problem = _check(folder, state)
        if problem is None:
            if not skipped:
                return folder, f"resuming from {folder}"
            return (
                folder,
                f"skipped {len(skipped)} corrupt checkpoint(s) ({'; '.join(skipped)}); resuming from the previous good one, {folder}",
            )
        skipped.append(problem)
    raise CheckpointError(f"no usable checkpoint under {root}: {'; '.join(skipped)}; start a fresh run in another run.output_dir")


def resolve_resume(root: str | Path, path: str | Path | None, state: Any | None = None) -> Path:
    """The verified checkpoint folder to resume from (for ``--resume`` and ``--resume PATH``).

    Args:
        root: the checkpoints folder (``<output_dir>/checkpoints``).
        path: None for the one ``latest`` names; else a checkpoint folder, as a path or as a name
            under ``root`` (``step-00000020``).
        state: as for :func:`find_good_checkpoint`.

    Raises:
        CheckpointError: no such folder; or the folder is corrupt: the message names the bad file
            and, when there is one, the previous good checkpoint to pass as ``--resume PATH``.
    """
    root = Path(root)
    if path is not None:
        folder = Path(path)
        if not folder.is_dir() and (root / folder).is_dir():
            folder = root / folder
        if not folder.is_dir():
            raise CheckpointError(f"--resume {path}: no such checkpoint folder (give a step-NNNNNNNN folder, e.g. under {root})")
    else:
        folder = latest_checkpoint(root)
    problem = _check(folder, state)
    if problem is None:
        return folder
    offer = "; no earlier checkpoint verifies either: start a fresh run in another run.output_dir"
    if root.is_dir() and (root / "latest").is_file():
        for other in _candidates(root):
            if other != folder and (checkpoint_step(other) or 0) < (checkpoint_step(folder) or 0) and _check(other, state) is None:
                offer = f"; the previous checkpoint {other} verifies: resume from it with --resume {other}"
                break
    raise CheckpointError(problem + offer)
