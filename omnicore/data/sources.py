"""Training data sources: JSONL shards and tables read through Hugging Face ``datasets``.

A source (:class:`omnicore.config.SourceConfig`) is opened by :func:`open_source` into a
:class:`Source` with two steps, so that the pipeline can shuffle and shard cheaply before any
decoding:

1. :meth:`Source.records` yields light, picklable :class:`Record` objects (a JSONL line's raw bytes,
   or a table's row index or raw row) for one shard of one epoch, lazily;
2. :meth:`Source.to_sample` decodes one record into a :class:`~omnicore.data.jsonl.Sample` (JSON
   parse or column mapping). Media stay undecoded: a path, or the encoded bytes of a table cell.

Sharding is by row: the source's rows are numbered ``i = 0, 1, ...`` in reading order (files in
sorted order, or in an order shuffled per epoch; rows within a file in file order) and shard ``s`` of
``n`` takes the rows with ``i % n == s``. Every shard reads every line of a JSONL file (to skip blank
lines it has to see them) but parses only its own; a map-style table jumps to its rows directly.

Origins (``Record.where``, the start of every error): ``FILE:LINE`` (1-based, blank lines counted)
for JSONL; ``FILE row N`` for a local table (``N`` the 0-based row of that file); ``NAME row N`` for
a dataset from the Hugging Face cache (``N`` the 0-based row of the split).
"""

from __future__ import annotations

import glob
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnicore.config import SourceConfig
from omnicore.data.jsonl import (
    Message,
    Part,
    Sample,
    SampleError,
    decode_line,
    jsonl_lines,
    line_byte_limit,
    long_line_error,
    media_value,
    parse_line,
    parse_messages,
)

__all__ = ["Record", "Source", "SourceConfig", "open_source"]

TABLE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json"}
"""File extension -> Hugging Face ``datasets`` builder, for ``format: auto``."""

FORMAT_BUILDERS = {"parquet": "parquet", "arrow": "arrow", "jsonl": "json", "json": "json"}
"""``SourceConfig.format`` -> builder."""


@dataclass(frozen=True)
class Record:
    """One row of a source before decoding: what the pipeline shuffles, shards and sends to workers.

    Attributes:
        source: the source's name.
        where: ``FILE:LINE`` (JSONL) or ``FILE row N`` / ``DATASET row N`` (tables).
        file: JSONL: the file; ``line``: its 1-based line; ``raw``: the line's bytes.
        table: tables: the index of the file (or cached dataset) among the source's tables;
            ``row``: the 0-based row in it; ``data``: the raw row of a streaming table (media
            undecoded), None for a map-style table (read at :meth:`Source.to_sample`).
    """

    source: str
    where: str
    file: str = ""
    line: int = 0
    raw: bytes = b""
    table: int = 0
    row: int = -1
    data: dict[str, Any] | None = None


class Source:
    """An opened source (see :func:`open_source`): deterministic sharded records, and their decoding."""

    def __init__(self, name: str, config: SourceConfig, units: list[str]):
        self.name = name
        self.config = config
        self._units = units  # one per file: what a shuffle reorders

    @property
    def num_rows(self) -> int | None:
        """Rows in the source when known without reading it (a map-style table), else None."""
        return None

    def unit_order(self, epoch: int, seed: int, shuffle: bool) -> list[int]:
        """The order in which files are read: sorted, or shuffled by ``random.Random`` seeded with
        ``(seed, epoch, name)`` (as a string, so the same in every process)."""
        order = list(range(len(self._units)))
        if shuffle:
            random.Random(f"{seed}:{epoch}:{self.name}").shuffle(order)
        return order

    def records(self, epoch: int, shard: int, num_shards: int, seed: int, shuffle: bool) -> Iterator[Record]:
        """This shard's records for ``epoch``, lazily, in reading order (see the module docstring).

        Raises:
            ValueError: unless ``0 <= shard < num_shards``.
        """
        raise NotImplementedError

    def to_sample(self, record: Record) -> Sample:
        """Decode ``record`` into a :class:`Sample` whose ``where`` is ``record.where``.

        Raises:
            SampleError: ``WHERE: why`` (bad JSON or UTF-8, a missing column, a wrong cell type, empty text).
        """
        raise NotImplementedError


