"""The model side of ``encoder/generic_encoder``: a composite class's towers and projector, called
through its own ``get_image_features`` / ``get_video_features`` / ``get_audio_features``.

The module holds the composite class itself (``model``), built from the checkpoint's config with
its text decoder and LM head removed: every tower, projector and learned separator (LLaVA-NeXT's
``image_newline``) keeps its place and its name, so the class's own feature method runs unchanged
and the export gives the tensors back under the class's names. Its rows are the method's
``pooler_output`` (one tensor, or one per item), flattened to ``[rows, H]`` in item order: what the
class scatters into its placeholders.

Parameters that cannot reach the rows (LLaVA's tower layers after ``vision_feature_layer``,
SigLIP's pooling head) are frozen: they would never get a gradient, which stalls sharded training.
They are found by walking the autograd graph of the dummy batch's rows on the meta device.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnicore.api import plan_checkpoint
from omnicore_family_kit.generic.model import build_composite, drop, fresh_config, layout_of
from omnicore_family_kit.generic.processor import GenericItemProcessor, build_processor
from omnicore_family_kit.keymap import KeyMap, saved_renames

logger = logging.getLogger(__name__)

FEATURE_METHODS = {"image": "get_image_features", "video": "get_video_features", "audio": "get_audio_features"}
"""The composite class's method that encodes each modality."""


def rows_of(out: Any) -> torch.Tensor:
    """A feature method's result as ``[rows, H]``: its ``pooler_output`` (or the value itself), one
    tensor or one per item, each flattened over its leading dims, concatenated in item order."""
    value = getattr(out, "pooler_output", None)
    if value is None:
        value = out[0] if isinstance(out, tuple) and not isinstance(out[0], torch.Tensor | list | tuple) else out
    items = list(value) if isinstance(value, list | tuple) else [value]
    return torch.cat([t.reshape(-1, t.shape[-1]) for t in items], dim=0)


def modality_of(batch: dict[str, Any]) -> str:
    """The modality of a collated batch, from its keys (``pixel_values_videos`` -> video,
    ``input_features`` / ``audio...`` -> audio, else image): a module shared by image and video
    entries tells them apart so."""
    if any("video" in k for k in batch):
        return "video"
    if any(k == "input_features" or "audio" in k for k in batch):
        return "audio"
    return "image"


def tower_keymap(model: Any) -> KeyMap:
    """The encoder's key map: its ``model.`` is the class's root; the text decoder and head are
    the other parts (in the class's names and in the layout ``save_pretrained`` writes)."""
    layout = layout_of(model)
    legacy = saved_renames(model)
    others = [layout.decoder, layout.head]
    others += [old for old, new in legacy.items() if any(new.startswith(p + ".") or new == p + "." for p in others)]
    return KeyMap(parts={"model.": ""}, legacy=legacy, others=tuple(others))


