"""Export trained components as Hugging Face-style safetensors folders.

Layout of ``<output_dir>/export/``::

    foundation/            save_pretrained of the causal LM + its tokenizer
                           (loads with transformers.AutoModelForCausalLM.from_pretrained)
    encoders/<modality>/   each encoder's own save_pretrained folder
    decoders/<modality>/   each decoder's own save_pretrained folder
    omnicore.yaml          a ``model:`` config section that rebuilds the model from these folders

With ``model.lora`` the adapters are exported as ``model.lora.export`` says: ``merged`` folds them
into the weights (every folder above loads as plain transformers / diffusers, no PEFT needed);
``adapter`` writes ``foundation/`` as the base model without them plus::

    foundation_lora/       the foundation's PEFT adapter (adapter_config.json, adapter_model.safetensors):
                           peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("foundation"), "foundation_lora")

(adapters on encoders or decoders are always merged: their folders have no PEFT loader).

An adapter on a tied layer (``tie_word_embeddings`` with ``lm_head`` in ``model.lora.target_modules``)
changes the LM head and not the input embedding. Merged, the two differ, so ``foundation/`` is
written untied: its ``config.json`` says ``tie_word_embeddings: false`` and it holds both tensors
(one log line says so); its logits are those of the trained model. A published family writes its
own config, which ties them again, so there this combination is refused before step 1
(:func:`check_lora_export`); the adapter export stays exact either way (PEFT keeps the embedding apart).

A published family's foundation (one with ``export_pretrained``, e.g. ``qwen2_audio``) writes its
own layout at the top instead of ``foundation/`` and ``encoders/<modality>/`` for the towers it
brings: ``<Family>ForConditionalGeneration.from_pretrained(export)`` loads it. In adapter mode
``foundation_lora/`` is then a PEFT adapter of that class (layer names as the class has them,
:func:`omnicore.model.lora.family_adapter`): ``PeftModel.from_pretrained(<Family>...from_pretrained(export),
export/foundation_lora)``. The
``omnicore.yaml`` section has ``lora`` unset: it rebuilds the merged model, or in adapter mode the
base model (its header comment says how to add the adapter).

``manifest.json`` at the top lists the size and sha256 of every file under the export (paths
relative to it, :mod:`omnicore.checkpoint.manifest`); ``omnicore eval``/``generate --export`` and
``model.init_from`` refuse an export whose files differ from it, or that has none, unless
``run.verify`` is false.

The export is written to a temporary folder and renamed into place, so a crash leaves the previous
export intact. A failed write (a full disk) removes that folder and says how much space the weights
need and how much is free; ``--resume`` of the finished run then exports it again
(:mod:`omnicore.checkpoint.changes`).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from omnicore.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)


def export_model(model: Any, tokenizer: Any, cfg: Any, out_dir: str | Path, state: Any, registry: Any = None) -> Path | None:
    """Gather the full state dict (collective) and write the export on rank 0. Returns the folder on rank 0.

    ``registry``: the :class:`~omnicore.registry.Registry` the model was built from (the run's); the
    copy and the foundation's export are built through it, so that a name such as ``auto`` resolves to
    the same component as in training. Default: the config's discovery (:func:`~omnicore.registry.registry_for`).

    Rank 0 builds a second model with its parameters on the meta device (with the LoRA layers of
    ``model.lora``), then takes the gathered tensors by assignment: no weights are read from disk or
    initialised a second time. Buffers outside the state dict (rotary ``inv_freq``) are copied from
    the trained model. Collective again at the end: every rank learns whether rank 0 succeeded.

    Raises:
        CheckpointError: on every rank, when rank 0 cannot write the export: a full disk (one line
            naming the folder, the space the weights need and the space free there, and the command
            that exports the finished run once there is room), a folder that is not writable, or
            weights holding NaN or inf (nothing non-finite is exported). The temporary folder is
            removed and a previous export is left as it was. Any other failure is raised on rank 0
            as it is (after the same clean-up), and as a CheckpointError on the other ranks.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from omnicore.checkpoint.dcp import _gather_errors

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    out = Path(out_dir)
    failure: Exception | None = None
    described: str | None = None
    if state.is_main:
        tmp = out.with_name(f".{out.name}.tmp")
        try:
            _refuse_nonfinite(full, out)
            from omnicore.checkpoint.dcp import replace_folder

            plain = unsharded_copy(model, cfg, full, registry)
            shutil.rmtree(tmp, ignore_errors=True)
            write_export(plain, tokenizer, cfg, tmp, registry)
            replace_folder(tmp, out)
        except Exception as exc:  # a half-written export is never left behind, whatever failed
            shutil.rmtree(tmp, ignore_errors=True)
            failure, described = exc, export_failure(out, exc, full, cfg)
    error = described or (f"rank 0 could not write the export {out} ({type(failure).__name__}; see its error)" if failure else None)
    errors = _gather_errors(state, error)
    if failure is not None and described is None:
        raise failure
    if errors:
        raise CheckpointError(errors[0]) from failure
    return out if state.is_main else None


def _refuse_nonfinite(full: dict[str, Any], out: Path) -> None:
    """Refuse to export weights (``full``: the gathered state dict) holding NaN or inf.

    Raises:
        CheckpointError: naming how many tensors and the first.
    """
    import torch

    bad = [k for k, t in full.items() if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise CheckpointError(
            f"cannot write the export {out}: the weights hold NaN or inf ({len(bad)} tensor(s), the first {bad[0]}); nothing "
            "non-finite is exported: train again from the last good checkpoint with a lower train.lr"
        )


_OS_ERROR_IN_TEXT = re.compile(r"(?:code: |os error )(\d+)")
"""An errno in the text of an error from Rust code (safetensors: ``IoError(Os { code: 28, kind:
StorageFull, ...})``; tokenizers: ``No space left on device (os error 28)``)."""


def export_failure(out: Path, exc: BaseException, full: dict[str, Any], cfg: Any) -> str | None:
    """One line for a failed export to ``out``, or None for a failure that is not the file system's
    (a bug, to be raised as it is). A full disk names the space the weights need (``full``: the
    gathered state dict) and the space free, and how to export the finished run once fixed: the
    run's ``--resume`` command (:func:`omnicore.checkpoint.changes.continue_command`), which for a
    finished run only exports."""
    from omnicore.checkpoint.changes import continue_command
    from omnicore.checkpoint.dcp import _os_error_of

    if isinstance(exc, CheckpointError):
        return str(exc)
    os_error = _os_error_of(exc)
    code = os_error.errno if os_error is not None else None
    if code is None and (m := _OS_ERROR_IN_TEXT.search(str(exc))):
        code = int(m.group(1))
    if code is None:
        return None
    where = (os_error.filename if os_error is not None else None) or out.parent
    kept = "; the previous export is left as it was" if out.is_dir() else ""
    then = f"then export the finished run with: {continue_command(cfg)}"
    if code in (errno.ENOSPC, errno.EDQUOT):
        need = sum(t.numel() * t.element_size() for t in full.values() if hasattr(t, "element_size"))
        free = _free_bytes(out)
        space = f"the export needs about {_size(need)} for the weights" + (f", {_size(free)} are free there" if free is not None else "")
        return f"cannot write the export {out}: the disk is full at {where} ({space}); the partial export was removed{kept}; free space, {then}"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write the export {out}: {where} is not writable ({os.strerror(code)}); fix its permissions{kept}, {then}"
    return f"cannot write the export {out}: {os.strerror(code)} at {where}; the partial export was removed{kept}; fix the cause, {then}"


def _size(n: int) -> str:
    """``n`` bytes for a message: ``12.3 GB``, ``45.6 MB`` or ``78.9 kB`` (powers of 1000)."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or of its nearest existing parent), None if unknown."""
    for p in [path, *path.parents]:
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def unsharded_copy(model: Any, cfg: Any, full: dict[str, Any], registry: Any = None) -> Any:
    """A plain (unsharded, CPU) :class:`~omnicore.model.omni.OmniModel` holding ``full``, the
    gathered state dict of the trained ``model``; built on meta, so nothing is loaded twice, from
    ``registry`` (default: the config's discovery; see :func:`export_model`).

    Raises:
        RuntimeError: ``full`` lacks a key of the model or has one it does not use (``load_state_dict``, strict).
    """
    import warnings

    import torch

    from omnicore.model.build import build_omni_model
    from omnicore.model.loading import retie, tied_groups
    from omnicore.model.lora import apply_lora

    with torch.device("meta"), warnings.catch_warnings():
        # a checkpointed component copies into meta tensors: a deliberate no-op here, torch warns per tensor
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
        plain, _ = build_omni_model(cfg, registry)
        apply_lora(plain, cfg.model.lora)
    tied = tied_groups(plain)  # tie_word_embeddings, also where LoRA wraps lm_head (transformers' tie_weights cannot)
    plain.load_state_dict(full, assign=True)
    retie(tied)  # assign= put two tensors where the model shares one
    # buffer names without the wrapper parts that torch.compile and checkpoint_wrapper may add
    trained = {n.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", ""): b for n, b in model.named_buffers()}
    for name, buf in list(plain.named_buffers()):
        if buf.is_meta:  # non-persistent buffers are not in the state dict: take the trained model's
            owner, _, leaf = name.rpartition(".")
            plain.get_submodule(owner).register_buffer(leaf, trained[name].detach().cpu().clone(), persistent=False)
    return plain


def check_lora_export(model: Any, cfg: Any, registry: Any = None) -> None:
    """Refuse, before training, a merged LoRA export that cannot be exact: an adapter on a tied
    layer (``tie_word_embeddings`` with ``lm_head`` in ``model.lora.target_modules``) of a published
    family's foundation (one with ``export_pretrained``), whose export writes the family's config
    and so ties the LM head to the input embedding again. ``model``: the built model with its
    adapters (:func:`omnicore.model.lora.apply_lora`); nothing is checked when ``train.export`` is
    off or ``model.lora.export`` is ``adapter``.

    Raises:
        ConfigError: naming the tied layer, the parameter it shares, the foundation, and what to change.
    """
    from omnicore.model.build import build_foundation
    from omnicore.model.lora import tied_adapted

    lora = cfg.model.lora
    if lora is None or lora.export != "merged" or not cfg.train.export:
        return
    tied = tied_adapted(model)
    if tied and callable(getattr(build_foundation(cfg, registry), "export_pretrained", None)):
        _refuse_tied_family(cfg, tied)


def _refuse_tied_family(cfg: Any, tied: list[tuple[str, str]]) -> None:
    """Raise :func:`check_lora_export`'s error for a published family's foundation when a layer of
    its language model in ``tied`` (:func:`omnicore.model.lora.tied_adapted`) is adapted."""
    from omnicore.config import ConfigError

    tied = [(layer, other) for layer, other in tied if layer.startswith("lm.")]
    if not tied:
        return
    layer, other = tied[0]
    raise ConfigError(
        f"model.lora.target_modules: the adapter on {layer} cannot be merged exactly: its weight is tied to {other} "
        f"(tie_word_embeddings), and foundation {cfg.model.foundation.name!r} exports its published config, which ties them "
        "again. Set model.lora.export: adapter (the PEFT adapter keeps the embedding apart), or leave "
        f"{layer.rsplit('.', 1)[-1]!r} out of model.lora.target_modules"
    )


def _untie_merged(lm: Any) -> None:
    """After merging: an LM head that no longer shares the input embedding's tensor (a merged
    adapter on a tied ``lm_head``) is written untied, ``tie_word_embeddings: false`` in its config;
    one log line says so."""
    out, emb = lm.get_output_embeddings(), lm.get_input_embeddings()
    if not getattr(lm.config, "tie_word_embeddings", False) or out is None or out.weight is emb.weight:
        return
    lm.config.tie_word_embeddings = False
    logger.info(
        "export: the merged LoRA adapter changed the tied LM head and not the input embedding; the export writes both "
        "tensors, with tie_word_embeddings: false"
    )


def write_export(model: Any, tokenizer: Any, cfg: Any, out: Path, registry: Any = None) -> None:
    """Write an unsharded :class:`~omnicore.model.omni.OmniModel` as the export layout above; the
    foundation (whose ``export_pretrained`` writes a published family's layout) is built from
    ``registry`` (default: the config's discovery; see :func:`export_model`).

    With LoRA adapters in ``model`` (``model.lora``) the model is changed in place: adapters are
    merged, or (``export: adapter``) the foundation's are written apart and removed. Last, every
    file's size and sha256 go into ``manifest.json`` (:func:`~omnicore.checkpoint.manifest.write_tree_manifest`),
    which ``omnicore eval``/``generate --export`` and ``model.init_from`` check before loading."""
    from transformers.utils import logging as hf_logging

    from omnicore.checkpoint.manifest import write_tree_manifest
    from omnicore.model.build import build_foundation

    out.mkdir(parents=True)
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one-shard "Writing model shards" bars add only noise here
    family = getattr(build_foundation(cfg, registry), "export_pretrained", None)
    family = family if callable(family) else None
    try:
        header, adapter = _write_lora(model, cfg, out, family is not None)
        _write_components(model, tokenizer, cfg, out, header, family)
        if adapter is not None:
            _write_family_adapter(adapter, out)
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
    write_tree_manifest(out)


def _write_lora(model: Any, cfg: Any, out: Path, family: bool) -> tuple[str, Any]:
    """Merge the adapters, or write the foundation's as a PEFT adapter folder and strip them.
    Returns a comment for the head of ``omnicore.yaml`` and, for a published family (whose class
    exists only once its export is written), ``(lm, adapter state)`` still to be written by
    :func:`_write_family_adapter`; else ``None``."""
    from omnicore.model.lora import lora_state_dict, merge_lora, peft_adapter_config, strip_lora, tied_adapted

    lora = cfg.model.lora
    if lora is None:
        return "", None
    if lora.export == "merged":
        if family:  # refused before step 1 already (check_lora_export); here for a direct call
            _refuse_tied_family(cfg, tied_adapted(model))
        merge_lora(model)
        _untie_merged(model.lm)
        return "# LoRA adapters are merged into these weights (model.lora.export: merged)\n", None
    if family:
        # keyed by omnicore's names until the family's config.json exists to rename them by
        pending = (lora_state_dict(model.lm), peft_adapter_config(model.lm), model.lm)
        strip_lora(model.lm)
        merge_lora(model)
        return (
            "# The export is the base model; its LoRA adapter is in foundation_lora/ (model.lora.export: adapter),\n"
            "# a PEFT adapter of the family's class. In Python:\n"
            "#   peft.PeftModel.from_pretrained(<Family>ForConditionalGeneration.from_pretrained('.'), 'foundation_lora')\n"
        ), pending
    from safetensors.torch import save_file

    adapter_dir = out / "foundation_lora"
    adapter_dir.mkdir()
    peft_adapter_config(model.lm).save_pretrained(str(adapter_dir))
    save_file(lora_state_dict(model.lm), str(adapter_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    strip_lora(model.lm)
    merge_lora(model)  # adapters outside the foundation
    return (
        "# foundation/ is the base model; its LoRA adapter is in foundation_lora/ (model.lora.export: adapter).\n"
        "# This section rebuilds the base model. With the adapter, in Python:\n"
        "#   peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained('foundation'), 'foundation_lora')\n"
        "# or merge it first and point model.foundation.options.checkpoint at the merged folder.\n"
    ), None


def _write_family_adapter(pending: Any, out: Path) -> None:
    """Write ``out/foundation_lora``: the adapter held by :func:`_write_lora`, renamed to the
    family class whose ``config.json`` is now in ``out`` (:func:`omnicore.model.lora.family_adapter`)."""
    from safetensors.torch import save_file

    from omnicore.model.lora import family_adapter

    config, state = family_adapter(*pending, out)
    adapter_dir = out / "foundation_lora"
    adapter_dir.mkdir()
    config.save_pretrained(str(adapter_dir))
    save_file(state, str(adapter_dir / "adapter_model.safetensors"), metadata={"format": "pt"})


def _write_components(model: Any, tokenizer: Any, cfg: Any, out: Path, header: str = "", family: Any = None) -> None:
    """The folders of the layout above, or for a published family (a foundation with
    ``export_pretrained``) the family's own layout at the top of ``out`` (its
    ``...ForConditionalGeneration.from_pretrained(out)`` loads it) plus ``omnicore.yaml``, whose
    foundation entry points at ``out`` itself and which leaves out the encoders the foundation
    brings again; decoders and encoders configured apart still get their folders."""
    from omnicore.data.chat import encoder_processors, module_processors

    section = cfg.model.model_dump()
    brought = set(getattr(cfg.model, "_brought", ()))
    if family is not None:
        family(model, tokenizer, out)
        options = {k: v for k, v in cfg.model.foundation.options.items() if k != "config"}
        section["foundation"] = {"name": cfg.model.foundation.name, "options": {**options, "checkpoint": "."}}
        section["encoders"] = {k: v for k, v in section["encoders"].items() if k not in brought}
    else:
        model.lm.save_pretrained(out / "foundation")
        save_tokenizer(tokenizer, cfg.data, out / "foundation", encoder_processors(model), module_processors(model.decoders, "decoder"))
        section["foundation"] = {"name": cfg.model.foundation.name, "options": {"checkpoint": "foundation"}}
    section["lora"] = None  # merged or apart: the folders hold no adapter layers
    section["init_from"] = None  # these folders are the weights
    for kind, modules in (("encoders", model.encoders), ("decoders", model.decoders)):
        for m, module in modules.items():
            if m not in section[kind]:  # brought by the family's foundation: in its layout above
                continue
            module.save_pretrained(str(out / kind / m))
            opts = dict(section[kind][m]["options"])
            opts.pop("config", None)
            opts["checkpoint"] = f"{kind}/{m}"
            section[kind][m]["options"] = opts
    (out / "omnicore.yaml").write_text(header + yaml.safe_dump({"model": section}, sort_keys=False))


def save_tokenizer(tokenizer: Any, data: Any, folder: Path, encoders: dict[str, Any], decoders: dict[str, Any]) -> None:
    """``tokenizer.save_pretrained(folder)``, carrying the chat template the run trained with.

    When samples were rendered with omnicore's ChatML (the tokenizer has no chat template of its
    own, as the byte tokenizer, or ``data.chat_template: chatml``), the saved tokenizer gets
    :func:`omnicore.data.chatml.chatml_template` as its ``chat_template`` (``data.system_prompt``
    included, each encoder's and decoder's tokens for media parts), so that ``apply_chat_template``
    on the export renders the training text; otherwise it keeps its own template. ``tokenizer``
    itself is left as it was.

    Args:
        data: the config's ``data`` section (``chat_template``, ``system_prompt``).
        encoders, decoders: modality -> processor of the model's encoders and decoders
            (:func:`omnicore.data.chat.media_tokens`, :func:`omnicore.data.chat.decoder_tokens`).
    """
    from omnicore.data.chat import decoder_tokens, media_tokens
    from omnicore.data.chat_template import has_template
    from omnicore.data.chatml import chatml_template

    if data.chat_template == "auto" and has_template(tokenizer):
        tokenizer.save_pretrained(folder)
        return
    inputs = {}
    for m, proc in encoders.items():
        placeholder, wrap = media_tokens(m, proc)
        inputs[m] = wrap[0] + placeholder + wrap[1] if wrap else placeholder
    outputs = {m: "".join(decoder_tokens(m, proc)) for m, proc in decoders.items()}
    own = tokenizer.chat_template
    tokenizer.chat_template = chatml_template(data.system_prompt, inputs, outputs)
    try:
        tokenizer.save_pretrained(folder)
    finally:
        tokenizer.chat_template = own
