"""Weights in a component's folder: the library's checkpoint, and omnicore's own extra weights.

A saved component folder holds two kinds of weights, each read and written in one place:

* **The library's checkpoint** (a transformers or diffusers model), read by
  :func:`load_hf_pretrained` through the library's own ``from_pretrained``: ``config.json`` plus
  ``model.safetensors`` (or a sharded ``model.safetensors.index.json``; diffusers:
  ``diffusion_pytorch_model.safetensors``). It may hold a larger model than the one loaded (a full
  ``SiglipModel`` for its vision tower, a ``WhisperForConditionalGeneration`` for its encoder);
  every tensor of the loaded model must be in it.
* **omnicore's extra weights** (projectors, adapters: whatever a component adds to the library
  model), written by :func:`save_extra_weights` and read by :func:`load_extra_weights`: one
  safetensors file named :data:`EXTRA_WEIGHTS_FILE` (``omnicore_extra.safetensors``) holding the
  tensors of one module under their ``state_dict`` names, with these metadata strings::

      format                 "pt"
      omnicore_extra_format  "1"
      component              which component wrote it, e.g. "encoder/siglip"
      shapes                 JSON {tensor name: [dims]}
      meta                   JSON object of the component's settings, e.g. {"hidden_size": 512}

Nothing is ever downloaded: paths must be local folders, and ``from_pretrained`` is called with
``local_files_only=True`` (so ``HF_HUB_OFFLINE`` is moot).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
EXTRA_WEIGHTS_FILE = "omnicore_extra.safetensors"
"""File name of omnicore's extra weights in a component folder (see the module docstring)."""
EXTRA_FORMAT_VERSION = "1"

_WEIGHT_FILES = {
    "transformers": ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"),
    "diffusers": (
        "diffusion_pytorch_model.safetensors",
        "diffusion_pytorch_model.safetensors.index.json",
        "diffusion_pytorch_model.bin",
    ),
}
_MAX_LISTED = 20


# ---------------------------------------------------------------------------------------------
# Library checkpoints
# ---------------------------------------------------------------------------------------------