def _has_magic(spec: str) -> bool:
    """Whether ``spec`` is a glob pattern (holds ``*``, ``?`` or ``[``)."""
    return any(c in spec for c in "*?[")


def _check_shard(shard: int, num_shards: int) -> None:
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} of {num_shards}: need num_shards >= 1 and 0 <= shard < num_shards")


class JsonlSource(Source):
    """Chat JSONL shards. A blank line is not a row (it takes no row index and yields no record) but
    counts as a line, so ``FILE:LINE`` is what an editor shows. With ``max_tokens``
    (``data.max_tokens``) a line longer than :func:`~omnicore.data.jsonl.line_byte_limit` is read
    only that far and is a bad sample at :meth:`to_sample`, before it is parsed or tokenized."""

    def __init__(self, name: str, config: SourceConfig, files: list[Path], max_tokens: int | None = None):
        super().__init__(name, config, [str(f) for f in files])
        self.max_tokens = max_tokens
        self.max_bytes = None if max_tokens is None else line_byte_limit(max_tokens)

    @property
    def files(self) -> list[str]:
        """The shards in sorted order."""
        return list(self._units)

    def records(self, epoch: int, shard: int, num_shards: int, seed: int, shuffle: bool) -> Iterator[Record]:
        _check_shard(shard, num_shards)
        return self._records(self.unit_order(epoch, seed, shuffle), shard, num_shards)

    def _records(self, order: list[int], shard: int, num_shards: int) -> Iterator[Record]:
        i = 0
        for k in order:
            file = self._units[k]
            for line, raw in jsonl_lines(file, self.max_bytes):
                if i % num_shards == shard:
                    yield Record(self.name, f"{file}:{line}", file=file, line=line, raw=raw)
                i += 1

    def to_sample(self, record: Record) -> Sample:
        if self.max_bytes is not None and len(record.raw) > self.max_bytes:
            raise long_line_error(record.where, self.max_tokens or 0)
        return parse_line(decode_line(record.raw, record.file, record.line), record.file, record.line)


@dataclass
class _Table:
    label: str  # the file, or the cached dataset's name, as messages show it
    base: Path  # relative media paths in cells are resolved against it
    data: Any  # datasets.Dataset (map-style) or datasets.IterableDataset (streaming)


class TableSource(Source):
    """A table read through Hugging Face ``datasets``; each row becomes a chat sample through
    ``config.columns`` (or the table's ``messages`` column)."""

    def __init__(self, name: str, config: SourceConfig, tables: list[_Table], columns: dict[str, str]):
        super().__init__(name, config, [t.label for t in tables])
        self.tables = tables
        self.columns = columns

    @property
    def num_rows(self) -> int | None:
        if self.config.streaming:
            return None
        return sum(len(t.data) for t in self.tables)

    def records(self, epoch: int, shard: int, num_shards: int, seed: int, shuffle: bool) -> Iterator[Record]:
        _check_shard(shard, num_shards)
        return self._records(self.unit_order(epoch, seed, shuffle), shard, num_shards)

    def _records(self, order: list[int], shard: int, num_shards: int) -> Iterator[Record]:
        i = 0  # the running row index at the start of table k
        for k in order:
            t = self.tables[k]
            if self.config.streaming:
                for j, row in enumerate(_streamed_rows(t.data)):
                    if i % num_shards == shard:
                        yield Record(self.name, f"{t.label} row {j}", table=k, row=j, data=row)
                    i += 1
            else:
                n = len(t.data)
                for j in range((shard - i) % num_shards, n, num_shards):
                    yield Record(self.name, f"{t.label} row {j}", table=k, row=j)
                i += n

    def to_sample(self, record: Record) -> Sample:
        t = self.tables[record.table]
        row = record.data if record.data is not None else t.data[record.row]
        where = record.where
        if "messages" in self.columns:
            messages = parse_messages(_cell(row, self.columns["messages"], where), t.base, where)
        else:
            messages = self._mapped(row, t.base, where)
        return Sample(messages, t.label, record.row, {}, origin=where)

    def _mapped(self, row: dict[str, Any], base: Path, where: str) -> list[Message]:
        media = []
        for kind in ("image", "audio"):
            col = self.columns.get(kind)
            if col is None:
                continue
            cell = _cell(row, col, where)
            value = media_value(cell, base)
            if value is None:
                got = "an empty value" if cell in (None, b"", "") else f"a {type(cell).__name__}"
                raise SampleError(f"{where}: column {col!r} ({kind}) holds {got}; expected encoded bytes, a path or {{bytes, path}}")
            media.append(Part(kind, value))
        prompt = self.config.prompt if "prompt" not in self.columns else _text(row, self.columns["prompt"], "prompt", where)
        user = (media if self.config.media_role == "user" else []) + ([Part("text", prompt)] if prompt else [])
        assistant = [Part("text", _text(row, self.columns["response"], "response", where))] if "response" in self.columns else []
        assistant += media if self.config.media_role == "assistant" else []
        return [Message("user", user), Message("assistant", assistant)]


