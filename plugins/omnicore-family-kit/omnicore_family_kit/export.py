"""Export through the transformers class's own ``save_pretrained``: one way for every family.

The trained tensors of a family's parts (its encoder modules and its language model) are renamed
to the class's names by each part's :class:`~omnicore_family_kit.keymap.KeyMap`, given to the class
built on the meta device by assignment (no copy), checked strictly (every tensor of the class filled,
none left over), and written by the class's ``save_pretrained``: sharded as transformers shards,
under the names it writes (its conversion to a published layout included), with its
``config.json``. The files written are then read back, headers only: every tensor the class's
``from_pretrained`` expects is there with its shape.

One part alone (an encoder's ``save_pretrained``: a folder its factory loads back) is written by
:func:`save_part`, under the names the class's ``save_pretrained`` would give those tensors; it is
the only place a family writes safetensors itself.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omnicore_family_kit.keymap import KeyMap

PROCESSOR_FILES = (
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
    "chat_template.jinja",
)
"""A published folder's processor files, copied unchanged into an export where the family writes
no processor of its own."""


def class_state(parts: Iterable[tuple[Any, KeyMap]]) -> dict[str, Any]:
    """The class's state dict from omnicore modules: ``(module, key map)`` per part, each module's
    ``state_dict()`` renamed by :meth:`KeyMap.to_class`, detached, on the CPU.

    Raises:
        ValueError: two parts give one class name.
    """
    out: dict[str, Any] = {}
    for module, keys in parts:
        for name, value in module.state_dict().items():
            theirs = keys.to_class(name)
            if theirs in out:
                raise ValueError(f"export: two parts write {theirs!r}; their key maps overlap")
            out[theirs] = value.detach().cpu()
    return out


def build_on_meta(model_class: type, config: Any, dtype: Any) -> Any:
    """``model_class(config)`` with its parameters on the meta device, in ``dtype``."""
    from omnicore.api import on_meta

    with on_meta():
        return model_class(config).to(dtype)


def save_through_class(model_class: type, config: Any, state: dict[str, Any], folder: Path, *, dtype: Any) -> Any:
    """Write ``folder`` with ``model_class(config).save_pretrained`` from ``state``.

    Args:
        model_class: the published class (``LlavaForConditionalGeneration``).
        config: its config, as it is to be written (trained vocabulary size, token ids).
        state: every tensor of the class under its in-memory names (:func:`class_state`); tied
            tensors (``lm_head.weight`` when the embeddings are tied) may be left out.
        folder: the export folder (created).
        dtype: the parameters' dtype in the export (the trained one).

    Returns:
        the class instance written (its tensors are ``state``'s).

    Raises:
        RuntimeError: ``state`` does not fill the class (names missing or left over: the message
            lists a few of each), or the files written lack a tensor the class expects.
    """
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = build_on_meta(model_class, config, dtype)
    tied = set(_tied_names(model))
    expected = set(model.state_dict())
    missing = sorted(expected - set(state) - tied)
    extra = sorted(set(state) - expected)
    if missing or extra:
        raise RuntimeError(
            f"export: the trained tensors do not fill {model_class.__name__}: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"left over {extra[:5]}{'...' if len(extra) > 5 else ''}"
        )
    model.load_state_dict({k: v for k, v in state.items() if k not in tied or k in state}, strict=False, assign=True)
    if tied:
        model.tie_weights()
    still = [n for n, p in model.named_parameters() if p.is_meta]
    if still:
        raise RuntimeError(f"export: {model_class.__name__} has tensors no part gave: {still[:5]}")
    clear_weights(folder)
    with torch.no_grad():  # conversions on saving (Mimi's weight norm) need no graph
        model.save_pretrained(folder)
    check_written(model, folder)
    return model


def clear_weights(folder: Path) -> None:
    """Remove a former export's weights from ``folder`` (``model*.safetensors`` and their index):
    ``save_pretrained`` replaces only the files of its own layout, and a stale
    ``model.safetensors`` next to a new index (or the reverse) would be read instead."""
    for file in Path(folder).glob("model*.safetensors"):
        file.unlink()
    Path(folder, "model.safetensors.index.json").unlink(missing_ok=True)


def save_part(
    module: Any,
    keys: KeyMap,
    config: Any,
    folder: Path,
    *,
    model_class: type,
    source: Path | None = None,
    files: Iterable[str] = PROCESSOR_FILES,
) -> dict[str, tuple[int, ...]]:
    """Write ``folder`` as a checkpoint of ``model_class`` holding only one part: ``config.json``
    (``config``, the whole composite's), ``model.safetensors`` with ``module``'s tensors (persistent
    buffers included) and ``files`` copied from ``source``. An encoder's ``save_pretrained``: its
    factory loads the folder back through the same key map.

    The tensors are named as ``model_class(config).save_pretrained`` names them: each name through
    :meth:`KeyMap.to_class`, then transformers' own conversion on saving (``revert_weight_conversion``
    of the class built on the meta device: ``model.visual.*`` of Qwen2-VL is written ``visual.*``,
    Mimi's in-memory names its flat published ones). A tensor the class ties to another one of the
    part (CSM's audio embedding) is written once, under the name the class keeps.

    Args:
        module: the part (``nn.Module``; unsharded, on any device: the tensors are copied to the CPU).
        keys: its key map (:attr:`KeyMap.parts` cover every name of ``module.state_dict()``).
        config: the composite config to write (and to build ``model_class`` from).
        model_class: the published class whose layout the folder has.
        source: the folder whose ``files`` are copied (processor files); None copies nothing.

    Returns:
        ``name -> shape`` of the tensors written.

    Raises:
        KeyError: a name of ``module`` under none of ``keys.parts``; ValueError: two names land on
            one class name; RuntimeError: a name the class does not hold (the key map is wrong).
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = class_state([(module, keys)])
    model = build_on_meta(model_class, config, next(iter(state.values())).dtype)
    expected = set(model.state_dict())
    stray = sorted(set(state) - expected)
    if stray:
        raise RuntimeError(f"save_part: {model_class.__name__} holds no {stray[:5]}; the key map's parts are wrong")
    tied = getattr(model, "_tied_weights_keys", None) or {}
    for target, kept in tied.items() if isinstance(tied, dict) else []:
        if target in state and kept in state:  # one tensor under two names: the class keeps one
            del state[target]
    state = _saved_layout(model, _unshared(state))
    clear_weights(folder)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(folder)
    if source is not None:
        copy_extra_files(source, folder, files)
    return {k: tuple(v.shape) for k, v in state.items()}


def _unshared(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with no two tensors on one storage (safetensors refuses aliases): a tensor sharing
    the storage of one before it is copied. The class's own ties are dropped before this, so what is
    left are tensors the class holds apart."""
    seen: set[int] = set()
    out = {}
    for k, v in state.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.clone() if ptr in seen and v.numel() else v
        seen.add(ptr)
    return out


def _saved_layout(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (class names) under the names ``model.save_pretrained`` writes."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # no conversion in this transformers: the in-memory names are written
        return state
    return dict(revert_weight_conversion(model, dict(state)))


def _tied_names(model: Any) -> list[str]:
    """The names the class ties to another tensor (``lm_head.weight`` with tied embeddings)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if not getattr(model.config, "tie_word_embeddings", False):  # what transformers' tie_weights reads (the top-level config)
        return []
    return list(tied) if isinstance(tied, dict) else list(tied)


def check_written(model: Any, folder: Path) -> None:
    """Read the written safetensors headers back: every tensor that ``save_pretrained`` writes for
    ``model`` is there with its shape (what the class's ``from_pretrained`` reads strictly); of a
    tensor the model holds under several names (tied embeddings), one name is enough.

    Raises:
        RuntimeError: a tensor is missing or has another shape (naming it).
    """
    written = written_shapes(folder)
    for names, shape in saved_groups(model):
        present = [n for n in names if n in written]
        if not present:
            raise RuntimeError(f"export: {folder} lacks {names[0]!r}, which the class reads; export again")
        for name in present:
            if tuple(written[name]) != tuple(shape):
                raise RuntimeError(f"export: {folder} holds {name} of shape {tuple(written[name])}, the class expects {tuple(shape)}")


def written_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of every tensor in a folder's safetensors files (headers only).

    Raises:
        RuntimeError: the folder holds no ``*.safetensors`` file.
    """
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"export: {folder} holds no safetensors file")
    out: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                out[key] = tuple(f.get_slice(key).get_shape())
    return out


def saved_groups(model: Any) -> list[tuple[list[str], tuple[int, ...]]]:
    """Each tensor of ``model`` as ``(the names save_pretrained may write it under, shape)``: its
    in-memory names (several when tied) put through transformers' conversion to the published
    layout (``revert_weight_conversion``, names only: each name's value is followed by identity)."""
    state = model.state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}
    for name, value in state.items():
        groups.setdefault(id(value), []).append(name)
    tags = {name: _Tag() for name in state}
    try:
        from transformers.core_model_loading import revert_weight_conversion

        converted = revert_weight_conversion(model, dict(tags))
        saved = {id(v): k for k, v in converted.items()}
    except Exception:  # no conversion in this transformers, or one that needs real tensors
        saved = {}
    rename = {name: saved.get(id(tag), name) for name, tag in tags.items()}
    return [([rename[n] for n in names], tuple(state[names[0]].shape)) for names in groups.values()]


class _Tag:
    """A value whose identity follows one name through the conversion."""


def copy_extra_files(source: Path, folder: Path, names: Iterable[str] = PROCESSOR_FILES) -> None:
    """Copy ``names`` present in ``source`` into ``folder`` (nothing when they are one folder)."""
    source, folder = Path(source), Path(folder)
    if source.resolve() == folder.resolve():
        return
    for name in names:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