def load_hf_pretrained(
    model_cls: type,
    path: str | os.PathLike,
    *,
    config: Any = None,
    config_overrides: Mapping[str, Any] | None = None,
    prefixes: Sequence[str] = (),
    dtype: torch.dtype = torch.float32,
    what: str | None = None,
    hint: str = "",
) -> Any:
    """Load a local Hugging Face-layout folder into ``model_cls`` with the library's ``from_pretrained``.

    ``model_cls`` is a transformers ``PreTrainedModel`` or a diffusers ``ModelMixin`` subclass. The
    folder needs ``config.json`` and the library's weights (transformers: ``model.safetensors``,
    a sharded ``model.safetensors.index.json`` or ``pytorch_model.bin``; diffusers:
    ``diffusion_pytorch_model.safetensors``). What the library does by itself is kept: transformers
    drops the model's ``base_model_prefix`` from checkpoint names (``SiglipVisionModel`` from a full
    ``SiglipModel`` folder takes the ``vision_model.*`` tensors) and takes a sub-config by its
    ``base_config_key`` (the ``vision_config`` of a full SigLIP ``config.json``).

    Loading is strict: every tensor of the model must come from the checkpoint under the same shape;
    tensors of the checkpoint that the model lacks (a text tower, a decoder, a pooling head) are
    skipped and logged.

    Args:
        model_cls: the class to build, e.g. ``transformers.SiglipVisionModel``.
        path: a local folder. Nothing is downloaded (``local_files_only=True``).
        config: a config object to build with instead of the folder's (transformers only; copied,
            never modified). The folder's ``config.json`` must still describe this architecture.
        config_overrides: config attributes to set before building (transformers only), e.g.
            ``{"vision_use_head": False}`` to leave out a part; each must be an attribute the config has.
        prefixes: checkpoint tensor-name prefixes to strip (transformers only, through its
            ``key_mapping``), for models that hold this one under a name the library does not strip
            itself, e.g. ``("model.encoder.", "encoder.")`` for a ``WhisperEncoder`` from a
            ``WhisperForConditionalGeneration`` or ``WhisperModel`` folder. None may start a name of
            the model's own tensors.
        dtype: dtype of the floating-point parameters (float32 by default, whatever the checkpoint holds).
        what: how errors name the model ("SigLIP checkpoint folder ..."); default the class name.
        hint: appended to every error about the folder, e.g. which folders the caller accepts.

    Returns:
        the model on CPU, in eval mode as ``from_pretrained`` leaves it. Under a
        ``torch.device("meta")`` context (``omnicore plan`` builds models there to count shapes)
        the model is built from its config on meta and no weights are read: transformers refuses
        ``from_pretrained`` on meta, and there is nothing to load into meta tensors anyway.

    Raises:
        TypeError: if ``model_cls`` is neither a transformers nor a diffusers model class.
        ValueError: naming the folder, if it does not exist, has no ``config.json`` or no weights,
            its ``config.json`` describes another architecture, a tensor of the model is missing
            (listed by name), a tensor has another shape (names and both shapes listed), a
            ``config_overrides`` key is unknown, a prefix clashes with the model's own names, or
            ``config``/``config_overrides``/``prefixes`` are given for a diffusers class.
    """
    library = _library_of(model_cls)
    folder = Path(path).expanduser()
    label = what or model_cls.__name__
    tail = f"; {hint}" if hint else ""
    _check_folder(model_cls, library, folder, label, tail)
    kwargs: dict[str, Any] = {"local_files_only": True, "output_loading_info": True, "ignore_mismatched_sizes": True}
    if library == "transformers":
        config = _config_with(model_cls, folder, config, config_overrides)
        if config is not None:
            kwargs["config"] = config
        if prefixes:
            alternatives = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
            kwargs["key_mapping"] = {f"^(?:{alternatives})": ""}
        kwargs["dtype"] = dtype
    else:
        if config is not None or config_overrides or prefixes:
            raise ValueError(
                f"load_hf_pretrained: config, config_overrides and prefixes are for transformers models, not {model_cls.__name__}"
            )
        kwargs.update(torch_dtype=dtype, low_cpu_mem_usage=False)  # no accelerate needed

    if torch.get_default_device().type == "meta":
        return _build_on_meta(model_cls, library, folder, kwargs.get("config"), dtype)
    with _quiet_library(library):
        model, info = model_cls.from_pretrained(str(folder), **kwargs)
    _check_loading_info(model, info, folder, label, prefixes, tail)
    return model


def _check_folder(model_cls: type, library: str, folder: Path, label: str, tail: str) -> None:
    """Raise ValueError unless ``folder`` holds a ``config.json`` of ``model_cls`` and the library's weights."""
    if not folder.is_dir():
        raise ValueError(f"{label} checkpoint folder {str(folder)!r} does not exist or is not a folder{tail}")
    cfg_file = folder / CONFIG_FILE
    if not cfg_file.is_file():
        raise ValueError(f"{label} checkpoint folder {str(folder)!r} has no {CONFIG_FILE}{tail}")
    try:
        data = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {cfg_file}: {exc}{tail}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{cfg_file} is not a JSON object{tail}")
    _check_architecture(model_cls, library, data, cfg_file, tail)
    if not any((folder / name).is_file() for name in _WEIGHT_FILES[library]):
        raise ValueError(
            f"{label} checkpoint folder {str(folder)!r} has {CONFIG_FILE} but no weights "
            f"(expected one of {', '.join(_WEIGHT_FILES[library])}){tail}"
        )


def _config_with(model_cls: type, folder: Path, config: Any, overrides: Mapping[str, Any] | None) -> Any:
    """A copy of ``config`` (or the folder's, if there are overrides) with ``overrides`` set; None if neither."""
    if not overrides:
        return copy.deepcopy(config) if config is not None else None
    config = copy.deepcopy(config) if config is not None else model_cls.config_class.from_pretrained(str(folder), local_files_only=True)
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise ValueError(f"config_overrides: {type(config).__name__} has no attribute {key!r}")
        setattr(config, key, value)
    return config


