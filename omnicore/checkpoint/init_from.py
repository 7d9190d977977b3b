"""``model.init_from``: start a new run from the weights of a previous one (a training stage).

Weights only: the new run gets a fresh optimizer, LR schedule and data position, and ``--resume``
of the new run continues the new run (``init_from`` applies to a fresh start only). What the
setting may name, relative to the config file:

* an **export folder** (``omnicore.yaml`` + ``foundation/``, ``encoders/<modality>/``,
  ``decoders/<modality>/``, see :mod:`omnicore.checkpoint.export`): before the model is built, every
  configured component is pointed at its folder of the export (``checkpoint: <export>/<kind>/<key>``;
  its ``config`` option dropped, since the folder holds it), so the normal loading path reads them
  (:func:`apply_export`);
* a **checkpoint folder** (``checkpoints/step-NNNNNNNN``, the step zero-padded to 8 digits; DCP): its files are verified against the
  manifest, and after the parallel strategies wrap the model, only its ``model`` part is loaded
  into the (sharded) model, strictly (:func:`load_model_weights`);
* a **run folder**: its ``export/`` when there is one (a finished run), else its newest checkpoint
  that verifies (:func:`omnicore.checkpoint.resume.find_good_checkpoint`).

A component configured now but absent from the export (or the other way round), or configured
under another registry name, is an error naming it: initialising it fresh would silently break
"stage 2 starts from stage 1's weights"; remove it from this stage or train it in the earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from omnicore.checkpoint.errors import CheckpointError
from omnicore.checkpoint.export_files import check_export_files
from omnicore.config import Config

__all__ = ["InitFrom", "apply_export", "load_model_weights", "peft_base_key", "resolve_init_from", "start_from"]


@dataclass(frozen=True)
class InitFrom:
    """Where a run's initial weights come from: ``kind`` is ``export`` (a folder holding
    ``omnicore.yaml``) or ``checkpoint`` (a verified DCP ``step-NNNNNNNN`` folder); ``folder`` is absolute."""

    kind: Literal["export", "checkpoint"]
    folder: Path


def _is_checkpoint(folder: Path) -> bool:
    return (folder / "trainer_state.json").is_file() or (folder / ".metadata").is_file()


def resolve_init_from(cfg: Config, state: Any | None = None) -> InitFrom:
    """What ``cfg.model.init_from`` names (module docstring); a checkpoint or an export is verified
    against its checksum manifest unless ``run.verify`` is false (a checkpoint collectively when
    ``state`` is distributed: every rank must call this).

    Raises:
        CheckpointError: the folder does not exist; it is none of an export, a checkpoint and a run
            folder; the checkpoint or export is corrupt (naming the bad file) or has no manifest; or
            a run folder has no export and no checkpoint that verifies.
    """
    from omnicore.checkpoint.dcp import verify_checkpoint
    from omnicore.checkpoint.resume import find_good_checkpoint, saved_folders

    given = cfg.model.init_from
    if given is None:
        raise ValueError("resolve_init_from: cfg.model.init_from is not set")
    folder = cfg.resolve_path(given).resolve()
    where = f"model.init_from: {given}" + (f" ({folder})" if str(folder) != given else "")
    if not folder.is_dir():
        raise CheckpointError(f"{where}: no such folder; give a run folder, its export/ or a checkpoint (checkpoints/step-NNNNNNNN)")
    if (folder / "omnicore.yaml").is_file():
        return _verified_export(folder, cfg.run.verify)
    if _is_checkpoint(folder):
        try:
            if cfg.run.verify:
                verify_checkpoint(folder, state)
        except CheckpointError as exc:
            raise CheckpointError(f"model.init_from: {exc}") from exc
        return InitFrom("checkpoint", folder)
    if (folder / "export" / "omnicore.yaml").is_file():
        return _verified_export(folder / "export", cfg.run.verify)
    if (folder / "checkpoints" / "latest").is_file() or saved_folders(folder / "checkpoints"):
        try:
            good, _ = find_good_checkpoint(folder / "checkpoints", state, verify=cfg.run.verify)
        except CheckpointError as exc:
            raise CheckpointError(f"model.init_from: {exc}") from exc
        return InitFrom("checkpoint", good)
    raise CheckpointError(
        f"{where}: neither an export (no omnicore.yaml), a checkpoint (no trainer_state.json) nor a run folder (no export/ "
        "and no checkpoints/latest); give the output_dir of a previous run, its export/ or one of its checkpoints/step-NNNNNNNN"
    )


def _verified_export(folder: Path, verify: bool) -> InitFrom:
    """The export ``folder`` to start from, its files checked against its checksum manifest first
    (:func:`~omnicore.checkpoint.manifest.verify_export`) unless ``verify`` is False.

    Raises:
        CheckpointError: ``model.init_from: export ... is damaged: FILE: ...`` or cannot be verified.
    """
    from omnicore.checkpoint.manifest import verify_export

    if verify:
        try:
            verify_export(folder)
        except CheckpointError as exc:
            raise CheckpointError(f"model.init_from: {exc}") from exc
    return InitFrom("export", folder)


def _pointed(component: Any, exported: dict[str, Any] | None, field: str, export: Path) -> Any:
    """``component`` (a ComponentConfig) loading from its folder of the export.

    Raises:
        CheckpointError: the export lacks it, or holds it under another registry name.
    """
    if exported is None:
        raise CheckpointError(
            f"model.init_from: {export} holds no {field} (it was not part of that run); remove {field} from this config, "
            "or train it in the earlier stage"
        )
    if exported.get("name") != component.name:
        raise CheckpointError(
            f"model.init_from: {field} is {component.name!r} here but {exported.get('name')!r} in {export}; configure the same component"
        )
    checkpoint = (exported.get("options") or {}).get("checkpoint")
    if not isinstance(checkpoint, str):
        raise CheckpointError(f"model.init_from: {export / 'omnicore.yaml'}: {field} has no checkpoint folder")
    options = {k: v for k, v in component.options.items() if k != "config"}
    options["checkpoint"] = str(export / checkpoint)
    return component.model_copy(update={"options": options})


def apply_export(cfg: Config, export: Path) -> Config:
    """A copy of ``cfg`` whose model components load from ``export`` (absolute checkpoint paths,
    ``config`` options dropped, other options and ``dtype`` kept) and whose ``model.init_from`` is
    unset (the new run's own export is then self-contained).

    Raises:
        CheckpointError: the set of encoders or decoders differs from the export's (naming the
            keys), a component has another registry name there, a file of the export is damaged
            (:func:`~omnicore.checkpoint.export_files.check_export_files`: ``omnicore.yaml``, a
            truncated safetensors file, a bad ``tokenizer.json``), or
            the export holds a LoRA adapter apart from its foundation (``foundation_lora/``, from
            ``model.lora.export: adapter``), whose weights the folders alone would leave out.
    """
    if (export / "foundation_lora").is_dir():
        raise CheckpointError(
            f"model.init_from: {export} holds its LoRA adapter apart (foundation_lora/, written with model.lora.export: adapter); "
            "a stage started from foundation/ alone would lose the adapter's training. Start from that run's checkpoint instead "
            "(model.init_from: RUN/checkpoints/step-NNNNNNNN), or export it with model.lora.export: merged"
        )
    # the export's files checked before the build reads them: a damaged one is named, not a traceback
    section = check_export_files(export, "model.init_from: ")
    m = cfg.model
    updates: dict[str, Any] = {"init_from": None}
    updates["foundation"] = _pointed(m.foundation, section["foundation"], "model.foundation", export)
    for kind in ("encoders", "decoders"):
        ours, theirs = getattr(m, kind), section.get(kind) or {}
        extra = sorted(set(theirs) - set(ours))
        if extra:
            raise CheckpointError(
                f"model.init_from: {export} also holds {', '.join(f'model.{kind}.{k}' for k in extra)}, which this config lacks; "
                "configure the same components as the earlier stage"
            )
        updates[kind] = {key: _pointed(c, theirs.get(key), f"model.{kind}.{key}", export) for key, c in ours.items()}
    return cfg.model_copy(update={"model": m.model_copy(update=updates)})


def peft_base_key(key: str) -> str:
    """The name a parameter had before PEFT wrapped its module: ``base_model.model.`` and
    ``.base_layer`` removed (``lm.base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight``
    -> ``lm.model.layers.0.self_attn.q_proj.weight``), so that a checkpoint of a run without LoRA
    loads into a model with adapters."""
    return key.replace("base_model.model.", "").replace(".base_layer.", ".")


def _is_adapter(key: str) -> bool:
    """A LoRA adapter parameter added by PEFT (kept at its fresh initialisation)."""
    return any(f".{part}." in key for part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"))


def _checkpoint_model_keys(folder: Path) -> set[str]:
    """The keys of the checkpoint's ``model`` part (from its DCP metadata, read without unpickling code)."""
    from omnicore.checkpoint.safety import SafeFileSystemReader

    metadata = SafeFileSystemReader(str(folder)).read_metadata()
    return {k.removeprefix("model.") for k in metadata.state_dict_metadata if k.startswith("model.")}


