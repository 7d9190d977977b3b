"""Export through the transformers class's own ``save_pretrained``: one way for every family.

The trained tensors of a family's parts (its encoder modules and its language model) are renamed
to the class's names by each part's :class:`~omnicore_family_kit.keymap.KeyMap`, given to the class
built on the meta device by assignment (no copy), checked strictly (every tensor of the class filled,
none left over), and written by the class's ``save_pretrained``: sharded as transformers shards,
under the names it writes (its conversion to a published layout included), with its
``config.json``. The files written are then read back, headers only: every tensor the class's
``from_pretrained`` expects is there with its shape.
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
    model.save_pretrained(folder)
    check_written(model, folder)
    return model


def _tied_names(model: Any) -> list[str]:
    """The names the class ties to another tensor (``lm_head.weight`` with tied embeddings)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if not getattr(model.config.get_text_config(), "tie_word_embeddings", getattr(model.config, "tie_word_embeddings", False)):
        return []
    return list(tied) if isinstance(tied, dict) else list(tied)


def check_written(model: Any, folder: Path) -> None:
    """Read the written safetensors headers back: every tensor that ``save_pretrained`` writes for
    ``model`` is there with its shape (what the class's ``from_pretrained`` reads strictly).

    Raises:
        RuntimeError: a tensor is missing or has another shape (naming it).
    """
    written = written_shapes(folder)
    want = saved_names(model)
    missing = sorted(set(want) - set(written))
    if missing:
        raise RuntimeError(f"export: {folder} lacks {len(missing)} tensors the class reads, e.g. {missing[:3]}; export again")
    for name, shape in want.items():
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


def saved_names(model: Any) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of what ``model.save_pretrained`` writes (transformers' conversion to the
    published layout applied to the in-memory names; tied copies left out)."""
    state = model.state_dict()
    tied = set(_tied_names(model))
    state = {k: v for k, v in state.items() if k not in tied}
    try:
        from transformers.core_model_loading import revert_weight_conversion

        state = revert_weight_conversion(model, dict(state))
    except ImportError:  # no conversion in this transformers: the in-memory names are written
        pass
    return {k: tuple(v.shape) for k, v in state.items()}


def copy_extra_files(source: Path, folder: Path, names: Iterable[str] = PROCESSOR_FILES) -> None:
    """Copy ``names`` present in ``source`` into ``folder`` (nothing when they are one folder)."""
    source, folder = Path(source), Path(folder)
    if source.resolve() == folder.resolve():
        return
    for name in names:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