def _build_on_meta(model_cls: type, library: str, folder: Path, config: Any, dtype: torch.dtype) -> Any:
    """The model of ``folder``'s config (or ``config``) with meta tensors, in eval mode."""
    with _quiet_library(library):
        if library == "transformers":
            if config is None:
                config = model_cls.config_class.from_pretrained(str(folder), local_files_only=True)
            model = model_cls(config)
        else:
            model = model_cls.from_config(model_cls.load_config(str(folder), local_files_only=True))
    if any(p.is_floating_point() and p.dtype != dtype for p in model.parameters()):
        model = model.to(dtype)
    return model.eval()


def _library_of(model_cls: type) -> str:
    """``"transformers"`` or ``"diffusers"``, from the class's bases (without importing diffusers)."""
    for base in getattr(model_cls, "__mro__", ()):
        module = base.__module__.split(".")[0]
        if base.__name__ == "PreTrainedModel" and module == "transformers":
            return "transformers"
        if base.__name__ == "ModelMixin" and module == "diffusers":
            return "diffusers"
    raise TypeError(f"load_hf_pretrained needs a transformers PreTrainedModel or diffusers ModelMixin class, got {model_cls!r}")


def _check_architecture(model_cls: type, library: str, data: dict[str, Any], cfg_file: Path, tail: str) -> None:
    """Raise ValueError unless ``config.json`` (``data``) describes ``model_cls`` (or a model holding it)."""
    if library == "diffusers":
        found = data.get("_class_name")
        if found is None and "model_type" in data:
            raise ValueError(
                f"{cfg_file} is a transformers config (model_type {data['model_type']!r}), not a diffusers {model_cls.__name__}{tail}"
            )
        if found not in (None, model_cls.__name__):
            raise ValueError(f"{cfg_file} describes a {found}, not a {model_cls.__name__}{tail}")
        return
    config_class = model_cls.config_class
    expected = config_class.model_type
    found = data.get("model_type")
    if found == expected:
        return
    # as the library's config loader: a composite config holding this model's config is fine
    key = getattr(config_class, "base_config_key", "")
    subs = [data[key]] if key and isinstance(data.get(key), dict) else [v for v in data.values() if isinstance(v, dict)]
    if any(sub.get("model_type", expected if key else None) == expected for sub in subs):
        return
    held = f" (or a config whose {key!r} is one)" if key else ""
    raise ValueError(f"{cfg_file} has model_type {found!r}, but {model_cls.__name__} needs model_type {expected!r}{held}{tail}")


@contextlib.contextmanager
def _quiet_library(library: str) -> Iterator[None]:
    """Silence the library's load report and progress bars: skipped tensors are intended here and
    missing or mismatched ones become our own errors."""
    import transformers.utils.logging as hf_logging

    loggers = [hf_logging]
    if library == "diffusers":
        import diffusers.utils.logging as df_logging

        loggers.append(df_logging)
    saved = [(lg, lg.get_verbosity(), lg.is_progress_bar_enabled()) for lg in loggers]
    for lg in loggers:
        lg.set_verbosity_error()
        lg.disable_progress_bar()
    try:
        yield
    finally:
        for lg, level, bars in saved:
            lg.set_verbosity(level)
            if bars:
                lg.enable_progress_bar()


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in items[:_MAX_LISTED])
    return shown + (f" and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def _check_loading_info(model: Any, info: dict[str, Any], folder: Path, label: str, prefixes: Sequence[str], tail: str) -> None:
    own = list(model.state_dict())
    clash = [p for p in prefixes if any(k.startswith(p) for k in own)]
    if clash:
        raise ValueError(
            f"prefixes {clash} also start tensor names of {type(model).__name__} itself (e.g. {own[0]!r}); strip only names the model lacks"
        )
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        stripped = f" after stripping the prefixes {list(prefixes)}" if prefixes else ""
        raise ValueError(
            f"{label} checkpoint {str(folder)!r} lacks {len(missing)} of the {len(own)} tensors of {type(model).__name__}{stripped}: "
            f"{_names(missing)}{tail}"
        )
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda row: row[0])
    if mismatched:
        rows = "; ".join(f"{k}: checkpoint {tuple(a)}, model {tuple(b)}" for k, a, b in mismatched[:_MAX_LISTED])
        raise ValueError(f"{label} checkpoint {str(folder)!r} has tensors of other shapes than its config gives: {rows}{tail}")
    errors = info.get("error_msgs") or []
    if errors:
        raise ValueError(f"{label} checkpoint {str(folder)!r} failed to load: {'; '.join(map(str, errors))}{tail}")
    skipped = sorted(info.get("unexpected_keys") or ())
    logger.info(
        "loaded %s from %s (%d tensors); skipped %d checkpoint tensors it lacks%s",
        type(model).__name__,
        folder,
        len(own),
        len(skipped),
        f" ({_names(skipped)})" if skipped else "",
    )