def load_model_weights(folder: Path, model: Any, state: Any) -> None:
    """Load the ``model`` part of the DCP checkpoint ``folder`` into ``model`` (plain or wrapped by
    the parallel strategies; DCP reshards), leaving optimizer, schedule, data position and RNG alone.
    Collective: every rank calls it. Strict, except that LoRA adapter parameters the checkpoint
    lacks keep their initialisation (their base weights are matched through :func:`peft_base_key`).

    Raises:
        CheckpointError: the checkpoint lacks a parameter of the model, or holds one the model does
            not have (naming up to 5 of each and their counts), or fails to load (naming the folder).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from omnicore.checkpoint.dcp import _dcp_load

    ours = get_model_state_dict(model)
    wanted = {peft_base_key(k): k for k in ours if not _is_adapter(k)}
    have = _checkpoint_model_keys(folder)
    missing, unexpected = sorted(set(wanted) - have), sorted(have - set(wanted))
    if missing or unexpected:
        show = lambda keys: ", ".join(keys[:5]) + (f" (and {len(keys) - 5} more)" if len(keys) > 5 else "")  # noqa: E731
        parts = [f"{len(missing)} parameter(s) of this model missing from it: {show(missing)}"] if missing else []
        parts += [f"{len(unexpected)} tensor(s) this model does not have: {show(unexpected)}"] if unexpected else []
        raise CheckpointError(
            f"model.init_from: checkpoint {folder} does not fit this model: {'; '.join(parts)}; configure the same components "
            "as the run that wrote it"
        )
    sd = {"model": {ck: ours[k] for ck, k in wanted.items()}}
    _dcp_load(sd, folder, state)
    set_model_state_dict(model, {k: sd["model"][ck] for ck, k in wanted.items()}, options=_non_strict_if(len(wanted) < len(ours)))


def _non_strict_if(partial: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(strict=not partial)


def start_from(cfg: Config, resume: bool | str, state: Any, log: Any) -> tuple[Config, InitFrom | None]:
    """The training set-up's first step for ``model.init_from``: on a fresh start, resolve it and,
    for an export, return ``cfg`` pointed at the export's folders (:func:`apply_export`); a
    checkpoint is returned for :func:`load_model_weights` after the model is parallelized. With
    ``resume`` (or no ``init_from``): ``(cfg, None)``, the run's own checkpoint being what counts.

    Raises:
        CheckpointError: as :func:`resolve_init_from` and :func:`apply_export`.
    """
    if resume or cfg.model.init_from is None:
        return cfg, None
    init = resolve_init_from(cfg, state)
    unchecked = "; run.verify is false: its files were not checked against their checksums" if not cfg.run.verify else ""
    log(f"init_from: weights of {init.kind} {init.folder} (new optimizer, LR schedule and data position){unchecked}")
    if init.kind == "export":
        return apply_export(cfg, init.folder), None
    return cfg, init
