"""Pretrained weights at scale: Hub names, strict key checks, and sharded loading from safetensors.

Three steps, each usable alone:

1. :func:`resolve_pretrained` turns a local folder or a Hugging Face model name (``org/name`` or
   ``org/name@revision``) into a local folder, through ``huggingface_hub.snapshot_download``: the
   local HF cache is used, ``HF_HUB_OFFLINE=1`` keeps it offline, ``HF_HUB_CACHE``/``HF_HOME`` say
   where the cache is. Nothing about the Hub is re-implemented here.
2. :func:`plan_load` compares a model built with its parameters on the meta device (no memory
   taken) with a safetensors checkpoint's headers (no tensor read): every parameter must have a
   checkpoint tensor of its shape, and every checkpoint tensor must be used, unless the config names
   it (``init_fresh`` for parameters to initialise fresh, ``ignore_unused`` for checkpoint tensors to
   leave). Embedding rows beyond the checkpoint's vocabulary (omnicore's special tokens) are the one
   allowed shape difference. The result is a :class:`PendingLoad`; errors name the keys.
3. :func:`fill_pending` runs after the parallel strategies have sharded the model (FSDP2 turns each
   parameter into a DTensor whose local shard is still on meta): it allocates each rank's shards
   (``Module.to_empty``) and copies into each one exactly its rows of the checkpoint tensor, read
   with safetensors' lazy ``get_slice`` (memory-mapped: a rank reads its slice, never the whole
   tensor), cast to the parameter's dtype. No rank holds a second full copy of the model.

This is the meta-device initialisation recipe of FSDP2 (PyTorch's ``fully_shard`` documentation;
torchtitan builds its models on meta, shards, then calls ``to_empty`` and initialises); the
reading of shard slices is what ``torch.distributed.checkpoint.HuggingFaceStorageReader`` does too,
done here by hand so that renamed keys, grown embedding rows and fresh tensors fit in one pass.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_MAX_LISTED = 12
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+(@[\w.\-/]+)?$|^[A-Za-z0-9][\w.\-]*(@[\w.\-/]+)?$")
SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
"""The transformers checkpoint files :func:`checkpoint_index` reads (single file, or sharded with an index)."""


class LoadError(ValueError):
    """A checkpoint does not fit the model (missing, unused or misshapen tensors) or cannot be found."""


# ---------------------------------------------------------------------------------------------
# names and folders
# ---------------------------------------------------------------------------------------------


def looks_like_hub_name(text: str) -> bool:
    """Whether ``text`` has the shape of a Hugging Face model id (``org/name``, ``name``, optionally ``@revision``)."""
    return bool(_REPO_ID.match(text)) and not text.startswith((".", "~")) and "//" not in text


def looks_local(text: str, local: Path) -> bool:
    """Whether ``text``, the option's value (``local``: it as a path, relative ones joined to the
    config's folder), names a local folder rather than a Hugging Face model: it has no model id's
    shape (it starts with ``.``, ``/`` or ``~``, has two ``/`` or more, ...), or it has a ``/`` and the
    folder it would be in exists (``models/qwen-typo`` next to an existing ``models/``)."""
    return not looks_like_hub_name(text) or ("/" in text or os.sep in text) and local.parent.is_dir()


def no_such_folder(local: Path) -> str:
    """``no such folder: /abs/resolved/path``, followed by the deepest folder on the way that exists
    and, when one of its folders is a close spelling of the missing part, the path meant
    (:func:`_meant`): ``no such folder: /w/runs/digts/export (/w/runs has no 'digts'; did you mean
    /w/runs/digits/export?)``."""
    path = local.expanduser().resolve()
    parent, rest, meant = _meant(path)
    hint = f"; did you mean {meant}?" if meant else ""
    return f"no such folder: {path} ({parent} has no {rest[0]!r}{hint})" if rest else f"no such folder: {path}"


def _meant(path: Path) -> tuple[Path, tuple[str, ...], Path | None]:
    """For a missing absolute ``path``: the deepest folder on the way that exists, the parts after
    it, and ``path`` with the first of them replaced by the closest folder name there (difflib),
    or None when none is close."""
    import difflib

    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    rest = path.relative_to(parent).parts
    try:
        names = [p.name for _, p in zip(range(5000), parent.iterdir()) if p.is_dir()]  # bounded: a huge folder costs no time
    except OSError:  # unreadable: say what is known
        names = []
    close = difflib.get_close_matches(rest[0], sorted(names), n=1) if rest else []
    return parent, rest, parent.joinpath(close[0], *rest[1:]) if close else None


def resolve_pretrained(name_or_path: str, *, base: Path | None = None, what: str = "checkpoint") -> Path:
    """The local folder of a checkpoint given as a folder or as a Hugging Face model name.

    Args:
        name_or_path: a folder (absolute, ``~``, or relative to ``base``), or a model id such as
            ``Qwen/Qwen2.5-0.5B`` or ``Qwen/Qwen2.5-0.5B@<revision>``. A folder that exists wins over
            a model of the same name; a missing one that reads as a path (:func:`looks_local`) is
            reported as such, not looked up on the Hub.
        base: the folder relative paths start from (the config file's folder); None: the current one.
        what: how errors name the option (``model.foundation.options.checkpoint``).

    Returns:
        the folder: the given one, or the snapshot folder in the local HF cache
        (``huggingface_hub.snapshot_download``, which downloads only when online and the cache lacks it).

    Raises:
        LoadError: naming ``what``: the folder does not exist and the text reads as a path
            (``options.checkpoint: no such folder: /abs/path ...``, :func:`no_such_folder`), or the
            model is neither cached nor downloadable (offline, or no such repository), with what to do.
    """
    path = Path(name_or_path).expanduser()
    local = path if path.is_absolute() or base is None else base / path
    if local.exists():
        if not local.is_dir():
            raise LoadError(f"{what}: {str(local)!r} is a file; point it at a folder written by save_pretrained, or a model name")
        return local
    if looks_local(name_or_path, local):
        raise LoadError(f"{what}: {no_such_folder(local)}")
    return _from_hub_cache(name_or_path, local, what)


def _from_hub_cache(name: str, local: Path, what: str) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    repo_id, _, revision = name.partition("@")
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py"]
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, allow_patterns=patterns))
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        offline = "; HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else ""
        # not cached and not reachable says it all; other failures (no such repository, no access) add the library's words
        reason = "" if isinstance(exc, LocalEntryNotFoundError) else f" ({' '.join(str(exc).split())[:200]})"
        meant = _meant(local.resolve())[2]
        looked = f"looked for {str(local.resolve())!r}" + (f"; did you mean {str(meant)!r}?" if meant else "")
        raise LoadError(
            f"{what}: {name!r} is neither a folder ({looked}) nor a model in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}{offline}){reason}. Download it first (`hf download {repo_id}` where there is internet, "
            "then copy the cache or set HF_HUB_CACHE), or point the option at a local folder"
        ) from exc


# ---------------------------------------------------------------------------------------------
# the checkpoint's headers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorEntry:
    """One checkpoint tensor: the safetensors ``file`` holding it, its ``shape`` and dtype name."""

    file: Path
    shape: tuple[int, ...]
    dtype: str


def checkpoint_index(folder: Path) -> dict[str, TensorEntry] | None:
    """Key -> :class:`TensorEntry` of a transformers safetensors checkpoint, from the headers only
    (``model.safetensors``, or the files of ``model.safetensors.index.json``); None when the folder
    has neither (a ``pytorch_model.bin`` checkpoint: only the library can read it).

    Raises:
        LoadError: the index names a file that is missing, or a file is not valid safetensors.
    """
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({folder / f for f in weight_map.values()})
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        return None
    out: dict[str, TensorEntry] = {}
    for file in files:
        if not file.is_file():
            raise LoadError(f"{index} names {file.name}, which is not in {folder}; download the whole checkpoint")
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    sl = f.get_slice(key)
                    out[key] = TensorEntry(file, tuple(sl.get_shape()), str(sl.get_dtype()))
        except (OSError, RuntimeError, ValueError) as exc:  # safetensors raises SafetensorError (a RuntimeError subclass) etc.
            raise LoadError(f"cannot read {file}: {exc}; re-download or re-save the checkpoint") from exc
    return out


# ---------------------------------------------------------------------------------------------
# the plan: which tensor fills which parameter
# ---------------------------------------------------------------------------------------------


@dataclass
class PendingLoad:
    """Parameters of one submodule, built on meta, to be filled from a checkpoint by :func:`fill_pending`.

    Attributes:
        folder: the checkpoint folder.
        prefix: the submodule's name in the whole model plus a dot (``"lm."``), so names here are
            the submodule's own (``model.layers.0.self_attn.q_proj.weight``).
        sources: parameter name -> checkpoint key.
        rows: parameter name -> rows read from the checkpoint, for parameters with more rows than
            the checkpoint tensor (embeddings grown for new tokens); the other rows are set to the
            mean of the checkpoint's rows.
        fresh: parameter names initialised fresh (``init_fresh``): normal(0, ``init_std``) for
            matrices, ones for 1-D norm weights, zeros for biases.
        init_std: the standard deviation of fresh matrices (the config's ``initializer_range``).
        seed: seeds fresh tensors (with the parameter's name), so every rank and world size makes the same values.
    """

    folder: Path
    prefix: str
    entries: dict[str, TensorEntry]
    sources: dict[str, str]
    rows: dict[str, int] = field(default_factory=dict)
    fresh: list[str] = field(default_factory=list)
    init_std: float = 0.02
    seed: int = 0


def plan_checkpoint(
    module: Any,
    folder: str | Path,
    *,
    renames: Mapping[str, str] | None = None,
    init_fresh: list[str] = (),  # type: ignore[assignment]
    ignore_unused: list[str] = (),  # type: ignore[assignment]
    what: str = "options.checkpoint",
    grow: tuple[str, ...] = (),
    seed: int = 0,
    other_parts: Sequence[str] = (),
) -> PendingLoad:
    """The strict load plan of ``module`` (its parameters on the meta device, buffers real) from a
    safetensors checkpoint folder, for a component to return as ``module.omnicore_pending_load``:
    the core then shards the model and each rank reads only its own slices
    (:func:`fill_pending`). A component reading its part of a composite checkpoint (a published
    model's vision tower) names that part with ``renames`` and the rest with ``other_parts``.
    Build ``module`` under :func:`on_meta`; :func:`fill_now` fills it at once on one process.

    Args: as :func:`plan_load` (``folder`` is read with :func:`checkpoint_index`), and
        other_parts: key prefixes of the composite checkpoint's other parts (``"model.visual"``,
            ``"lm_head"``), whose tensors are left unused on purpose where present. Unlike an
            ``ignore_unused`` pattern, a prefix that matches no key is no error: the layouts a
            model is published in name its parts differently, and a folder holds one of them.

    Raises:
        LoadError: the folder holds no safetensors (``model.safetensors`` or its index), or the
            checkpoint does not fit (see :func:`plan_load`).
    """
    folder = Path(folder)
    entries = checkpoint_index(folder)
    if entries is None:
        raise LoadError(
            f"{what}: {str(folder)!r} has no model.safetensors (or model.safetensors.index.json); save the checkpoint as safetensors"
        )
    present = [p for p in other_parts if any(k == p.rstrip(".") or k.startswith(p.rstrip(".") + ".") for k in entries)]
    return plan_load(
        module, folder, entries, prefix="", init_fresh=init_fresh, ignore_unused=[*ignore_unused, *present], what=what, grow=grow,
        seed=seed, renames=renames,
    )  # fmt: skip


def embedding_names(model: Any) -> tuple[str, ...]:
    """The parameter names of ``model``'s input and output embeddings (one name when they are tied):
    the ``grow`` of :func:`plan_checkpoint` for a language model whose vocabulary may exceed its
    checkpoint's (omnicore's special tokens added); a checkpoint with as many rows fills them as
    any parameter."""
    ids = {id(p): n for n, p in model.named_parameters()}
    return tuple(dict.fromkeys(ids[id(m.weight)] for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None))


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Build modules inside with their parameters on the meta device and their buffers real
    (rotary tables, position ids), as :func:`plan_checkpoint` expects (accelerate's
    ``init_empty_weights(include_buffers=False)``)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        yield


def matches_any(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or name.startswith(p.rstrip(".") + ".") for p in patterns)


def _names(items: list[str]) -> str:
    shown = ", ".join(repr(n) for n in items[:_MAX_LISTED])
    return shown + (f" and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def _fit_problems(missing: list[str], unused: list[str], shapes: list[str], n_params: int) -> list[str]:
    """What :func:`plan_load` reports, one phrase per kind of misfit."""
    problems = []
    if missing:
        problems.append(
            f"lacks {len(missing)} of the model's {n_params} tensors: {_names(missing)} (to initialise them fresh, list them in init_fresh)"
        )
    if unused:
        problems.append(
            f"holds {len(unused)} tensors the model does not use: {_names(sorted(unused))} (to leave them, list them in ignore_unused)"
        )
    if shapes:
        problems.append(f"has tensors of other shapes than the model's config gives: {'; '.join(shapes[:_MAX_LISTED])}")
    return problems


def plan_load(
    module: Any,
    folder: Path,
    entries: dict[str, TensorEntry],
    *,
    prefix: str,
    init_fresh: list[str] = (),  # type: ignore[assignment]
    ignore_unused: list[str] = (),  # type: ignore[assignment]
    what: str = "checkpoint",
    grow: tuple[str, ...] = (),
    strip: str = "",
    seed: int = 0,
    renames: Mapping[str, str] | None = None,
) -> PendingLoad:
    """Match the parameters of ``module`` (built on meta) with a checkpoint's tensors, strictly.

    Args:
        module: the model whose parameters the checkpoint fills (names as ``named_parameters``,
            tied weights once). A tied parameter is read from whichever of its names the checkpoint
            holds, its ``named_parameters`` name first (a tied model saved with
            ``safetensors.torch.save_model`` keeps ``lm_head.weight`` only), as transformers does.
        folder, entries: the checkpoint folder and its :func:`checkpoint_index`.
        prefix: ``module``'s name in the whole model plus a dot, e.g. ``"lm."``.
        init_fresh: fnmatch patterns (or dotted prefixes) of parameter names the checkpoint may
            lack; they are initialised fresh.
        ignore_unused: patterns of checkpoint keys the model may leave unused.
        what: the config field errors name (``model.foundation.options.checkpoint``).
        grow: parameter names whose first dim may exceed the checkpoint's (vocabulary resized for
            omnicore's special tokens).
        strip: a key prefix the checkpoint may lack (a base model saved without its ``model.``).
        seed: seeds the fresh tensors.
        renames: checkpoint key prefix -> parameter name prefix, tried in order after the name
            itself: a parameter ``tower.blocks.0.attn.qkv.weight`` is read from
            ``model.visual.blocks.0.attn.qkv.weight`` under ``{"model.visual.": "tower."}``. Lets a
            component read its part of a composite checkpoint, in each layout it was published in.

    Raises:
        LoadError: naming ``what``, the folder and the keys: parameters the checkpoint lacks (not in
            ``init_fresh``), checkpoint tensors the model does not use (not in ``ignore_unused``),
            tensors of another shape, and patterns that match nothing.
    """
    params = dict(module.named_parameters())
    buffers = {n for n, _ in module.named_buffers()}
    aliases = tied_names(module)
    sources, rows, fresh, missing, shapes, tied_keys = {}, {}, [], [], [], set()
    for name, p in params.items():
        # a tied parameter is read under whichever of its names the file holds, its own first
        # (safetensors.torch.save_model keeps only lm_head.weight of a tied pair; transformers loads that)
        keys = [k for alias in aliases.get(name, [name]) if (k := _key_of(alias, entries, strip, renames))]
        if not keys:
            (fresh if matches_any(name, list(init_fresh)) else missing).append(name)
            continue
        key = sources[name] = keys[0]
        tied_keys.update(keys[1:])  # the same tensor under its other names: read once
        want, have = tuple(p.shape), entries[key].shape
        if want != have:
            if name in grow and len(want) == len(have) and want[1:] == have[1:] and want[0] > have[0]:
                rows[name] = have[0]
            else:
                shapes.append(f"{key!r}: checkpoint {have}, model {want}")
    used = set(sources.values()) | tied_keys
    unused = [k for k in entries if k not in used and k not in buffers and not matches_any(k, list(ignore_unused))]
    unused = [k for k in unused if not (k == "lm_head.weight" and getattr(module.config, "tie_word_embeddings", False))]
    problems = _fit_problems(missing, unused, shapes, len(params))
    for option, patterns, pool in (("init_fresh", init_fresh, params), ("ignore_unused", ignore_unused, entries)):
        idle = [p for p in patterns if not any(matches_any(n, [p]) for n in pool)]
        if idle:
            problems.append(f"{option} patterns match nothing: {idle}")
    if problems:
        raise LoadError(f"{what}: the checkpoint {str(folder)!r} does not fit the model: {'; '.join(problems)}")
    std = float(getattr(getattr(module, "config", None), "initializer_range", 0.02) or 0.02)
    return PendingLoad(folder, prefix, entries, sources, rows, fresh, std, seed)


def _key_of(name: str, entries: Mapping[str, Any], strip: str, renames: Mapping[str, str] | None) -> str | None:
    """The checkpoint key holding parameter ``name`` (itself, without ``strip``, or through
    ``renames``, as :func:`plan_load` describes), or None."""
    if name in entries:
        return name
    if strip and name.startswith(strip) and name[len(strip) :] in entries:
        return name[len(strip) :]
    for ck, pp in (renames or {}).items():
        if name.startswith(pp) and ck + name[len(pp) :] in entries:
            return ck + name[len(pp) :]
    return None


def tied_names(module: Any) -> dict[str, list[str]]:
    """Every name of each parameter that ``module`` holds under several names (``tie_word_embeddings``:
    ``{"model.embed_tokens.weight": ["model.embed_tokens.weight", "lm_head.weight"]}``), keyed by
    the name ``named_parameters`` gives it, that name first; parameters with one name are left out."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {group[0]: group for group in names.values() if len(group) > 1}


def tied_groups(module: Any) -> list[list[tuple[Any, str]]]:
    """``[(owning module, attribute name), ...]`` per parameter held by several modules (tied
    weights), the first owner in module order first: what :func:`retie` needs to share them again
    after an operation that gives each owner its own tensor (``Module.to_empty``,
    ``load_state_dict(assign=True)``)."""
    owners: dict[int, list[tuple[Any, str]]] = {}
    for m in module.modules():
        for pname, p in m._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((m, pname))
    return [group for group in owners.values() if len(group) > 1]


def retie(groups: list[list[tuple[Any, str]]]) -> None:
    """Make every owner in each group of :func:`tied_groups` hold its first owner's parameter again
    (by the module's parameter table, so it works on wrappers such as PEFT's LoRA layers, whose
    ``weight`` attribute is a read-only view of their base layer's)."""
    for group in groups:
        first = group[0][0]._parameters[group[0][1]]
        for m, pname in group[1:]:
            m._parameters[pname] = first


# ---------------------------------------------------------------------------------------------
# filling the shards
# ---------------------------------------------------------------------------------------------


def _local_and_offset(p: Any) -> tuple[Any, tuple[int, ...]]:
    """``(local tensor, global offset of its first element per dim)`` of a parameter, DTensor or plain.

    Raises:
        LoadError: for a strided (interleaved) shard, whose local part is not one block of the
            global tensor.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return p.data, (0,) * p.dim()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(type(pl).__name__ == "_StridedShard" for pl in p.placements):
        raise LoadError(f"cannot fill a strided shard ({p.placements}) from a checkpoint slice; load this model whole")
    local = p.to_local()
    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    if tuple(shape) != tuple(local.shape):
        raise LoadError(f"shard of shape {tuple(local.shape)} where its placements give {tuple(shape)}")
    return local, tuple(offset)


def _iter_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def materialize(model: Any, device: Any) -> None:
    """Allocate every meta tensor of ``model`` (parameters and buffers, DTensor shards included) on
    ``device`` with ``Module.to_empty``, keeping the values of the tensors that were not on meta
    (encoders loaded whole, adapters, rotary buffers): those are copied aside first and put back.
    Tied parameters (one tensor under several modules, e.g. ``tie_word_embeddings``) stay one
    tensor: ``to_empty`` allocates per module and would untie them. The new tensors hold garbage
    until filled.
    """
    import torch

    tied = tied_groups(model)
    keep = {}
    with torch.no_grad():
        for name, t in _iter_tensors(model):
            local = t.to_local() if hasattr(t, "to_local") else t
            if not local.is_meta:
                keep[name] = local.detach().to("cpu", copy=True)
        model.to_empty(device=device)
        retie(tied)
        for name, t in _iter_tensors(model):
            if name in keep:
                local = t.to_local() if hasattr(t, "to_local") else t
                local.copy_(keep[name])


def to_device_keeping_meta(model: Any, device: Any) -> Any:
    """``model.to(device)`` for every tensor not on meta; meta tensors (still to be filled) stay
    as they are (``Module.to`` would refuse to copy them). Returns ``model``."""
    import torch

    device = torch.device(device)
    return model._apply(lambda t: t if t.is_meta or t.device == device else t.to(device))


def _fresh_value(name: str, shape: tuple[int, ...], dtype: Any, std: float, seed: int) -> Any:
    """The whole fresh tensor of ``name``: the same on every rank and world size (seeded by name)."""
    import torch

    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape, dtype=dtype)
    if len(shape) == 1:
        return torch.ones(shape, dtype=dtype)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen).to(dtype)


def _row_mean(f: Any, key: str, rows: int, chunk: int = 4096) -> Any:
    """Mean of a checkpoint matrix's rows in fp64, read ``chunk`` rows at a time (the new-token
    initialisation of Hewitt 2021, "Initializing New Word Embeddings for Pretrained Language Models",
    which transformers' ``resize_token_embeddings`` also starts from)."""
    import torch

    sl = f.get_slice(key)
    total = None
    for start in range(0, rows, chunk):
        part = sl[start : min(rows, start + chunk)].to(torch.float64).sum(0)
        total = part if total is None else total + part
    return total / rows


def _fill_one(pending: PendingLoad, name: str, p: Any) -> None:
    """Fill this rank's part of parameter ``name`` (its checkpoint slice, grown rows, or fresh values)."""
    from safetensors import safe_open

    local, offset = _local_and_offset(p)
    if local.numel() == 0:
        return
    if name in pending.fresh:
        whole = _fresh_value(pending.prefix + name, tuple(p.shape), local.dtype, pending.init_std, pending.seed)
        local.copy_(whole[tuple(slice(o, o + n) for o, n in zip(offset, local.shape))])
        return
    key = pending.sources[name]
    entry = pending.entries[key]
    # One open per tensor: the pages of a memory-mapped file count in this process's RSS while it is
    # mapped, so keeping a file open over all its tensors would hold every slice read until the end.
    with safe_open(str(entry.file), framework="pt") as f:
        _copy_rows(f, key, local, offset, pending.rows.get(name, entry.shape[0] if entry.shape else 0))


def _copy_rows(f: Any, key: str, local: Any, offset: tuple[int, ...], have: int) -> None:
    """Copy rows ``offset[0] ...`` of checkpoint tensor ``key`` (of which ``have`` rows exist) into ``local``."""
    if not local.dim():
        local.copy_(f.get_slice(key)[...].to(local.dtype))
        return
    start, n = offset[0], local.shape[0]
    tail = tuple(slice(o, o + k) for o, k in zip(offset[1:], local.shape[1:]))
    stop = min(start + n, have)
    if stop > start:
        local[: stop - start].copy_(f.get_slice(key)[(slice(start, stop), *tail)].to(local.dtype))
    if start + n > have:  # rows beyond the checkpoint's vocabulary
        mean = _row_mean(f, key, have)[tail].to(local.dtype) if tail else _row_mean(f, key, have).to(local.dtype)
        local[max(0, have - start) :].copy_(mean.expand_as(local[max(0, have - start) :]))


def fill_pending(model: Any, device: Any = "cpu") -> int:
    """Fill the meta parameters of ``model`` (``model.pending_loads``, set by the build) from their
    checkpoints, shard by shard; run after the parallel strategies are applied. Returns the number
    of parameters filled. ``pending_loads`` is emptied.

    Each rank allocates only its own shards and reads only their slices of the checkpoint tensors
    (safetensors ``get_slice``: a memory-mapped read of those bytes). Values are cast to each
    parameter's dtype. Rows beyond a checkpoint's vocabulary get the mean of its rows; ``fresh``
    parameters their seeded initial values.

    Raises:
        LoadError: a parameter's shard is strided (its local part is not one block), or a
            pending parameter is not in the model any more.
    """
    import torch

    loads: list[PendingLoad] = list(getattr(model, "pending_loads", None) or [])
    if not loads:
        return 0
    materialize(model, device)
    params = dict(model.named_parameters())
    count = 0
    with torch.no_grad():
        for pending in loads:
            for name in list(pending.sources) + pending.fresh:
                full = pending.prefix + name
                if full not in params:
                    raise LoadError(f"parameter {full!r} to load from {pending.folder} is not in the model any more")
                _fill_one(pending, name, params[full])
                count += 1
    model.pending_loads = []
    return count


def rename_pending(model: Any, renames: dict[str, str]) -> None:
    """Follow parameters that moved in the module tree before the fill (LoRA wraps a layer, so its
    ``q_proj.weight`` becomes ``q_proj.base_layer.weight``): ``renames`` maps old to new full
    parameter names of ``model``; each pending load of ``model.pending_loads`` is updated."""
    for pending in getattr(model, "pending_loads", None) or []:
        n = len(pending.prefix)
        local = {old[n:]: new[n:] for old, new in renames.items() if old.startswith(pending.prefix) and new.startswith(pending.prefix)}
        if not local:
            continue
        pending.sources = {local.get(k, k): v for k, v in pending.sources.items()}
        pending.rows = {local.get(k, k): v for k, v in pending.rows.items()}
        pending.fresh = [local.get(k, k) for k in pending.fresh]


def fill_now(model: Any) -> Any:
    """Fill a module returned with its parameters on meta (an ``omnicore_pending_load`` attribute,
    as the built-in ``hf_causal_lm`` returns a safetensors checkpoint, or a family's tower from
    :func:`plan_checkpoint`) on this process, whole, and return it; a module without one is
    returned as it is. Tied parameters stay tied. For code that uses a foundation's
    ``build_model`` or an encoder alone (tests, tools); :func:`omnicore.model.build.build_omni_model`
    collects the plan instead and fills after sharding.

    Raises:
        LoadError: see :func:`fill_pending`.
    """
    pending = getattr(model, "omnicore_pending_load", None)
    if pending is None:
        return model
    del model.omnicore_pending_load
    model.pending_loads = [pending]
    fill_pending(model)
    del model.pending_loads
    return model
