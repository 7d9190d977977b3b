"""Which checkpoint a resume starts from: the one asked for, ``latest`` verified, or the newest
good one with a word about what was skipped.

Two ways for the training loop to pick a folder (each verifies checksums before anything is read):

* :func:`resolve_resume` (``--resume PATH``) is strict: a corrupt checkpoint fails with the bad
  file named and the previous good checkpoint offered as ``--resume PATH``.
* :func:`find_good_checkpoint` (plain ``--resume``) falls back by itself to the newest checkpoint
  that verifies and returns a message saying what it took and why. That covers a bad ``latest``
  too (missing, empty, garbage, or naming a folder that is gone): a crash while a save replaced
  ``step-N`` (:func:`omnicore.checkpoint.dcp.replace_folder`) leaves ``.old-step-N`` (the folder
  as it was) and ``.tmp-step-N`` (the new save, complete once it has its manifest), either of
  which is then a candidate.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omnicore.checkpoint.dcp import checkpoint_step, latest_checkpoint, read_latest, verify_checkpoint
from omnicore.checkpoint.errors import CheckpointError

_SAVED = re.compile(r"^(\.tmp-|\.old-)?step-(\d+)$")

_NEWER = {".tmp-": 2, "": 1, ".old-": 0}
"""Among the folders of one step, the newer first: ``.tmp-step-N`` was written after the
``step-N`` it was about to replace, and ``.old-step-N`` is that one moved aside."""


def _order(folder: Path) -> tuple[int, int]:
    m = _SAVED.match(folder.name)
    return (int(m.group(2)), _NEWER[m.group(1) or ""]) if m else (-1, -1)


def saved_folders(root: Path) -> list[Path]:
    """Every folder under ``root`` that may hold a checkpoint (``step-N``, ``.tmp-step-N``,
    ``.old-step-N``), newest first: by step, then in the order of :data:`_NEWER`."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and _SAVED.match(p.name)), key=_order, reverse=True)


def _candidates(root: Path) -> tuple[list[Path], str | None]:
    """Checkpoint folders to try, best first, and what is wrong with ``latest`` (None when it is
    usable). With a usable ``latest``: the folder it names, then every other folder of that step or
    a lower one, newest first (folders of a later step, left by another run, are not this run's).
    With a bad one: every folder up to the step it names (when it names one), newest first."""
    named, problem = read_latest(root)
    folders = saved_folders(root)
    if named is not None:
        top = checkpoint_step(named) or 0
        return [named] + [p for p in folders if p != named and _order(p)[0] <= top], None
    limit = _named_step(root)
    return [p for p in folders if limit is None or _order(p)[0] <= limit], problem


def _named_step(root: Path) -> int | None:
    """The step of the folder name ``latest`` holds, whether or not that folder exists; else None."""
    try:
        m = _SAVED.match((root / "latest").read_text(errors="replace").strip())
    except OSError:
        return None
    return int(m.group(2)) if m else None


def _check(folder: Path, state: Any | None, verify: bool = True) -> str | None:
    """None when ``folder`` verifies (``verify`` False: when it is complete), else the reason."""
    if not verify:
        return None if (folder / "trainer_state.json").is_file() else f"checkpoint {folder} is incomplete (no trainer_state.json)"
    try:
        verify_checkpoint(folder, state)
    except CheckpointError as e:
        return str(e)
    return None


def _what(folder: Path) -> str:
    """Why a folder not named ``step-N`` holds a checkpoint of step N, for the resume's message."""
    m = _SAVED.match(folder.name)
    if not m or not m.group(1):
        return ""
    name = f"step-{m.group(2)}"
    if m.group(1) == ".tmp-":
        return f" (the complete save of step {int(m.group(2))}, not yet renamed to {name} when it was interrupted)"
    return f" ({name} as it was before an interrupted save replaced it)"


def find_good_checkpoint(root: str | Path, state: Any | None = None, *, verify: bool = True) -> tuple[Path, str]:
    """The newest checkpoint under ``root`` that verifies, and a message saying what was done.

    Args:
        root: the checkpoints folder (``<output_dir>/checkpoints``).
        state: the run's ParallelState on several ranks (verification is then shared and agreed;
            every rank must call this); None on one process.
        verify: False (``run.verify: false``, the user's choice): take the newest complete one
            without checking checksums.

    Returns:
        ``(folder, message)``: message is ``"resuming from <folder>"``; or one line naming what is
        wrong with ``latest`` and each skipped checkpoint with its bad file, then the one taken.

    Raises:
        CheckpointError: no checkpoint (naming ``latest``), or none verifies (listing each reason).
    """
    root = Path(root)
    candidates, problem = _candidates(root)
    if not candidates and not (root / "latest").is_file():
        latest_checkpoint(root)  # raises: no checkpoint at all
    skipped: list[str] = []
    for folder in candidates:
        reason = _check(folder, state, verify)
        if reason is not None:
            skipped.append(reason)
            continue
        if problem is None and not skipped:
            return folder, f"resuming from {folder}"
        said = [problem] if problem else []
        if skipped:
            said.append(f"skipped {len(skipped)} corrupt checkpoint(s) ({'; '.join(skipped)})")
            took = f"resuming from the previous good one, {folder}"
        else:
            took = f"resuming from the newest checkpoint that verifies, {folder}"
        return folder, "; ".join(said) + "; " + took + _what(folder)
    reasons = ([problem] if problem else []) + (skipped or ["no step-NNNNNNNN folder"])
    raise CheckpointError(f"no usable checkpoint under {root}: {'; '.join(reasons)}; start a fresh run in another run.output_dir")


def resolve_resume(root: str | Path, path: str | Path | None, state: Any | None = None, *, verify: bool = True) -> Path:
    """The verified checkpoint folder to resume from (for ``--resume PATH``).

    Args:
        root: the checkpoints folder (``<output_dir>/checkpoints``).
        path: None for the one ``latest`` names; else a checkpoint folder, as a path or as a name
            under ``root`` (``step-00000020``).
        state, verify: as for :func:`find_good_checkpoint`.

    Raises:
        CheckpointError: no such folder; or the folder is corrupt or cannot be verified: the
            message names the bad file and, when there is one, the previous good checkpoint to pass
            as ``--resume PATH``.
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
    problem = _check(folder, state, verify)
    if problem is None:
        return folder
    offer = "; no earlier checkpoint verifies either: start a fresh run in another run.output_dir"
    if root.is_dir() and (root / "latest").is_file():
        for other in _candidates(root)[0]:
            if other != folder and _order(other) < _order(folder) and _check(other, state) is None:
                offer = f"; the previous checkpoint {other} verifies: resume from it with --resume {other}"
                break
    raise CheckpointError(problem + offer)
