"""What trains: ``train.freeze`` and the module prefixes of ``train.lr_multipliers``.

A *pattern* is a published family's part name (``vision_tower``, ``merger``, ``language_model``:
:func:`part_patterns`), or a dotted :class:`~omnicore.model.omni.OmniModel` module prefix with fnmatch
wildcards (``lm``, ``encoders.image.tower``, ``lm.model.layers.*.mlp``). It matches a parameter
when it matches (``fnmatch.fnmatchcase``) one of the dot-boundary prefixes of the parameter's name:
``lm.model.layers.0.mlp`` matches ``lm.model.layers.0.mlp.up_proj.weight`` but not
``lm.model.layers.0.mlp_norm.weight``. ``*`` also matches dots, as in fnmatch.

* :func:`apply_freeze`: ``requires_grad = False`` on every parameter a ``train.freeze`` pattern
  matches; the training set-up calls it after LoRA and before the parallel strategies, and
  ``omnicore plan`` on its meta model.
* :func:`lr_factors`: the ``train.lr_multipliers`` factor of each trainable parameter (the most
  specific matching prefix wins), used by :func:`omnicore.train.optim.build_optimizer`.

Both live in the model layer (they only read names and set ``requires_grad``) so that the planner
(:mod:`omnicore.parallel.plan`) and the training recipe share them.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from omnicore.config import ConfigError

WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")
"""Name segments that module wrappers (``checkpoint_wrapper``, ``torch.compile`` of a module, FSDP1)
insert into parameter names; patterns are matched on the names without them."""


@dataclass(frozen=True)
class TrainableSummary:
    """Parameter counts after :func:`apply_freeze` (elements, each shared tensor counted once)."""

    trainable: int
    frozen: int
    frozen_tensors: int

    def describe(self) -> str:
        """One log line, e.g. ``trainable parameters: 1,234 of 5,678 (21.7%); frozen: 4,444 in 12 tensors``."""
        total = self.trainable + self.frozen
        share = 100.0 * self.trainable / total if total else 0.0
        return f"trainable parameters: {self.trainable:,} of {total:,} ({share:.1f}%); frozen: {self.frozen:,} in {self.frozen_tensors} tensors"


def clean_name(name: str) -> str:
    """``name`` without the :data:`WRAPPER_SEGMENTS` that wrappers insert."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def _prefixes(name: str) -> list[str]:
    """The dot-boundary prefixes of ``name``, shortest first: ``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def match_depth(name: str, pattern: str) -> int:
    """How many dotted parts of ``name`` the shortest prefix that ``pattern`` matches has (the
    pattern's specificity for this name); 0 when ``pattern`` matches no prefix of ``name``."""
    for depth, prefix in enumerate(_prefixes(name), start=1):
        if fnmatch.fnmatchcase(prefix, pattern):
            return depth
    return 0


def _named(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Every (cleaned name, parameter) pair, shared (tied) parameters under each of their names."""
    return [(clean_name(n), p) for n, p in model.named_parameters(remove_duplicate=False)]


def part_patterns(model: torch.nn.Module, pattern: str) -> list[str]:
    """The patterns ``pattern`` stands for: a published family's part name (``vision_tower``,
    ``merger``, ``language_model``; the model's ``part_names``, from
    :meth:`omnicore.components.Foundation.part_names`) is its prefixes; anything else is itself."""
    parts = getattr(model, "part_names", None) or {}
    return list(parts[pattern]) if pattern in parts else [pattern]


def _depth(model: torch.nn.Module, name: str, pattern: str) -> int:
    """:func:`match_depth` of ``name`` against ``pattern`` or the prefixes of the part it names."""
    return max(match_depth(name, q) for q in part_patterns(model, pattern))


def _no_match(model: torch.nn.Module, field: str, pattern: str) -> ConfigError:
    modules = [clean_name(n) for n, _ in model.named_modules() if n]
    close = difflib.get_close_matches(pattern, modules, n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:  # nothing close: name the model's main parts
        hint = "the model's parts: " + ", ".join(m for m in modules if m.count(".") <= 1 and not m.startswith("lm."))
    parts = sorted(getattr(model, "part_names", None) or {})
    if parts:
        hint += f"; its family's part names: {', '.join(parts)}"
    return ConfigError(
        f"{field}: {pattern!r} matches no module or parameter of the model; {hint} "
        "(dotted OmniModel module prefixes with fnmatch wildcards, e.g. lm, encoders.image, lm.model.layers.*.mlp)"
    )


def apply_freeze(model: torch.nn.Module, patterns: Iterable[str]) -> TrainableSummary:
    """Freeze (``requires_grad = False``) every parameter of ``model`` that one of ``patterns``
    (``train.freeze``) matches; parameters frozen before (e.g. LoRA's base weights) stay frozen.

    Frozen parameters get no gradient, so :func:`omnicore.train.optim.build_optimizer` gives them
    no AdamW state. Call it on the unwrapped model, before the parallel strategies.

    Returns:
        the trainable and frozen element counts after freezing.

    Raises:
        ConfigError: a pattern matches nothing (naming ``train.freeze[i]`` and close module
            names), or no parameter is left to train.
    """
    named = _named(model)
    for i, pattern in enumerate(patterns):
        hits = [p for n, p in named if _depth(model, n, pattern)]
        if not hits:
            raise _no_match(model, f"train.freeze[{i}]", pattern)
        for p in hits:
            p.requires_grad_(False)
    summary = trainable_summary(model)
    if summary.trainable == 0:
        raise ConfigError(
            "train.freeze: every parameter of the model is frozen, so nothing would train; "
            "remove the entry that covers the parts to train (e.g. the projectors: encoders.image.projector)"
        )
    return summary


def trainable_summary(model: torch.nn.Module) -> TrainableSummary:
    """Count ``model``'s trainable and frozen elements (each shared tensor once)."""
    trainable = frozen = tensors = 0
    for p in model.parameters():
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
            tensors += 1
    return TrainableSummary(trainable, frozen, tensors)


def lr_factors(model: torch.nn.Module, multipliers: dict[str, float]) -> dict[int, float]:
    """``id(parameter)`` -> factor on ``train.lr`` for every trainable parameter of ``model``
    (1.0 where no prefix of ``train.lr_multipliers`` matches).

    Where several prefixes match a parameter, the most specific wins: the one whose matched prefix
    of the name has the most dotted parts, then the one with more literal (non-wildcard)
    characters, then the later key. A parameter shared under several names takes the most
    specific match over all of them.

    Raises:
        ConfigError: a prefix matches no parameter (naming ``train.lr_multipliers.<prefix>``).
    """
    best: dict[int, tuple[tuple[int, int, int], float]] = {}
    order = list(multipliers.items())
    for key_index, (pattern, factor) in enumerate(order):
        literal = sum(ch not in "*?[]" for ch in pattern)
        matched = False
        for name, p in _named(model):
            depth = _depth(model, name, pattern)
            if not depth:
                continue
            matched = True
            rank = (depth, literal, key_index)
            if p.requires_grad and (id(p) not in best or best[id(p)][0] < rank):
                best[id(p)] = (rank, float(factor))
        if not matched:
            raise _no_match(model, f"train.lr_multipliers.{pattern}", pattern)
    return {id(p): best[id(p)][1] if id(p) in best else 1.0 for p in model.parameters() if p.requires_grad}