# ---------------------------------------------------------------------------------------------
# omnicore's extra weights
# ---------------------------------------------------------------------------------------------


def save_extra_weights(
    path: str | os.PathLike, module_or_state_dict: nn.Module | Mapping[str, torch.Tensor], *, component: str, **meta: Any
) -> Path:
    """Write ``path/omnicore_extra.safetensors``: one module's tensors plus ``component`` and ``meta``.

    Args:
        path: the component's folder (created if missing), usually the one its library checkpoint
            was just saved to.
        module_or_state_dict: an unsharded ``nn.Module`` (all of its ``state_dict``) or a mapping of
            names to tensors (any shapes and dtypes; copied to CPU as they are).
        component: who wrote it, as ``"kind/name"`` (e.g. ``"encoder/siglip"``); loading checks it.
        **meta: JSON-serialisable settings the weights depend on or the component needs back, e.g.
            ``hidden_size=512``; :func:`load_extra_weights` returns them and names them in errors.

    Returns:
        the path of the file written (replaced atomically if it existed).

    Raises:
        ValueError: if there are no tensors, a tensor is a DTensor (gather the module first) or
            ``meta`` is not JSON-serialisable.
        TypeError: if a value of ``module_or_state_dict`` is not a tensor.
    """
    from safetensors.torch import save_file

    state = module_or_state_dict.state_dict() if isinstance(module_or_state_dict, nn.Module) else dict(module_or_state_dict)
    if not state:
        raise ValueError(f"save_extra_weights({component!r}): no tensors to save")
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"save_extra_weights({component!r}): {name!r} is a {type(tensor).__name__}, not a tensor")
        if type(tensor).__name__ == "DTensor":
            raise ValueError(
                f"save_extra_weights({component!r}): {name!r} is a sharded DTensor; save an unsharded copy (e.g. gathered on rank 0)"
            )
        tensors[name] = tensor.detach().to("cpu").clone().contiguous()  # clone: no shared storage for safetensors
    try:
        meta_json = json.dumps(meta)
    except TypeError as exc:
        raise ValueError(f"save_extra_weights({component!r}): meta must be JSON-serialisable: {exc}") from exc
    metadata = {
        "format": "pt",
        "omnicore_extra_format": EXTRA_FORMAT_VERSION,
        "component": component,
        "shapes": json.dumps({k: list(v.shape) for k, v in tensors.items()}, sort_keys=True),
        "meta": meta_json,
    }
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / EXTRA_WEIGHTS_FILE
    tmp = folder / f".{EXTRA_WEIGHTS_FILE}.tmp"
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, final)
    return final


