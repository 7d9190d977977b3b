"""Reading chat-format JSONL, the way Hugging Face processors take multimodal chats.

One sample per line::

    {"messages": [
        {"role": "user", "content": [{"type": "image", "path": "images/00012.png"},
                                     {"type": "text", "text": "Which digit is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "7"}]}]}

``content`` is a list of typed parts (``text`` with ``text``; ``image``, ``audio`` or ``video`` with ``path``,
relative to the JSONL file's folder) or a plain string. A table's ``messages`` column
(:mod:`omnicore.data.sources`) uses the same format, and there a media part may also hold the encoded
bytes: ``{"type": "image", "image": b"..."}`` or Hugging Face's ``{"bytes": ..., "path": ...}``. Other top-level keys (for example ``task``)
are kept as metadata. Every error names the file and the 1-based line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant")
MEDIA_TYPES = ("image", "audio", "video")


class SampleError(Exception):
    """A sample is malformed or its media cannot be used; the message starts with ``FILE:LINE:``."""


@dataclass
class Part:
    """One content part: ``type`` is ``text`` or a media type; ``value`` is the text, the resolved
    media path, or (media read from a table) the encoded media bytes."""

    type: str
    value: str | bytes


@dataclass
class Message:
    role: str
    parts: list[Part]


@dataclass
class Sample:
    """A parsed line or table row: its messages, its origin (``file``, ``line``) and the other
    top-level keys. ``origin``, when set, replaces ``FILE:LINE`` in :attr:`where` (a table row:
    ``data.parquet row 12``)."""

    messages: list[Message]
    file: str
    line: int
    meta: dict[str, Any] = field(default_factory=dict)
    origin: str | None = None

    @property
    def where(self) -> str:
        """``FILE:LINE`` (1-based line), or :attr:`origin` when set; every error about the sample starts with it."""
        return self.origin if self.origin is not None else f"{self.file}:{self.line}"


def _parse_part(raw: Any, base: Path, where: str, m: int, p: int) -> Part:
    if not isinstance(raw, dict) or "type" not in raw:
        raise SampleError(f"{where}: messages[{m}].content[{p}] must be an object with a 'type'")
    kind = raw["type"]
    if kind == "text":
        if not isinstance(raw.get("text"), str):
            raise SampleError(f"{where}: messages[{m}].content[{p}] of type 'text' needs a string 'text'")
        return Part("text", raw["text"])
    if kind in MEDIA_TYPES:
        value = media_value(raw.get("path") or raw.get(kind), base)
        if value is None:
            raise SampleError(f"{where}: messages[{m}].content[{p}] of type {kind!r} needs a 'path' (relative to the JSONL file)")
        return Part(kind, value)
    raise SampleError(f"{where}: messages[{m}].content[{p}] has unknown type {kind!r}; use text, {', '.join(MEDIA_TYPES)}")


def media_value(raw: Any, base: Path) -> str | bytes | None:
    """A media reference as a :class:`Part` value: a path string (resolved against ``base`` when
    relative), encoded bytes, or Hugging Face's ``{"bytes": ..., "path": ...}`` struct (bytes win;
    else its path). None when ``raw`` is none of these or empty."""
    if isinstance(raw, dict):
        raw = raw.get("bytes") or raw.get("path")
    if isinstance(raw, (bytes, bytearray)) and raw:
        return bytes(raw)
    if isinstance(raw, str) and raw:
        return str(base / raw) if not Path(raw).is_absolute() else raw
    return None


def parse_messages(raw_messages: Any, base: Path, where: str) -> list[Message]:
    """The chat ``messages`` list (already parsed from JSON, or a table cell) as :class:`Message` objects.

    Args:
        base: the folder relative media paths are resolved against.
        where: the origin (``FILE:LINE``, or ``TABLE row N``) that starts every error.

    Raises:
        SampleError: for a missing or empty list, an unknown role or part type, a part without its value.
    """
    if not isinstance(raw_messages, list) or not raw_messages:
        raise SampleError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    messages = []
    for m, raw in enumerate(raw_messages):
        if not isinstance(raw, dict) or raw.get("role") not in ROLES:
            raise SampleError(f"{where}: messages[{m}] needs a 'role' of {', '.join(ROLES)}")
        content = raw.get("content")
        if isinstance(content, str):
            parts = [Part("text", content)]
        elif isinstance(content, list):
            parts = [_parse_part(c, base, where, m, p) for p, c in enumerate(content)]
        else:
            raise SampleError(f"{where}: messages[{m}].content must be a string or a list of parts")
        messages.append(Message(raw["role"], parts))
    return messages


def parse_line(text: str, file: str, line: int) -> Sample:
    """Parse one JSONL line into a :class:`Sample`.

    Raises:
        SampleError: for invalid JSON, a missing or empty ``messages`` list, an unknown role or part type.
    """
    where = f"{file}:{line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SampleError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list) or not obj["messages"]:
        raise SampleError(f"{where}: each line must be an object with a non-empty 'messages' list")
    messages = parse_messages(obj["messages"], Path(file).parent, where)
    meta = {k: v for k, v in obj.items() if k != "messages"}
    return Sample(messages, file, line, meta)


def decode_line(raw: bytes, file: str, line: int) -> str:
    """One line of a JSONL file as text: UTF-8, with a byte-order mark allowed on line 1 (as
    Windows editors save it).

    Raises:
        SampleError: ``FILE:LINE: not valid UTF-8 ...`` naming the first bad byte.
    """
    try:
        return raw.decode("utf-8-sig" if line == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        raise SampleError(
            f"{file}:{line}: not valid UTF-8 (byte 0x{bad} at byte {exc.start + 1} of the line: {exc.reason}); save the file as UTF-8"
        ) from exc


_BOM = b"\xef\xbb\xbf"

BYTES_PER_TOKEN = 64
"""The most bytes of a JSONL line taken to make one token (JSON escapes such as ``\\u4e2d``, the long
runs of spaces or dashes a BPE vocabulary merges), for :func:`line_byte_limit`."""

LINE_SLACK = 2**20
"""Bytes a line may hold beyond its tokens' (JSON syntax, roles, media paths, metadata keys)."""