class GenericTower(nn.Module):
    """One checkpoint's towers and projector as an :class:`omnicore.api.Encoder`.

    Args:
        config: the checkpoint's config (copied).
        processor: the data side of the same checkpoint and modality.
        source: the checkpoint folder.

    Attributes:
        model: the composite class without its text decoder and LM head.
        keymap: :func:`tower_keymap`.
        modalities: every modality the class has a feature method for (one module serves them).

    Raises:
        ValueError: the class has no feature method for the processor's modality.
    """

    def __init__(self, config: Any, processor: GenericItemProcessor, source: Path) -> None:
        super().__init__()
        full = build_composite(config)
        self.keymap = tower_keymap(full)
        layout = layout_of(full)
        drop(full, layout.decoder)
        drop(full, layout.head)
        self.model = full
        self.processor = processor
        self.modality = processor.modality
        self.source = Path(source)
        self.modalities = tuple(m for m, name in FEATURE_METHODS.items() if callable(getattr(full, name, None)))
        if self.modality not in self.modalities:
            raise ValueError(f"{type(full).__name__} has no {FEATURE_METHODS[self.modality]}: it takes no {self.modality}")

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Rows ``[sum of num_tokens, H]`` of a collated batch (:meth:`GenericItemProcessor.collate`),
        in item order, from the class's feature method of the batch's modality."""
        method = getattr(self.model, FEATURE_METHODS[modality_of(batch)])
        ref = next(p for p in self.parameters())
        inputs = {k: (v.to(ref.device, ref.dtype) if torch.is_floating_point(v) else v.to(ref.device)) for k, v in batch.items()}
        return rows_of(method(**inputs)).to(ref.dtype)

    def dummy_batch(self) -> dict[str, Any]:
        """One small blank item of this module's modality through the processor, collated."""
        from omnicore.api import Audio, Video

        if self.modality == "image":
            from PIL import Image

            media: Any = Image.new("RGB", (64, 64))
        elif self.modality == "video":
            import numpy as np

            media = Video(frames=np.zeros((2, 64, 64, 3), dtype=np.uint8), fps=2.0)
        else:
            media = Audio(samples=torch.zeros(16000), sample_rate=16000)
        return self.processor.collate([self.processor.preprocess(media)])

    def save_pretrained(self, path: str) -> None:
        """Write ``path`` as a folder the factory loads back: the checkpoint's config, these tensors
        as the class's ``save_pretrained`` names them (:func:`omnicore_family_kit.export.save_part`)
        and the source's processor and tokenizer files."""
        from omnicore_family_kit.export import save_part
        from omnicore_family_kit.generic.model import composite_class

        config = fresh_config(self.source)
        files = [p.name for p in self.source.iterdir() if p.is_file() and not p.name.startswith(("model", "config.json"))]
        save_part(self, self.keymap, config, Path(path), model_class=composite_class(config), source=self.source, files=files)


def freeze_unreachable(module: GenericTower) -> list[str]:
    """Freeze the parameters the rows of a dummy batch do not depend on (found on the meta device
    by walking the autograd graph); returns their names. Nothing is frozen when the forward cannot
    run on meta tensors. The batch itself is made on the CPU, also where the module is built under
    ``torch.device("meta")`` (the core's export builds its copy so): the processor needs real values."""
    with torch.device("cpu"):
        batch = module.dummy_batch()
    try:
        with torch.enable_grad():
            rows = module({k: v.to("meta") if hasattr(v, "to") else v for k, v in batch.items()})
    except Exception as exc:  # a tower whose forward needs real values (data-dependent shapes)
        logger.debug("generic_encoder: cannot trace %s on meta (%s); no parameter frozen", type(module.model).__name__, exc)
        return []
    seen: set[int] = set()
    stack, reached = [rows.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        var = getattr(fn, "variable", None)
        if var is not None:
            reached.add(id(var))
        stack.extend(f for f, _ in fn.next_functions)
    frozen = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in reached]
    for name in frozen:
        module.get_parameter(name).requires_grad_(False)
    return frozen


def build(options: dict[str, Any], *, hidden_size: int) -> GenericTower:
    """The encoder factory: the towers on the meta device with the plan that reads them from the
    checkpoint after sharding (``omnicore_pending_load``).

    Raises:
        ValueError: the checkpoint is not servable (see :class:`GenericTower`) or the rows' width
            is not the foundation's ``hidden_size``; LoadError when the checkpoint's tensors do not fit.
    """
    processor = build_processor(options)
    what = f"model.encoders.{processor.modality}.options.checkpoint"
    folder = Path(processor.folder)
    module = GenericTower(fresh_config(folder), processor, folder)
    frozen = freeze_unreachable(module)
    if frozen:
        logger.info(
            "generic_encoder: %d parameters cannot reach the %s rows and are frozen (e.g. %s)", len(frozen), processor.modality, frozen[0]
        )
    module.omnicore_pending_load = plan_checkpoint(
        module, folder, renames=module.keymap.renames(), other_parts=module.keymap.other_parts(), what=what
    )
    return module
