"""The transformers class of a checkpoint served by the generic family, and where its parts live.

Torch and transformers are imported here; the data side (:mod:`.processor`) does not import this
module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUTO_CLASSES = ("AutoModelForImageTextToText", "AutoModelForMultimodalLM", "AutoModelForSpeechSeq2Seq", "AutoModelForCausalLM")
"""The transformers auto classes whose mapping names a checkpoint's composite class, in the order tried."""


def composite_class(config: Any) -> type:
    """The class published checkpoints of ``config`` are saved with: the first of the config's
    ``architectures`` that transformers has, else the mapping of :data:`AUTO_CLASSES`.

    Raises:
        ValueError: transformers has no such class (naming the model type).
    """
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, str(name), None)
        if isinstance(cls, type):
            return cls
    for auto in AUTO_CLASSES:
        mapping = getattr(getattr(transformers, auto, None), "_model_mapping", None)
        if mapping is not None and type(config) in mapping:
            return mapping[type(config)]
    raise ValueError(f"transformers {transformers.__version__} has no multimodal class for model type {config.model_type!r}")


@dataclass(frozen=True)
class Layout:
    """Where the parts of a composite class live (dotted module paths in its instance).

    Attributes:
        decoder: the text model (``model.language_model``).
        head: the LM head (``lm_head``).
        towers: the other top-level parts (``model.vision_tower``, ``model.multi_modal_projector``).
    """

    decoder: str
    head: str
    towers: tuple[str, ...]


def module_path(root: Any, module: Any) -> str:
    """The dotted path of ``module`` in ``root`` (``""`` for the root).

    Raises:
        ValueError: ``module`` is not in ``root``.
    """
    for name, m in root.named_modules():
        if m is module:
            return name
    raise ValueError(f"{type(module).__name__} is not a submodule of {type(root).__name__}")


def layout_of(model: Any) -> Layout:
    """The :class:`Layout` of a composite instance (meta-device is enough).

    Raises:
        ValueError: the class has no text decoder or no LM head (``get_decoder``,
            ``get_output_embeddings``).
    """
    decoder = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
    head = model.get_output_embeddings()
    if decoder is None or decoder is model or head is None:
        raise ValueError(f"{type(model).__name__} gives no separate text decoder and LM head (get_decoder, get_output_embeddings)")
    dec, hd = module_path(model, decoder), module_path(model, head)
    parent = dec.rpartition(".")[0]
    base = model.get_submodule(parent) if parent else model
    towers = tuple(
        f"{parent}.{n}" if parent else n
        for n, m in base.named_children()
        if m is not None and (f"{parent}.{n}" if parent else n) not in (dec, hd) and any(True for _ in m.parameters())
    )
    if parent:
        towers += tuple(
            n for n, m in model.named_children() if n not in (parent, hd) and m is not None and any(True for _ in m.parameters())
        )
    towers += tuple(f"{parent}.{n}" if parent else n for n, _ in base.named_parameters(recurse=False))  # LLaVA-NeXT's image_newline
    return Layout(dec, hd, towers)


def drop(model: Any, path: str) -> None:
    """Remove the submodule at ``path`` from ``model`` (its slot left as None)."""
    parent, _, name = path.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    owner._modules[name] = None


@functools.cache
def read_config(folder: str) -> Any:
    """``AutoConfig.from_pretrained(folder)`` (offline), once per process; callers copy it before changing it."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder, local_files_only=True)


def fresh_config(folder: str | Path) -> Any:
    """A copy of the checkpoint's config that the caller may change."""
    import copy

    return copy.deepcopy(read_config(str(folder)))


def build_composite(config: Any, dtype: Any = None) -> Any:
    """The composite class built from ``config`` on the meta device (buffers real), in ``dtype``."""
    import torch

    from omnicore.api import on_meta

    cls = composite_class(config)
    with on_meta():
        model = cls._from_config(config, dtype=dtype or torch.float32)
    return model
