"""Where each part of a Qwen2-VL / Qwen2.5-VL checkpoint lives, in both layouts it is found in.

* The published layout (``Qwen/Qwen2-VL-2B-Instruct``, ``Qwen/Qwen2.5-VL-3B-Instruct``; also what
  transformers 5's ``save_pretrained`` writes, its conversion mapping reversed): ``visual.*`` (the
  tower and its ``visual.merger.*``), ``model.embed_tokens.*``, ``model.layers.*``,
  ``model.norm.*``, ``lm_head.*``.
* The in-memory layout of transformers 5's ``...ForConditionalGeneration`` (``model.visual.*``,
  ``model.language_model.*``, ``lm_head.*``), which its ``from_pretrained`` also loads.

:func:`plan_part` is the one place the parts are read: it returns the core's strict, sharded load
plan (:func:`omnicore.api.plan_checkpoint`), filled after sharding. :func:`load_now` fills a module
carrying such a plan on this process (tests and tools that use a component alone).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TOWER_RENAMES = {"model.visual.": "visual."}
"""Checkpoint prefix -> the encoder module's parameter prefix (the published ``visual.*`` is its own)."""
LM_RENAMES = {"model.language_model.": "model."}
"""Checkpoint prefix -> the text LM's parameter prefix (the published ``model.*`` and ``lm_head.*`` are its own)."""
TOWER_PARTS = ("visual", "model.visual")
LM_PARTS = ("model.language_model", "model.embed_tokens", "model.layers", "model.norm", "lm_head")


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file of a checkpoint folder (``model.safetensors`` or its index),
    reading only headers; empty when the folder holds neither."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return {k: folder / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        return {}
    with safe_open(str(single), "pt") as f:
        return dict.fromkeys(f.keys(), single)


def plan_part(
    module: Any, folder: Path, *, renames: dict[str, str], other_parts: tuple[str, ...], what: str, grow: tuple[str, ...] = ()
) -> Any:
    """The strict load plan of ``module`` (built under :func:`omnicore.api.on_meta`) from its part of
    the composite checkpoint in ``folder``: ``renames`` name the part in either layout, and the other
    parts' tensors present there (``other_parts`` prefixes) are left unused on purpose.

    Raises:
        LoadError: (``ValueError``) naming ``what``: no safetensors, or tensors missing, extra or of
            another shape.
    """
    from omnicore.api import plan_checkpoint

    keys = checkpoint_files(folder)
    ignore = [p for p in other_parts if any(k.startswith(p + ".") for k in keys)]
    return plan_checkpoint(module, folder, renames=renames, ignore_unused=ignore, what=what, grow=grow)


def load_now(module: Any) -> Any:
    """Fill ``module``'s meta parameters from its ``omnicore_pending_load`` plan on this process and
    return it (a module without a plan is returned as it is). Rows beyond the checkpoint's (a grown
    vocabulary) get the mean of its rows, as the core's fill gives them.

    This is what the core does after sharding, for one module used alone; it reads the plan's
    ``folder`` and ``sources`` (parameter name -> checkpoint key).

    Raises:
        ValueError: the plan does not cover every parameter.
    """
    import torch
    from safetensors import safe_open

    pending = getattr(module, "omnicore_pending_load", None)
    if pending is None:
        return module
    files = checkpoint_files(Path(pending.folder))
    params = dict(module.named_parameters())
    values: dict[str, torch.Tensor] = {}
    for name, key in pending.sources.items():
        with safe_open(str(files[key]), "pt") as f:
            t = f.get_tensor(key).to(params[name].dtype)
        rows = params[name].shape[0]
        if t.shape[0] < rows:
            t = torch.cat([t, t.mean(0, keepdim=True).expand(rows - t.shape[0], *t.shape[1:])])
        values[name] = t
    missing = [n for n in params if n not in values]
    if missing:
        raise ValueError(f"load_now: the plan from {pending.folder} does not cover {missing[:5]}")
    module.load_state_dict(values, strict=False, assign=True)
    if callable(getattr(module, "tie_weights", None)):
        module.tie_weights()
    del module.omnicore_pending_load
    return module
