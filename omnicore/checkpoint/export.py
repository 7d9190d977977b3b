"""Export trained components as Hugging Face-style safetensors folders.

Layout of ``<output_dir>/export/``::

    foundation/            save_pretrained of the causal LM + its tokenizer
                           (loads with transformers.AutoModelForCausalLM.from_pretrained)
    encoders/<modality>/   each encoder's own save_pretrained folder
    decoders/<modality>/   each decoder's own save_pretrained folder
    omnicore.yaml          a ``model:`` config section that rebuilds the model from these folders

The export is written to a temporary folder and renamed into place, so a crash leaves the previous
export intact.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml


def export_model(model: Any, tokenizer: Any, cfg: Any, out_dir: str | Path, state: Any) -> Path | None:
    """Gather the full state dict (collective) and write the export on rank 0. Returns the folder on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    out = Path(out_dir)
    if not state.is_main:
        return None
    from omnicore.checkpoint.dcp import replace_folder
    from omnicore.model.build import build_omni_model

    plain, _ = build_omni_model(cfg)
    plain.load_state_dict(full)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_export(plain, tokenizer, cfg, tmp)
    replace_folder(tmp, out)
    return out


def write_export(model: Any, tokenizer: Any, cfg: Any, out: Path) -> None:
    """Write an unsharded :class:`~omnicore.model.omni.OmniModel` as the export layout above."""
    from transformers.utils import logging as hf_logging

    out.mkdir(parents=True)
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one-shard "Writing model shards" bars add only noise here
    try:
        _write_components(model, tokenizer, cfg, out)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _write_components(model: Any, tokenizer: Any, cfg: Any, out: Path) -> None:
    model.lm.save_pretrained(out / "foundation")
    tokenizer.save_pretrained(out / "foundation")
    section = cfg.model.model_dump()
    section["foundation"] = {"name": cfg.model.foundation.name, "options": {"checkpoint": "foundation"}}
    for kind, modules in (("encoders", model.encoders), ("decoders", model.decoders)):
        for m, module in modules.items():
            module.save_pretrained(str(out / kind / m))
            opts = dict(section[kind][m]["options"])
            opts.pop("config", None)
            opts["checkpoint"] = f"{kind}/{m}"
            section[kind][m]["options"] = opts
    (out / "omnicore.yaml").write_text(yaml.safe_dump({"model": section}, sort_keys=False))