def line_byte_limit(max_tokens: int) -> int:
    """The longest JSONL line, in bytes, that can hold a sample of ``max_tokens`` tokens (``data.max_tokens``):
    ``max_tokens * BYTES_PER_TOKEN + LINE_SLACK``. A longer line is a bad sample found before it is read
    whole, parsed or tokenized: tokenizing costs about 200 times the text's size in memory, so a
    100 MiB line would need gigabytes only to be refused as too long."""
    return max_tokens * BYTES_PER_TOKEN + LINE_SLACK


def long_line_error(where: str, max_tokens: int) -> SampleError:
    """The :class:`SampleError` of a line longer than :func:`line_byte_limit` (``where``: ``FILE:LINE``)."""
    limit = line_byte_limit(max_tokens)
    return SampleError(
        f"{where}: line longer than {limit} bytes ({limit / 2**20:.1f} MiB), the most a sample of data.max_tokens={max_tokens} "
        f"tokens can take ({BYTES_PER_TOKEN} bytes per token and {LINE_SLACK // 2**20} MiB for the rest); refused before it is "
        "parsed or tokenized: split it, or raise data.max_tokens (data.on_error: skip drops it)"
    )


def jsonl_lines(path: str | Path, max_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(line, raw bytes)`` of every non-blank line of a JSONL file, lazily, ``line`` 1-based with
    blank lines counted (so ``FILE:LINE`` is what an editor shows). A line of ASCII whitespace, after
    a byte-order mark on line 1, is blank. Training's JSONL sources
    (:class:`omnicore.data.sources.JsonlSource`) and :func:`iter_jsonl` read files through this.

    Args:
        max_bytes: a line longer than this is given as its first ``max_bytes + 1`` bytes only (the
            rest is read past in 1 MiB blocks, never held), so the caller sees ``len(raw) >
            max_bytes`` and can refuse it (:func:`line_byte_limit`); None: every line whole.

    Raises:
        SampleError: the file is missing.
    """
    if not Path(path).is_file():
        raise SampleError(f"{path}: data file not found")
    with open(path, "rb") as fh:
        line = 0
        while raw := (fh.readline() if max_bytes is None else fh.readline(max_bytes + 1)):
            line += 1
            if max_bytes is not None and len(raw) > max_bytes and not raw.endswith(b"\n"):
                while (rest := fh.readline(2**20)) and not rest.endswith(b"\n"):  # the rest of the long line
                    pass
                yield line, raw
                continue
            if (raw.removeprefix(_BOM) if line == 1 else raw).strip():
                yield line, raw


def iter_jsonl(path: str | Path, *, on_error: str = "raise", errors: list[str] | None = None) -> Iterator[Sample]:
    """The samples of a JSONL file, parsed line by line as they are read (the one JSONL iterator:
    held-out sets and tools read through it; training parses the same lines in its data workers).

    Args:
        on_error: ``"raise"`` stops at the first bad line; ``"skip"`` drops it and appends the
            message to ``errors`` (so the caller can count and report skipped lines).

    Raises:
        SampleError: if the file is missing, or for a bad line (malformed, or bytes that are not
            UTF-8) when ``on_error="raise"``.
    """
    file = str(path)
    for line, raw in jsonl_lines(path):
        try:
            yield parse_line(decode_line(raw, file, line), file, line)
        except SampleError as exc:
            if on_error != "skip":
                raise
            if errors is not None:
                errors.append(str(exc))


def read_jsonl(path: str | Path, *, on_error: str = "raise", errors: list[str] | None = None) -> list[Sample]:
    """Every sample of a JSONL file as a list: :func:`iter_jsonl` (the same arguments and errors)."""
    return list(iter_jsonl(path, on_error=on_error, errors=errors))
