"""Multi-axis rotary positions (mRoPE) of one item, by the model's own ``get_rope_index``.

Qwen2-VL, Qwen2.5-VL, Qwen3-VL and GLM-4.1V rotate queries and keys by three positions per token
(time, height, width), which their base model class (``Glm4vModel``) computes for a whole sample in
``get_rope_index(input_ids, mm_token_type_ids, image_grid_thw, video_grid_thw, ...)``. That rule
lays out text on all three axes alike, and each media item from where its first token would sit as
text, so an item's positions are a function of the item alone: :func:`item_positions` calls the
class's rule on the item's ids between two text tokens (so that where the text after it resumes is
observed) and returns them as offsets, which :class:`omnicore.api.ItemLayout` carries.

The rule is called on a *hollow* instance of the class (:func:`hollow_model`): the class's own
object with its config and no submodule, so no weight is built in a data worker. A rule that reads
anything from its instance but the config and the class's methods (a submodule such as
``self.visual``) cannot be called so: :func:`rule_reads` finds what it reads, and the generic
foundation refuses such a class (``omnicore_family_kit.generic.foundation.refusal``).

Imports torch and the class's modeling module when first called (in each data worker once); builds
no parameter.
"""

from __future__ import annotations

import functools
import inspect
import re
import textwrap
from typing import Any

RULE = "get_rope_index"
"""The base model class's method that computes a sample's 3-D positions."""
INSTANCE_READS = frozenset({"config"})
"""What a rule may read from its instance besides the class's methods."""


def rule_class(config: Any) -> type | None:
    """The base model class of ``config`` (``AutoModel``'s class for it: ``Glm4vModel`` for a
    ``Glm4vConfig``) when it has :data:`RULE`, else None."""
    from transformers import AutoModel

    mapping = AutoModel._model_mapping
    cls = mapping[type(config)] if type(config) in mapping else None
    return cls if cls is not None and callable(getattr(cls, RULE, None)) else None


def rule_reads(cls: type) -> set[str]:
    """The instance attributes that ``cls``'s :data:`RULE`, and every method of ``cls`` it calls on
    its instance, read other than methods and :data:`INSTANCE_READS`: empty when the rule can run on
    a :func:`hollow_model`. A method whose source cannot be read counts as ``"<source of NAME>"``."""
    bad: set[str] = set()
    seen: set[str] = set()
    todo = [RULE]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            source = textwrap.dedent(inspect.getsource(getattr(cls, name)))
        except (OSError, TypeError):
            bad.add(f"<source of {name}>")
            continue
        for attr in set(re.findall(r"\bself\.(\w+)", source)):
            if attr in INSTANCE_READS:
                continue
            if inspect.isfunction(inspect.getattr_static(cls, attr, None)):
                todo.append(attr)
            else:
                bad.add(attr)
    return bad


@functools.cache
def folder_config(folder: str) -> Any:
    """``AutoConfig.from_pretrained(folder)`` (offline), once per process; not to be changed."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder, local_files_only=True)


@functools.cache
def hollow_model(folder: str) -> Any:
    """The base model class of the checkpoint in ``folder`` as an instance with its config and no
    submodule (``nn.Module.__init__`` only), once per process.

    Raises:
        ValueError: the class has no :data:`RULE` (naming the folder's model type).
    """
    import copy

    from torch import nn

    config = copy.deepcopy(folder_config(folder))
    cls = rule_class(config)
    if cls is None:
        raise ValueError(f"{folder}: the model type {config.model_type!r} has no base class with {RULE}")
    model = cls.__new__(cls)
    nn.Module.__init__(model)
    model.config = config
    return model


def item_positions(processor: Any, folder: str, ids: list[int], features: dict[str, Any]) -> tuple[tuple[tuple[int, ...], ...], int]:
    """One item's 3-D positions by the checkpoint's :data:`RULE`.

    Args:
        processor: the checkpoint's transformers processor (its ``create_mm_token_type_ids`` marks
            each token's modality as the model's forward gets it, and its tokenizer gives the text
            token put around the item).
        folder: the checkpoint folder (:func:`hollow_model`).
        ids: the item's token ids as its processor wrote them.
        features: the item's tensors (``image_grid_thw``, ``video_grid_thw``,
            ``second_per_grid_ts``: each one the rule's signature names is passed).

    Returns:
        ``(rows, advance)``: ``[3][len(ids)]`` offsets (time, height, width) of the item's tokens
        from where its first token would sit as text, and the offset where the text after the item
        resumes (``ItemLayout.positions`` / ``ItemLayout.advance``).

    Raises:
        ValueError: the rule needs an argument that the item does not give (naming it), or its
            positions are not the same on all axes for the text around the item.
    """
    import torch

    model = hollow_model(folder)
    rule = getattr(model, RULE)
    text = processor.tokenizer("a", add_special_tokens=False)["input_ids"][:1] or [0]
    row = text + list(ids) + text
    kwargs: dict[str, Any] = {}
    for name, param in inspect.signature(rule).parameters.items():
        if name == "input_ids" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        if name == "mm_token_type_ids":
            kwargs[name] = torch.tensor(processor.create_mm_token_type_ids([row]), dtype=torch.long)
        elif name in features:
            kwargs[name] = torch.as_tensor(features[name])
        elif param.default is inspect.Parameter.empty:
            raise ValueError(f"{type(model).__name__}.{RULE} needs {name!r}, which the item's processor output does not hold")
    with torch.no_grad():
        positions, _ = rule(torch.tensor([row], dtype=torch.long), **kwargs)
    rows = positions[:, 0].tolist()  # [3][n + 2]
    before, after = rows[0][0], rows[0][-1]
    if any(r[0] != before or r[-1] != after for r in rows):
        raise ValueError(f"{type(model).__name__}.{RULE} gives the text around an item different positions per axis")
    n = len(ids)
    return tuple(tuple(p - before - 1 for p in r[1 : n + 1]) for r in rows), after - before - 1