def load_extra_weights(
    path: str | os.PathLike,
    module: nn.Module | Mapping[str, torch.Tensor] | None,
    *,
    component: str,
    required: bool = True,
    legacy_files: Sequence[str] = (),
) -> dict[str, Any] | None:
    """Read ``path/omnicore_extra.safetensors`` into ``module`` (strict) and return its ``meta``.

    Args:
        path: the component's folder.
        module: an unsharded ``nn.Module`` whose ``state_dict`` the file must match exactly (names
            and shapes; values are copied in place, cast to each tensor's dtype), or a mapping of
            names to the tensors to fill (e.g. parameters of several submodules); None: only
            check the file and return its ``meta`` (e.g. a setting needed to build the module).
        component: the ``"kind/name"`` the file must have been written for.
        required: if False, a folder without the file returns None and leaves ``module`` as it is
            (a plain library checkpoint: the extra weights start fresh).
        legacy_files: names of files an older version wrote instead; if the file is missing and
            one of these is present, loading fails with what to do rather than ignoring them.

    Returns:
        the ``meta`` given to :func:`save_extra_weights` (a dict), or None (file absent, not required).

    Raises:
        ValueError: naming the file: if it is missing (``required``) or a legacy file is found in
            its place; if it is not omnicore's extra-weights format or was written for another
            component; if its tensor names differ from the module's (missing and unexpected names
            listed) or a shape differs (each name with the file's and the module's shape, the saved
            ``meta``, and what to do).
    """
    from safetensors import safe_open

    folder = Path(path)
    file = folder / EXTRA_WEIGHTS_FILE
    if not file.is_file():
        old = [name for name in legacy_files if (folder / name).exists()]
        if old:
            raise ValueError(
                f"{folder} holds {', '.join(old)} from an older version of {component} but no {EXTRA_WEIGHTS_FILE}: "
                f"these weights are now saved in {EXTRA_WEIGHTS_FILE}. Re-save the folder (load it with the version that "
                f"wrote it and call save_pretrained with this one), or delete {', '.join(old)} to start these weights afresh"
            )
        if required:
            raise ValueError(
                f"{folder} has no {EXTRA_WEIGHTS_FILE} (omnicore's extra weights of {component}); save the component there with save_pretrained"
            )
        return None
    shapes, meta = _read_extra_header(file, component)
    if module is None:
        return meta
    targets = dict(module.state_dict()) if isinstance(module, nn.Module) else dict(module)
    _check_fit(file, component, shapes, targets, meta)
    with safe_open(str(file), framework="pt") as f, torch.no_grad():
        for name, target in targets.items():
            target.copy_(f.get_tensor(name).to(target.dtype))
    return meta


def _read_extra_header(file: Path, component: str) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
    """``(shapes by tensor name, meta)`` of an extra-weights file, after checking its format and component."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        header = f.metadata() or {}
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    version = header.get("omnicore_extra_format")
    if version != EXTRA_FORMAT_VERSION:
        raise ValueError(
            f"{file} is not omnicore extra weights of format {EXTRA_FORMAT_VERSION} (omnicore_extra_format={version!r}); re-save it with save_pretrained"
        )
    if header.get("component") != component:
        raise ValueError(
            f"{file} holds extra weights of {header.get('component')!r}, not of {component!r}; point the checkpoint at a folder saved by {component}"
        )
    return shapes, json.loads(header.get("meta") or "{}")


def _check_fit(
    file: Path, component: str, shapes: dict[str, tuple[int, ...]], targets: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    """Raise ValueError listing every name and shape by which the file and the module differ."""
    problems = []
    missing = sorted(set(targets) - set(shapes))
    unexpected = sorted(set(shapes) - set(targets))
    if missing:
        problems.append(f"missing tensors {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors {_names(unexpected)}")
    for name in sorted(set(targets) & set(shapes)):
        if shapes[name] != tuple(targets[name].shape):
            problems.append(f"{name!r} has shape {shapes[name]} in the file, {tuple(targets[name].shape)} in this module")
    if problems:
        saved = ", ".join(f"{k}={v!r}" for k, v in meta.items()) or "no settings recorded"
        raise ValueError(
            f"{file} (extra weights of {component}) does not fit this module: {'; '.join(problems)}. It was saved with "
            f"{saved}: build {component} with those settings, or delete {file.name} to start these weights afresh"
        )
