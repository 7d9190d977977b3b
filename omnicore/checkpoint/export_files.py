"""An export's files checked before anything loads them, so that a damaged export is one line
naming the file instead of a traceback from deep inside transformers, tokenizers or safetensors.

:func:`check_export_files` reads only what is cheap (sizes, headers, small JSON files): the
``omnicore.yaml`` section, every JSON file (``config.json``, ``tokenizer.json`` (also through
``tokenizers``), ``*.safetensors.index.json`` and the shards they name) and every safetensors
file's header against its size. It catches a truncated or cut file, a garbled header and a bad
tokenizer or config; bytes changed inside the tensors keep their size and header, and only a
checksum finds them (:mod:`omnicore.checkpoint.manifest`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from omnicore.checkpoint.errors import CheckpointError

__all__ = ["EXPORT_DAMAGED", "check_export_files", "export_section"]

EXPORT_DAMAGED = "the export is damaged: restore it from a copy, or export the run again (--resume of the finished run exports it)"
"""What to do, at the end of every error of :func:`check_export_files`."""

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2}
_DTYPE_BYTES.update({"U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1})
"""Bytes per element of the safetensors dtypes (others are not size-checked)."""

_MAX_HEADER = 100 * 2**20
"""The largest safetensors header the library reads (100 MB): a larger length is a garbled file."""


def check_export_files(folder: Path, prefix: str = "") -> dict[str, Any]:
    """Check the files of the export ``folder`` (module docstring) and return its ``omnicore.yaml``
    ``model:`` section (:func:`export_section`). ``prefix`` starts every message (``model.init_from: ``).

    Raises:
        CheckpointError: one line: ``PREFIX FILE: what is wrong; what to do`` (:data:`EXPORT_DAMAGED`).
    """
    folder = Path(folder)
    section = export_section(folder, prefix)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        problem = None
        if path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
        elif path.name == "tokenizer.json":
            problem = _tokenizer_problem(path)
        elif path.suffix == ".json":
            problem = _json_problem(path)
        if problem:
            raise CheckpointError(f"{prefix}{path}: {problem}; {EXPORT_DAMAGED}")
    return section


def export_section(folder: Path, prefix: str = "") -> dict[str, Any]:
    """The ``model:`` section of ``<folder>/omnicore.yaml``, checked to hold a foundation and, for
    each component, a ``checkpoint`` folder of the export that exists (an encoder that shares
    another's module has none).

    Raises:
        CheckpointError: the file is missing, not YAML (its line named), has no ``model.foundation``
            mapping, or names a component folder that is not there.
    """
    import yaml

    path = Path(folder) / "omnicore.yaml"
    if not path.is_file():
        raise CheckpointError(f"{prefix}{folder} is not an omnicore export (no omnicore.yaml)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        detail = ", ".join(str(x) for x in (getattr(exc, "context", None), getattr(exc, "problem", None)) if x) or "unreadable"
        raise CheckpointError(f"{prefix}{where}: not valid YAML ({detail}); {EXPORT_DAMAGED}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{prefix}{path}: unreadable ({' '.join(str(exc).split())}); {EXPORT_DAMAGED}") from exc
    section = raw.get("model") if isinstance(raw, dict) else None
    if not isinstance(section, dict) or not isinstance(section.get("foundation"), dict):
        raise CheckpointError(f"{prefix}{path}: no model.foundation section; {EXPORT_DAMAGED}")
    entries = [("model.foundation", section["foundation"])]
    for kind in ("encoders", "decoders"):
        table = section.get(kind) or {}
        if not isinstance(table, dict):
            raise CheckpointError(f"{prefix}{path}: model.{kind} is not a mapping; {EXPORT_DAMAGED}")
        entries += [(f"model.{kind}.{k}", c) for k, c in table.items()]
    for field, comp in entries:
        if isinstance(comp, dict) and comp.get("share"):
            continue
        options = comp.get("options") if isinstance(comp, dict) else None
        checkpoint = options.get("checkpoint") if isinstance(options, dict) else None
        if not isinstance(checkpoint, str):
            raise CheckpointError(f"{prefix}{path}: {field} has no options.checkpoint folder; {EXPORT_DAMAGED}")
        if not (Path(folder) / checkpoint).is_dir():
            raise CheckpointError(f"{prefix}{path}: {field} names the folder {checkpoint!r}, which the export lacks; {EXPORT_DAMAGED}")
    return section


def _json_problem(path: Path) -> str | None:
    """Why ``path`` is not a usable JSON file (an index's shards included), or None."""
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, OSError) as exc:
        return f"not valid JSON ({' '.join(str(exc).split())})"
    if path.name.endswith(".index.json") and isinstance(data, dict) and isinstance(data.get("weight_map"), dict):
        missing = sorted({f for f in data["weight_map"].values() if isinstance(f, str) and not (path.parent / f).is_file()})
        if missing:
            return f"names the shard {missing[0]}, which is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    return None


def _tokenizer_problem(path: Path) -> str | None:
    """Why ``path`` (a ``tokenizer.json``) cannot be loaded by ``tokenizers``, or None."""
    problem = _json_problem(path)
    if problem:
        return problem
    try:
        from tokenizers import Tokenizer
    except ImportError:  # nothing more to check without it
        return None
    try:
        Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type
        return f"not a tokenizer the tokenizers library can load ({' '.join(str(exc).split())})"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (header length, header JSON, each tensor's byte
    range against its dtype and shape, the file's size against the header's end), or None."""
    size = path.stat().st_size
    if size < 8:
        return f"truncated: {size} bytes, shorter than a safetensors header"
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if n > min(size - 8, _MAX_HEADER):
            return f"truncated or not a safetensors file: its header length {n} does not fit its {size} bytes"
        head = fh.read(n)
    try:
        header = json.loads(head)
    except ValueError as exc:
        return f"not a safetensors file: its header is not valid JSON ({' '.join(str(exc).split())})"
    if not isinstance(header, dict):
        return "not a safetensors file: its header is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in info["data_offsets"])
            shape = [int(x) for x in info["shape"]]
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            return f"not a safetensors file: the header's entry {name!r} has no dtype, shape and data_offsets"
        width = _DTYPE_BYTES.get(dtype)
        if stop < begin or (width is not None and stop - begin != math.prod(shape) * width):
            return f"garbled header: tensor {name!r} ({dtype} {shape}) has the byte range {begin}..{stop}"
        end = max(end, stop)
    expected = 8 + n + end
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says"
        return f"{state}: {size} bytes, its header describes {expected}"
    return None
