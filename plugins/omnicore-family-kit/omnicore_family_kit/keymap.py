"""One key map, read both ways: a checkpoint's tensor names to omnicore's module names (loading)
and back to the transformers class's names (export), in the spirit of torchtitan's
``StateDictAdapter`` (``from_hf`` / ``to_hf``).

A published family's model is split in omnicore: its towers and projector are encoder modules, its
text model under the LM head is the foundation's ``lm``. Each part maps a prefix of its own module
names to a prefix of the names of the class's ``state_dict()`` (its in-memory names, which its
``load_state_dict`` takes and its ``save_pretrained`` writes, after any conversion transformers
applies on saving). Older published layouts (``language_model.model.*`` for LLaVA before
transformers 5, ``visual.*`` for Qwen2-VL) are read too: :func:`saved_renames` derives them from
transformers' own conversion on saving (``revert_weight_conversion``), and a family adds its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KeyMap:
    """The names of one part of a composite checkpoint, in omnicore and in the class.

    Attributes:
        parts: ``omnicore prefix -> class prefix`` (``{"model.": "model.language_model.",
            "lm_head.": "lm_head."}`` for a text model under its head; ``{"": "model."}`` for a
            module holding the class's towers under the class's own names minus ``model.``). An
            omnicore name must start with one of them.
        legacy: ``checkpoint prefix -> class prefix`` of other layouts the checkpoint may be in
            (tried after the class's own names, the longest prefix first).
        others: class prefixes of the composite's other parts, which this part does not read.
    """

    parts: Mapping[str, str]
    legacy: Mapping[str, str] = field(default_factory=dict)
    others: tuple[str, ...] = ()

    def to_class(self, name: str) -> str:
        """An omnicore parameter name of this part -> the class's name.

        Raises:
            KeyError: ``name`` starts with none of :attr:`parts`' omnicore prefixes.
        """
        ours = _longest(name, self.parts)
        if ours is None:
            raise KeyError(f"{name!r} is under none of this part's prefixes {sorted(self.parts)}")
        return self.parts[ours] + name[len(ours) :]

    def renames(self) -> dict[str, str]:
        """``checkpoint prefix -> omnicore prefix`` for :func:`omnicore.api.plan_checkpoint`: the
        class's own names and every legacy layout, each mapped to this part's names. A legacy prefix
        that lands under no part of this one is left out (it belongs to another part)."""
        out: dict[str, str] = {}
        for ours, theirs in self.parts.items():
            if theirs != ours:
                out[theirs] = ours
        for old, theirs in self.legacy.items():
            ours = _longest_value(theirs, self.parts)
            target = None if ours is None else ours + theirs[len(self.parts[ours]) :]
            if target is not None and old != target:  # a layout that already is this part's names needs no rename
                out[old] = target
        return out

    def other_parts(self) -> list[str]:
        """The class prefixes (and legacy prefixes) of the other parts, for ``plan_checkpoint``'s
        ``other_parts``: present in the checkpoint, not read by this part."""
        out = [p.rstrip(".") for p in self.others]
        for old, theirs in self.legacy.items():
            if _longest_value(theirs, self.parts) is None:
                out.append(old.rstrip("."))
        return list(dict.fromkeys(p for p in out if p))


def _longest(name: str, prefixes: Iterable[str]) -> str | None:
    """The longest of ``prefixes`` that ``name`` starts with."""
    hits = [p for p in prefixes if name.startswith(p)]
    return max(hits, key=len) if hits else None


def _longest_value(theirs: str, parts: Mapping[str, str]) -> str | None:
    """The omnicore prefix whose class prefix is the longest one ``theirs`` starts with."""
    hits = [ours for ours, cls in parts.items() if theirs.startswith(cls)]
    return max(hits, key=lambda o: len(parts[o])) if hits else None


def saved_renames(model: Any) -> dict[str, str]:
    """``saved prefix -> class prefix`` for the names ``model.save_pretrained`` writes where they
    differ from its in-memory names (transformers 5 writes LLaVA's ``model.language_model.*`` as
    ``language_model.model.*``): each in-memory name is put through transformers' own conversion
    on saving (``revert_weight_conversion``; names only, so a meta-device model serves), and the
    differing leading parts are kept."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # no conversion in this transformers
        return {}
    names = list(model.state_dict())
    tags = {name: _Shapeless(name) for name in names}
    try:
        saved = revert_weight_conversion(model, dict(tags))
    except Exception:  # a conversion that needs real tensors (merging experts): names as in memory
        return {}
    back = {id(v): k for k, v in saved.items()}
    pairs = [(name, back.get(id(tag))) for name, tag in tags.items()]
    out: dict[str, str] = {}
    for ours, theirs in pairs:
        if theirs is None or ours == theirs:
            continue
        a, b = ours.split("."), theirs.split(".")
        k = 0
        while k < min(len(a), len(b)) - 1 and a[-1 - k] == b[-1 - k]:  # keep one part of each: a prefix is never empty
            k += 1
        if k == 0:  # a tensor directly under the root (LLaVA-NeXT's image_newline): its whole name
            out.setdefault(theirs, ours)
            continue
        out.setdefault(".".join(b[: len(b) - k]) + ".", ".".join(a[: len(a) - k]) + ".")
    return out


class _Shapeless:
    """A stand-in value for :func:`saved_renames` (only the names are converted; each value is
    found again by identity)."""

    def __init__(self, name: str) -> None:
        self.name = name
