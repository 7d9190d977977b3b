"""Where each part of a Qwen3-VL checkpoint lives.

The published layout (``Qwen/Qwen3-VL-2B-Instruct``, and what transformers 5's ``save_pretrained``
of ``Qwen3VLForConditionalGeneration`` writes) is the in-memory one: ``model.visual.*`` (the tower,
its ``merger`` and ``deepstack_merger_list``), ``model.language_model.*`` and ``lm_head.*``. The
older top-level names (``visual.*``, ``model.embed_tokens.*``, ``model.layers.*``) load too.

:func:`plan_part` returns the core's strict, sharded load plan (:func:`omnicore.api.plan_checkpoint`),
filled after sharding; :func:`load_now` fills it at once on this process (tests, tools).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TOWER_RENAMES = {"model.visual.": "visual."}
"""Checkpoint prefix -> the encoder module's parameter prefix."""
LM_RENAMES = {"model.language_model.": "model."}
"""Checkpoint prefix -> the text LM's parameter prefix (``lm_head.*`` is its own)."""
TOWER_PARTS = ("visual", "model.visual")
LM_PARTS = ("model.language_model", "model.embed_tokens", "model.layers", "model.norm", "lm_head")


def tensor_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file of ``folder`` (``model.safetensors`` or its index), from the
    headers only; empty when it holds neither."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return {name: folder / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    if not (folder / "model.safetensors").is_file():
        return {}
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {name: folder / "model.safetensors" for name in f.keys()}


def plan_part(
    module: Any, folder: Path, *, renames: dict[str, str], other_parts: tuple[str, ...], what: str, grow: tuple[str, ...] = ()
) -> Any:
    """The strict load plan of ``module`` (built on meta) from its part of ``folder``; the tensors
    under ``other_parts`` present there are the other parts', left unused on purpose.

    Raises:
        LoadError: (``ValueError``) naming ``what``: no safetensors, or tensors missing, extra or of
            another shape.
    """
    from omnicore.api import plan_checkpoint

    names = tensor_files(folder)
    unused = [prefix for prefix in other_parts if any(n.startswith(prefix + ".") for n in names)]
    return plan_checkpoint(module, folder, renames=renames, ignore_unused=unused, what=what, grow=grow)


def load_now(module: Any) -> Any:
    """``module`` with its meta parameters read from its ``omnicore_pending_load`` plan on this
    process (rows past the checkpoint's, a grown vocabulary, get the mean row, as the core's fill
    does); a module without a plan is returned as it is.

    Raises:
        ValueError: the plan leaves a parameter unread.
    """
    import torch
    from safetensors import safe_open

    plan = getattr(module, "omnicore_pending_load", None)
    if plan is None:
        return module
    files = tensor_files(Path(plan.folder))
    params = dict(module.named_parameters())
    unread = sorted(set(params) - set(plan.sources))
    if unread:
        raise ValueError(f"load_now: the plan from {plan.folder} leaves {unread[:5]} unread")
    state = {}
    for name, key in plan.sources.items():
        with safe_open(str(files[key]), "pt") as f:
            value = f.get_tensor(key).to(params[name].dtype)
        if (short := params[name].shape[0] - value.shape[0]) > 0:
            value = torch.cat([value, value.mean(0, keepdim=True).expand(short, *value.shape[1:])])
        state[name] = value
    module.load_state_dict(state, strict=False, assign=True)
    if callable(getattr(module, "tie_weights", None)):
        module.tie_weights()
    del module.omnicore_pending_load
    return module
