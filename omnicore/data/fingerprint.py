"""A fingerprint of what a run reads, kept in every checkpoint, so that a resume on other data is
refused instead of training on it silently (the same samples reordered give other losses).

Each file of each source gets ``"<size>:<sha256 prefix>"`` of its bytes: the whole file up to
:data:`WHOLE_BYTES`, beyond that :data:`BLOCKS` blocks of :data:`BLOCK_BYTES` spread evenly from its
first byte to its last. Size and mtime alone miss a same-size rewrite (lines reordered, a digit
changed); hashing every byte costs a full read of the data at every start (minutes for a
hundred-gigabyte Parquet set). The sampled blocks cost at most 1 MiB per file whatever its size, so
a million samples in one file or in a thousand shards cost milliseconds to a second, and they catch
any change of size, any reordering (which moves the first and last blocks) and any edit inside a
sampled block. An edit that keeps the size and falls between the blocks of a file over 1 MiB is
not caught. A dataset from the Hugging Face cache (no local file) is named by the fingerprint
``datasets`` keeps of it. Media files a sample names by path are not covered.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

WHOLE_BYTES = 1 << 20
"""Files up to this size are hashed whole."""

BLOCKS = 16
BLOCK_BYTES = 1 << 16
"""Larger files: this many blocks of this many bytes, at evenly spaced offsets (the first at 0, the
last ending at the file's end)."""


def file_fingerprint(path: str | Path) -> str:
    """``"<size in bytes>:<first 16 hex digits of the sha256>"`` of the file's bytes as the module
    docstring says.

    Raises:
        OSError: the file cannot be read.
    """
    size = os.path.getsize(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= WHOLE_BYTES:
            h.update(f.read())
        else:
            for i in range(BLOCKS):
                f.seek((size - BLOCK_BYTES) * i // (BLOCKS - 1))
                h.update(f.read(BLOCK_BYTES))
    return f"{size}:{h.hexdigest()[:16]}"


def source_fingerprint(source: Any) -> list[list[str]]:
    """``[[file or dataset, fingerprint], ...]`` of one opened source
    (:class:`omnicore.data.sources.Source`), in its reading order: a JSONL source's files, a table
    source's files, or for a dataset from the Hugging Face cache ``"datasets:<its fingerprint>"``
    (``"unknown"`` where ``datasets`` keeps none, as for streaming)."""
    tables = getattr(source, "tables", None)
    if tables is None:
        return [[f, file_fingerprint(f)] for f in source.files]
    out = []
    for t in tables:
        if Path(t.label).is_file():
            out.append([t.label, file_fingerprint(t.label)])
        else:
            known = getattr(t.data, "_fingerprint", None)
            out.append([t.label, f"datasets:{known}" if known else "unknown"])
    return out


def describe_difference(was: str, now: str) -> str:
    """What differs between two :func:`file_fingerprint` values, in words."""
    size_was, size_now = was.split(":", 1)[0], now.split(":", 1)[0]
    if ":" in was and ":" in now and size_was.isdigit() and size_now.isdigit() and size_was != size_now:
        return f"{size_was} bytes then, {size_now} now"
    if was.startswith("datasets:") or now.startswith("datasets:"):
        return f"the dataset's fingerprint was {was.removeprefix('datasets:')}, now {now.removeprefix('datasets:')}"
    return "the same size, other bytes: rewritten or reordered"


def compare_fingerprints(saved: dict[str, Any] | None, now: dict[str, list[list[str]]]) -> str | None:
    """The first difference between a checkpoint's fingerprint (``{source: [[file, fp], ...]}``)
    and this run's, as one phrase naming the source and file; None when they agree, and for a
    checkpoint written before fingerprints were kept (``saved`` None). Sources the checkpoint does
    not list are not compared (a change of sources is refused before: :func:`omnicore.data.state.check_resume`);
    an ``"unknown"`` entry matches anything."""
    if not saved:
        return None
    for name, files in now.items():
        old = saved.get(name)
        if old is None:
            continue
        if len(old) != len(files):
            return f"data source {name!r} has {len(files)} file(s) now; the checkpoint's run read {len(old)}"
        for (label_was, was), (label, fp) in zip(old, files):
            if "unknown" not in (was, fp) and was != fp:
                moved = f" (then {label_was})" if label_was != label else ""
                return f"data source {name!r}: {label}{moved} is not the file the checkpoint's run read ({describe_difference(was, fp)})"
    return None