def _cell(row: dict[str, Any], col: str, where: str) -> Any:
    if col not in row:
        raise SampleError(f"{where}: no column {col!r}; the row has {', '.join(sorted(row))}")
    return row[col]


def _text(row: dict[str, Any], col: str, key: str, where: str) -> str:
    value = _cell(row, col, where)
    if not isinstance(value, str):
        raise SampleError(f"{where}: column {col!r} ({key}) holds a {type(value).__name__}; expected text")
    if not value.strip():
        raise SampleError(f"{where}: column {col!r} ({key}) is empty")
    return value


def open_source(cfg: SourceConfig, base_dir: Path, *, cache_dir: Path | None = None, max_tokens: int | None = None) -> Source:
    """Open one source: find its files (or its cached dataset) and check that they can be read.

    Args:
        cfg: the source's config; ``path`` and a local ``dataset`` are relative to ``base_dir``.
        base_dir: the config file's folder.
        cache_dir: the Hugging Face ``datasets`` cache (Arrow files of map-style tables, and where
            dataset names are looked up); None: ``HF_DATASETS_CACHE`` (by default
            ``~/.cache/huggingface/datasets``).
        max_tokens: ``data.max_tokens``: a JSONL line too long to hold that many tokens is a bad
            sample found before it is read whole (:class:`JsonlSource`); None: no limit.

    Raises:
        ValueError: naming the path or dataset and what to do: no file matches a glob, a folder
            holds no ``*.jsonl`` (or table files), an unknown file extension, a dataset that is
            neither a local path nor in the cache, a missing split, or a table without the mapped
            columns (or, unmapped, without a ``messages`` column: the message lists its columns).
    """
    base_dir = Path(base_dir)
    if cfg.path is not None:
        files = _match(cfg.path, base_dir, (".jsonl",), "path")
        return JsonlSource(cfg.name or _default_name(cfg.path, base_dir), cfg, files, max_tokens)
    from omnicore.data import hf_tables

    assert cfg.dataset is not None  # the config's validator: exactly one of path / dataset
    exts = (
        tuple(TABLE_BUILDERS) if cfg.format == "auto" else tuple(e for e, b in TABLE_BUILDERS.items() if b == FORMAT_BUILDERS[cfg.format])
    )
    if _is_local(cfg.dataset, base_dir):
        files = _match(cfg.dataset, base_dir, exts, "dataset")
        builder = _builder(files, cfg.format, cfg.dataset)
        tables = [_Table(str(f), f.parent, hf_tables.load_file(builder, f, cfg, cache_dir)) for f in files]
        name = cfg.name or _default_name(cfg.dataset, base_dir)
    else:
        tables = [_Table(cfg.dataset, base_dir, hf_tables.load_cached(cfg, cache_dir))]
        name = cfg.name or cfg.dataset
    return TableSource(name, cfg, tables, _columns(cfg, tables[0]))


def _is_local(spec: str, base_dir: Path) -> bool:
    """A glob, an existing path, or a name with a table file extension (then missing: an error
    naming it); anything else is a dataset name for the Hugging Face cache."""
    return _has_magic(spec) or (base_dir / spec).exists() or Path(spec).suffix.lower() in TABLE_BUILDERS


