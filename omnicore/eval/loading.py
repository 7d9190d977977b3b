"""Loading a trained model for ``omnicore eval`` and ``omnicore generate``: from an export or a DCP
checkpoint, on ``run.device`` (:func:`eval_device`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from omnicore.config import Config, ModelConfig
from omnicore.data.chat import ChatProcessor
from omnicore.logs import Phase

logger = logging.getLogger(__name__)


def model_config_from_export(export_dir: str | Path) -> ModelConfig:
    """The ``model:`` section written by an export, with its relative checkpoint paths made absolute.

    Raises:
        CheckpointError: ``export_dir`` is no export, or a file of it is damaged (one line naming the
            file: :func:`~omnicore.checkpoint.export_files.check_export_files`), or its section is
            not a valid ``model:`` section.
    """
    from pydantic import ValidationError

    from omnicore.checkpoint.errors import CheckpointError
    from omnicore.checkpoint.export_files import EXPORT_DAMAGED, check_export_files
    from omnicore.config import format_errors

    export_dir = Path(export_dir).resolve()  # absolute: component paths must not depend on the config's folder
    if not export_dir.is_dir():
        raise CheckpointError(f"--export {export_dir}: no such folder; give a run's export/ folder")
    section = check_export_files(export_dir)  # every file checked before transformers reads one
    section["foundation"]["options"]["checkpoint"] = str(export_dir / section["foundation"]["options"]["checkpoint"])
    for kind in ("encoders", "decoders"):
        for comp in (section.get(kind) or {}).values():
            if comp.get("share"):  # no module of its own (model.encoders.<m>.share): nothing was saved for it
                continue
            comp["options"]["checkpoint"] = str(export_dir / comp["options"]["checkpoint"])
    try:
        return ModelConfig.model_validate(section)
    except ValidationError as exc:
        lines = format_errors(exc, str(export_dir / "omnicore.yaml")).replace(": ", ": model.", 1).splitlines()
        raise CheckpointError(f"{lines[0]}; {EXPORT_DAMAGED}") from exc


def load_trained(cfg: Config, checkpoint: str | None = None, export: str | None = None) -> tuple[Any, Any, ChatProcessor]:
    """``(model, tokenizer, processor)`` in eval mode on CPU, from an export or a DCP checkpoint.

    Without either argument, the latest checkpoint under ``run.output_dir`` is used. Either is
    checked against its checksum manifest first, unless ``run.verify`` is false (``--no-verify``:
    loaded unchecked, with a warning).

    Raises:
        CheckpointError: if there is no such checkpoint or export, or it is damaged (naming the
            file) or cannot be verified (no manifest).
    """
    from omnicore.checkpoint.dcp import latest_checkpoint, load_checkpoint
    from omnicore.model.build import build_omni_model
    from omnicore.model.lora import apply_lora, family_lm_prefixes, load_lora_adapter
    from omnicore.parallel.state import ParallelState

    if export is not None:
        _verify_export(cfg, Path(export))
        cfg = cfg.model_copy(update={"model": model_config_from_export(export)})
        model, tokenizer = _build_from_export(cfg, export)
        if (Path(export) / "foundation_lora").is_dir():  # model.lora.export: adapter
            # a published family's export is its class's folder; its adapter is keyed by that class
            family = (Path(export) / "config.json").is_file()
            prefixes = [(new, old) for old, new in family_lm_prefixes(export, model.lm)] if family else None
            load_lora_adapter(model.lm, Path(export) / "foundation_lora", prefixes)
    else:
        model, tokenizer = build_omni_model(cfg)
        apply_lora(model, cfg.model.lora)  # a LoRA run's checkpoint holds the adapter layers
        folder = Path(checkpoint) if checkpoint else latest_checkpoint(Path(cfg.run.output_dir) / "checkpoints")
        if not cfg.run.verify:
            logger.warning("run.verify is false: %s is loaded without checking its checksums", folder)
        load_checkpoint(folder, model, None, None, ParallelState(0, 1, 0, torch.device("cpu")), verify=cfg.run.verify)
    model.eval()
    processor = ChatProcessor.for_model(tokenizer, model, cfg.data)
    return model, tokenizer, processor


def _verify_export(cfg: Config, export: Path) -> None:
    """Check the export's files against its checksum manifest
    (:func:`~omnicore.checkpoint.manifest.verify_export`) before anything reads them; with
    ``run.verify: false`` only warn. A folder that is no export is left to :func:`model_config_from_export`.

    Raises:
        CheckpointError: a file is missing, changed (sha256) or added, or there is no manifest.
    """
    from omnicore.checkpoint.manifest import verify_export

    if not (export / "omnicore.yaml").is_file():
        return
    if cfg.run.verify:
        verify_export(export.resolve())
    else:
        logger.warning("run.verify is false: the export %s is loaded without checking its checksums", export)


def _build_from_export(cfg: Config, export: str) -> tuple[Any, Any]:
    """:func:`~omnicore.model.build.build_omni_model` of an export's section (files already checked).

    Raises:
        CheckpointError: the build failed on what the file checks cannot see (a config that
            transformers refuses, a tensor of another shape), naming the export and the cause;
            a config or registry error (a plugin not installed) is raised as it is.
    """
    from omnicore.checkpoint.errors import CheckpointError
    from omnicore.checkpoint.export_files import EXPORT_DAMAGED
    from omnicore.config import ConfigError
    from omnicore.model.build import build_omni_model
    from omnicore.registry import RegistryError

    try:
        return build_omni_model(cfg)
    except (ConfigError, RegistryError, CheckpointError):
        raise
    except Exception as exc:
        raise CheckpointError(
            f"cannot load the export {export}: {type(exc).__name__}: {' '.join(str(exc).split())}; {EXPORT_DAMAGED}"
        ) from exc


def load_on_device(cfg: Config, checkpoint: str | None, export: str | None) -> tuple[Any, Any, ChatProcessor]:
    """:func:`load_trained`, then the model on :func:`eval_device`; one timed log line."""
    with Phase(logger, "loading the trained model") as ph:
        model, tokenizer, processor = load_trained(cfg, checkpoint, export)
        device = eval_device(cfg)
        model.to(device)
        n = sum(p.numel() for p in model.parameters())
        ph.detail = f"{n / 1e6:.2f} M parameters from {export or checkpoint or 'the latest checkpoint'}, on {device}"
    return model, tokenizer, processor


def eval_device(cfg: Config) -> torch.device:
    """Where ``omnicore eval`` and ``generate`` run: ``run.device`` (``auto``: the GPU when torch
    sees one, else the CPU).

    Raises:
        ConfigError: ``run.device: cuda`` on a machine where ``torch.cuda.is_available()`` is False.
    """
    from omnicore.config import ConfigError

    want = cfg.run.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{cfg.source}: run.device: cuda, but torch sees no CUDA device here; use auto or cpu")
    return torch.device("cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu")
