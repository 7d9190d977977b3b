"""The one error type of checkpoint and run-folder problems (the CLI prints it as one ``error:`` line, exit 2)."""

from __future__ import annotations


class CheckpointError(Exception):
    """No checkpoint to resume from, a checkpoint folder that is incomplete, corrupt or unsafe, a
    failed save (full disk, read-only folder), or an output folder held by another run; the
    message names the folder or file and what to do."""