def _streamed_rows(ds: Any, batch: int = 64) -> Iterator[dict[str, Any]]:
    """The rows of a streaming ``datasets.IterableDataset`` in order. Read through ``iter(batch_size)``:
    plain iteration inside a torch DataLoader worker makes ``datasets`` split the rows among the
    workers itself (and stop the workers beyond its number of files), while the pipeline shards
    rows on its own."""
    for cols in ds.iter(batch_size=batch):
        keys = list(cols)
        for i in range(len(cols[keys[0]]) if keys else 0):
            yield {k: cols[k][i] for k in keys}


def _match(spec: str, base_dir: Path, exts: tuple[str, ...], key: str) -> list[Path]:
    """The files ``spec`` names, sorted: one file, a glob (``**`` recursive), or a folder (its files
    ending in ``exts``, not recursive)."""
    full = Path(os.path.normpath(base_dir / spec))  # messages and FILE:LINE without "cfg/../"
    if _has_magic(spec):
        files = sorted(Path(p) for p in glob.glob(str(full), recursive=True) if Path(p).is_file())
        if not files:
            raise ValueError(f"{key} {spec!r}: no file matches {full}; check the pattern (relative to {base_dir})")
        return files
    if full.is_dir():
        files = sorted(p for p in full.iterdir() if p.is_file() and p.suffix.lower() in exts)
        if not files:
            raise ValueError(
                f"{key} {spec!r}: the folder {full} holds no {' / '.join('*' + e for e in exts)} files; "
                f"for files in subfolders use a glob such as {spec.rstrip('/')}/**/*{exts[0]}"
            )
        return files
    if not full.is_file():
        hint = ""
        if not Path(spec).is_absolute() and Path(spec).exists():
            hint = f"; {spec!r} exists relative to the current folder: write it relative to the config file's folder, or absolute"
        raise ValueError(f"{key} {spec!r}: no such file or folder: {full} (relative paths are relative to {base_dir}){hint}")
    return [full]


def _builder(files: list[Path], fmt: str, spec: str) -> str:
    """The ``datasets`` builder for ``files``: from ``format``, or from their one kind of extension."""
    if fmt != "auto":
        return FORMAT_BUILDERS[fmt]
    odd = [f for f in files if f.suffix.lower() not in TABLE_BUILDERS]
    if odd:
        raise ValueError(
            f"dataset {spec!r}: cannot tell the format of {odd[0]} by its extension; set format: parquet, arrow, jsonl or json"
        )
    kinds = sorted({TABLE_BUILDERS[f.suffix.lower()] for f in files})
    if len(kinds) > 1:
        raise ValueError(f"dataset {spec!r}: matches files of several formats ({', '.join(kinds)}); narrow the glob or set format")
    return kinds[0]


def _columns(cfg: SourceConfig, table: _Table) -> dict[str, str]:
    """``cfg.columns`` checked against the table's column names, or ``{messages: messages}``."""
    have = list(table.data.column_names or [])
    if cfg.columns is not None:
        missing = [c for c in cfg.columns.values() if have and c not in have]
        if missing:
            raise ValueError(f"dataset {cfg.dataset!r}: columns maps {missing}, which {table.label} lacks; its columns: {', '.join(have)}")
        return dict(cfg.columns)
    if not have or "messages" in have:
        return {"messages": "messages"}
    text = [c for c in have if c != "image"]
    example = f"{{image: image, response: {text[0] if text else 'text'}}}" if "image" in have else f"{{prompt: ..., response: {have[0]}}}"
    raise ValueError(
        f"dataset {cfg.dataset!r}: {table.label} has no 'messages' column (its columns: {', '.join(have)}); map the columns "
        f"to a chat sample, e.g. columns: {example} (keys: messages, image, audio, prompt, response)"
    )


def _default_name(spec: str, base_dir: Path) -> str:
    """The file stem, the folder name, or for a glob the last folder before its first wildcard."""
    parts = Path(spec).parts
    if _has_magic(spec):
        fixed = [p for p in parts[: next(i for i, p in enumerate(parts) if _has_magic(p))]]
        return fixed[-1] if fixed else base_dir.resolve().name
    full = base_dir / spec
    return full.name if full.is_dir() else full.stem
