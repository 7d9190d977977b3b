"""Reading tables through Hugging Face ``datasets``, offline, with media columns left undecoded.

Used by :mod:`omnicore.data.sources`; ``datasets`` is imported only here and only when a table
source is opened. ``datasets``' own progress bars (``Generating train split``, on every command
that reads a Parquet file) are off while omnicore reads (:func:`quiet_datasets`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omnicore.config import SourceConfig


def load_file(builder: str, file: Path, cfg: SourceConfig, cache_dir: Path | None) -> Any:
    """One local table file as a ``datasets.Dataset`` (or ``IterableDataset`` with ``cfg.streaming``)
    named split ``cfg.split``, through the packaged ``builder`` (parquet, arrow or json), which reads
    local files without the network.

    Raises:
        ValueError: naming the file when ``datasets`` cannot read it as ``builder``.
    """
    import datasets

    try:
        with quiet_datasets():
            ds = datasets.load_dataset(
                builder,
                data_files={cfg.split: [str(file)]},
                split=cfg.split,
                streaming=cfg.streaming,
                cache_dir=None if cache_dir is None else str(cache_dir),
            )
    except Exception as exc:  # noqa: BLE001 - pyarrow and datasets raise many types for unreadable files
        raise ValueError(f"dataset file {file}: cannot read it as {builder}: {type(exc).__name__}: {' '.join(str(exc).split())}") from exc
    return undecoded(ds)


def load_cached(cfg: SourceConfig, cache_dir: Path | None) -> Any:
    """The split ``cfg.split`` of the dataset named ``cfg.dataset`` from the local ``datasets``
    cache, through its ``Cache`` builder: never the network, whatever ``HF_HUB_OFFLINE`` says.

    Raises:
        ValueError: the dataset is not in the cache (saying how to put it there), or lacks the split.
    """
    import datasets
    from datasets.packaged_modules.cache.cache import Cache

    name = str(cfg.dataset)
    where = str(cache_dir) if cache_dir is not None else datasets.config.HF_DATASETS_CACHE
    try:
        builder = Cache(
            cache_dir=None if cache_dir is None else str(cache_dir),
            dataset_name=name.split("/")[-1],
            repo_id=name,
            version="auto",
            hash="auto",
        )
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(
            f"dataset {name!r}: not a local file or folder, and not in the Hugging Face datasets cache {where}; "
            f"omnicore never downloads: run datasets.load_dataset({name!r}) once on a machine with network (same cache), or point "
            "`dataset` at local Parquet/Arrow/JSONL files"
        ) from exc
    splits = list(builder.info.splits or {})
    if cfg.split not in splits:
        raise ValueError(f"dataset {name!r} has no split {cfg.split!r} in the cache; its splits: {', '.join(splits) or 'none'}")
    with quiet_datasets():
        ds = builder.as_streaming_dataset(split=cfg.split) if cfg.streaming else builder.as_dataset(split=cfg.split)
    return undecoded(ds)


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """``datasets``' progress bars off inside (``Generating train split``, ``Loading dataset
    shards``, casts), and back as they were on the way out, so that a program using ``datasets``
    beside omnicore keeps its own bars. ``HF_DATASETS_DISABLE_PROGRESS_BARS=0`` in the environment
    wins, as ``datasets`` rules: the bars then stay."""
    import datasets.config
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if are_progress_bars_disabled() or datasets.config.HF_DATASETS_DISABLE_PROGRESS_BARS is False:
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def undecoded(ds: Any) -> Any:
    """``ds`` with every decoding feature (``Image``, ``Audio``, ...) cast to ``decode=False``, so a
    cell holds ``{"bytes": ..., "path": ...}`` and media are decoded by omnicore's loaders in workers."""
    with quiet_datasets():
        for col, feat in (ds.features or {}).items():
            if getattr(feat, "decode", False) and dataclasses.is_dataclass(feat):
                ds = ds.cast_column(col, dataclasses.replace(feat, decode=False))
    return ds
