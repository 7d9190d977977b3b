"""LoRA adapters through PEFT (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
Models"; huggingface/peft ``inject_adapter_in_model``), configured by ``model.lora``.

:func:`apply_lora` runs on the freshly built model, before freezing and the parallel strategies.
PEFT swaps each targeted ``nn.Linear`` for a ``lora.Linear`` that holds the original layer as
``base_layer`` and the adapters as ``lora_A.default`` / ``lora_B.default``; the module tree
otherwise stays as it was, so ``model.lm`` is still the transformers model whose
``_no_split_modules`` blocks FSDP2 and activation checkpointing find, and the kernels still patch.

What trains: inside each adapted prefix (``model.lora.modules``) only the adapters do; every other
parameter there (base weights, norms, embeddings) is frozen (``requires_grad`` False), the usual
LoRA recipe. Parts outside the prefixes (projectors, encoders) keep training unless ``train.freeze``
names them.

:func:`merge_lora` folds the adapters into the base weights and restores the plain ``nn.Linear``
layers (the merged export); :func:`strip_lora` restores them without merging (the base of an
adapter export); :func:`lora_state_dict` gives the adapter weights in PEFT's file layout, and
:func:`load_lora_adapter` puts such a saved adapter back onto a base model.

Tied weights (``tie_word_embeddings``: ``lm_head`` and ``embed_tokens`` hold one tensor): an adapter
on ``lm_head`` adapts the output side only; the input embedding stays the base weight, in training
and in the PEFT adapter export alike. Merged, the two therefore differ: :func:`merge_lora` gives the
merged layer its own tensor (merging in place would change the embedding too), and the export
writes them untied (:func:`omnicore.checkpoint.export.write_export`). :func:`tied_adapted` lists
such layers.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnicore.config import ConfigError, LoraConfig

logger = logging.getLogger(__name__)

ADAPTER = "default"
"""PEFT's adapter name for the one adapter omnicore trains."""

_PEFT_TIE_WARNING = r"Model has `tie_word_embeddings=True` and a tied layer is part of the adapter"


def _linear_names(module: nn.Module) -> list[str]:
    return [n for n, m in module.named_modules() if isinstance(m, nn.Linear) and n]


@contextlib.contextmanager
def _tie_warning_off() -> Any:
    """PEFT warns when it adapts a tied layer, since merging it in place would change the other
    module too: omnicore's merge unties it (see the module docstring), so the warning asks nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PEFT_TIE_WARNING)
        yield


def _check_targets(module: nn.Module, prefix: str, targets: list[str]) -> None:
    """Each target must name at least one ``nn.Linear`` under ``prefix`` (PEFT's rule: the dotted
    name equals the target or ends with ``.<target>``)."""
    names = _linear_names(module)
    for t in targets:
        if not any(n == t or n.endswith(f".{t}") for n in names):
            leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
            found = ", ".join(leaves[:12]) + (", ..." if len(leaves) > 12 else "") if leaves else "none"
            raise ConfigError(
                f"model.lora.target_modules: {t!r} matches no nn.Linear under {prefix!r} (model.lora.modules); "
                f"nn.Linear names there: {found}. Use one of these last name parts"
            )


def _materialize(module: nn.Module, seed: int | None) -> None:
    """Give every LoRA layer real CPU adapter weights, initialised the PEFT way (``lora_A``
    kaiming-uniform with ``a=sqrt(5)``, ``lora_B`` zeros) from torch's global RNG, in module order.

    PEFT puts new adapters on the base layer's device, which is ``meta`` when the foundation is
    filled from its checkpoint after parallelisation; adapters are not in that checkpoint, so they
    must be real here. They are re-initialised on every path (meta base or not) so the values
    depend only on the RNG state (``seed``: reseeded first, inside a forked RNG), never on whether
    the base was meta; every rank therefore makes the same adapters.
    """
    from peft.tuners.lora import LoraLayer

    fork = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with fork:
        if seed is not None:
            torch.manual_seed(seed)
        for m in module.modules():
            if not isinstance(m, LoraLayer) or ADAPTER not in m.lora_A:
                continue
            for part in (m.lora_A[ADAPTER], m.lora_B[ADAPTER]):
                if any(p.is_meta for p in part.parameters()):
                    part.to_empty(device="cpu")
            m.reset_lora_parameters(ADAPTER, init_lora_weights=True)


def apply_lora(model: nn.Module, cfg: LoraConfig | None, *, seed: int | None = None) -> list[str]:
    """Inject LoRA adapters (in place) into the ``nn.Linear`` layers named by ``cfg.target_modules``
    under each ``cfg.modules`` prefix of ``model`` (an :class:`~omnicore.model.omni.OmniModel`).

    Adapters are ``lora_A`` (``[r, in]``) and ``lora_B`` (``[out, r]``) with output scale
    ``alpha / r``; they take the base layer's dtype. Inside each prefix only adapters train (see the
    module docstring). When the base weights are on ``meta`` (filled from a checkpoint later) the
    adapters are still real CPU tensors; inside a ``torch.device("meta")`` context (``omnicore
    plan``) they stay on meta. ``seed``: reseed the adapter initialisation (the run's seed), so the
    values do not depend on what the build drew from the RNG before.

    Returns the dotted names (relative to ``model``) of the adapted layers; ``[]`` when ``cfg`` is None.

    Raises:
        ConfigError: a prefix of ``model.lora.modules`` names no submodule, or a target of
            ``model.lora.target_modules`` matches no ``nn.Linear`` under a prefix (the message
            lists the Linear names found).
    """
    if cfg is None:
        return []
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    from omnicore.model.loading import rename_pending

    adapted: list[str] = []
    for prefix in cfg.modules:
        try:
            sub = model.get_submodule(prefix)
        except AttributeError as exc:
            tops = ", ".join(n for n, _ in model.named_children())
            raise ConfigError(f"model.lora.modules: {prefix!r} names no submodule of the model (top level: {tops})") from exc
        _check_targets(sub, prefix, cfg.target_modules)
        peft_cfg = PeftLoraConfig(
            r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules), bias="none"
        )
        with _tie_warning_off():
            inject_adapter_in_model(peft_cfg, sub, adapter_name=ADAPTER)
        for name, p in sub.named_parameters():  # PEFT does this too; stated here as the contract
            p.requires_grad_("lora_" in name)
        adapted += [f"{prefix}.{n}" for n, m in sub.named_modules() if hasattr(m, "lora_A") and ADAPTER in m.lora_A]
    # base weights still to be read from a checkpoint (sharded loading) now sit under base_layer
    rename_pending(model, {f"{layer}.{leaf}": f"{layer}.base_layer.{leaf}" for layer in adapted for leaf in ("weight", "bias")})
    if torch.get_default_device().type == "meta":  # omnicore plan, the export's copy: no adapter values, no log lines
        return adapted
    _materialize(model, seed)
    for layer, other in tied_adapted(model):
        logger.info(
            "model.lora: %s shares its weight with %s (tied: tie_word_embeddings); the adapter changes %s only, "
            "so a merged export writes the two untied (tie_word_embeddings: false)",
            layer, other, layer,
        )  # fmt: skip
    return adapted


def tied_adapted(model: nn.Module) -> list[tuple[str, str]]:
    """The LoRA layers of ``model`` whose base weight is tied to another parameter:
    ``[(layer name, the other parameter's name)]``, e.g. ``[("lm.lm_head", "lm.model.embed_tokens.weight")]``
    for ``target_modules: [lm_head]`` under ``tie_word_embeddings``. Empty without such layers."""
    from peft.tuners.lora import LoraLayer

    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    out = []
    for name, m in model.named_modules():
        if isinstance(m, LoraLayer) and ADAPTER in m.lora_A:
            own = f"{name}.base_layer.weight"
            others = [n for n in names.get(id(m.get_base_layer().weight), []) if n != own]
            if others:
                out.append((name, others[0]))
    return out


def head_weight(layer: nn.Module) -> torch.Tensor | None:
    """The ``[out, in]`` weight that ``layer`` applies, for a fused linear + cross-entropy kernel,
    which takes the LM head's weight and not the module: ``layer.weight`` for a plain
    ``nn.Linear``; for a LoRA layer (``lm_head`` in ``model.lora.target_modules``) its base weight
    plus ``(alpha / r) * B @ A`` of each active unmerged adapter, differentiable in ``A`` and ``B``.
    PEFT's own ``weight`` attribute is the base weight alone: through it the adapter would neither
    count in the loss nor train. None where no one weight gives the module's output (adapter dropout
    active in training, a LoRA bias or variant such as DoRA): the caller then runs the module."""
    if not hasattr(layer, "lora_A"):
        return layer.weight
    weight = layer.get_base_layer().weight
    if layer.merged or layer.disable_adapters:
        return weight
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        drop = layer.lora_dropout[name]
        dropping = layer.training and isinstance(drop, nn.Dropout) and drop.p > 0
        if dropping or name in getattr(layer, "lora_variant", {}) or getattr(layer, "lora_bias", {}).get(name):
            return None
        weight = weight + layer.get_delta_weight(name).to(weight.dtype)
    return weight


def _merge_untied(layer: nn.Module, tied: bool) -> None:
    """PEFT's ``merge`` of one layer into a copy of its base weight: PEFT writes the merged values
    into the base tensor, which may be shared with another module (a ``tied`` input embedding) or
    with another model (the export's copy holds the trained model's tensors on one process:
    :func:`omnicore.checkpoint.export.unsharded_copy`), and would change that one too. When a tied
    layer's merged weight equals the shared one (an adapter whose update is zero) the layer shares it
    again."""
    base = layer.get_base_layer()
    shared = base.weight
    base.weight = nn.Parameter(shared.detach().clone(), requires_grad=shared.requires_grad)
    layer.merge(safe_merge=True)
    if tied and torch.equal(base.weight, shared):
        base.weight = shared


def _unwrap(model: nn.Module, merge: bool) -> int:
    """Replace every LoRA layer by its base layer, after folding the adapter in when ``merge``."""
    from peft.tuners.lora import LoraLayer

    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    tied = {name for name, _ in tied_adapted(model)} if merge else set()
    for name, layer in layers:
        if merge:
            _merge_untied(layer, name in tied)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer.get_base_layer())
    for m in model.modules():  # the PEFT config apply_lora attached to each adapted prefix
        if isinstance(getattr(m, "peft_config", None), dict):
            del m.peft_config
    return len(layers)


def merge_lora(model: nn.Module) -> int:
    """Fold each adapter into its base weight (``W + (alpha / r) * B @ A``, PEFT's ``merge`` with a
    finiteness check) and put the plain ``nn.Linear`` back, in place. Returns the layer count.

    Each base weight is merged into a copy, so a tensor the layer shares (a parameter it is tied to,
    :func:`tied_adapted`, or another model's) is left unchanged: the layer ends with its own weight
    (a tied one shares it again only when the merged weight equals it). The caller says so in the
    model's config (``tie_word_embeddings``).

    Raises:
        ValueError: (PEFT) a merged weight is not finite.
    """
    return _unwrap(model, merge=True)


def strip_lora(model: nn.Module) -> int:
    """Put the plain base ``nn.Linear`` back without the adapters, in place. Returns the layer count."""
    return _unwrap(model, merge=False)


def lora_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights of ``module`` keyed as PEFT's ``adapter_model.safetensors`` stores them
    (``base_model.model.<name>.lora_A.weight``: ``PeftModel.from_pretrained`` reads this layout).

    Adapters only: PEFT would add the base weight of an adapted ``lm_head`` (its ``save_embedding_layers``
    guess, for a resized vocabulary), which the exported base folder already holds, frozen, at the
    trained vocabulary size."""
    from peft.utils import get_peft_model_state_dict

    sd = get_peft_model_state_dict(module, adapter_name=ADAPTER, save_embedding_layers=False)
    return {f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in sd.items()}


def family_lm_prefixes(folder: str | Path, lm: nn.Module) -> list[tuple[str, str]]:
    """Where omnicore's language model sits inside a published family's class: ``[(omnicore
    prefix, family prefix)]`` for its text model and its LM head, e.g. ``[("model",
    "model.language_model"), ("lm_head", "lm_head")]`` for Qwen2-VL, Qwen2-Audio and LLaVA in
    transformers 5.

    The family class is ``folder/config.json``'s ``architectures[0]``, built on the meta device
    (nothing is read or allocated); both sides are found through transformers' own
    ``get_decoder()`` and ``get_output_embeddings()``, so no family's names are written here.

    Raises:
        ValueError: ``config.json`` names no transformers class, or either side lacks a decoder or
            an LM head.
    """
    import transformers

    folder = Path(folder)
    config = transformers.AutoConfig.from_pretrained(str(folder))
    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, str(arch), None) if arch else None
    if cls is None:
        raise ValueError(f"{folder / 'config.json'}: architectures {getattr(config, 'architectures', None)} names no transformers class")
    with torch.device("meta"):
        family = cls(config)
    pairs = []
    for getter in ("get_decoder", "get_output_embeddings"):
        paths = []
        for root in (lm, family):
            names = {id(m): n for n, m in root.named_modules()}
            part = getattr(root, getter)()
            if part is None or id(part) not in names:
                raise ValueError(f"{type(root).__name__}.{getter}() gives no submodule: cannot place the LoRA adapter of {folder}")
            paths.append(names[id(part)])
        pairs.append((paths[0], paths[1]))
    return pairs


def _swap_prefix(name: str, pairs: list[tuple[str, str]]) -> str:
    """``name`` with the first matching ``old`` module prefix of ``pairs`` replaced by its ``new``."""
    for old, new in pairs:
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    raise ValueError(f"LoRA layer {name!r} is under none of {[old for old, _ in pairs]}")


def family_adapter(state: dict[str, torch.Tensor], config: Any, lm: nn.Module, folder: str | Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """A LoRA adapter of ``lm`` (omnicore's language model; ``state`` as :func:`lora_state_dict`
    gave it, ``config`` as :func:`peft_adapter_config`) renamed to a PEFT adapter of the published
    family class whose ``config.json`` is in ``folder``: ``(LoraConfig, state dict)``. Keys become
    ``base_model.model.<family module>.lora_A.weight``; ``target_modules`` lists the adapted layers
    by their full family names, so PEFT injects into those only (not into a tower's layers of the
    same short name). ``PeftModel.from_pretrained(<Family>ForConditionalGeneration.from_pretrained(folder),
    <adapter folder>)`` then gives the trained model. ``lm`` may have its adapters stripped already.

    Raises:
        ValueError: see :func:`family_lm_prefixes`.
    """
    import copy

    pairs = family_lm_prefixes(folder, lm)
    renamed = {}
    for key, value in state.items():
        layer, _, leaf = key.removeprefix("base_model.model.").partition(".lora_")
        renamed[f"base_model.model.{_swap_prefix(layer, pairs)}.lora_{leaf}"] = value
    config = copy.deepcopy(config)
    config.target_modules = sorted({k.removeprefix("base_model.model.").partition(".lora_")[0] for k in renamed})
    config.base_model_name_or_path = None
    return config, renamed


def load_lora_adapter(module: nn.Module, folder: str | Path, prefixes: list[tuple[str, str]] | None = None) -> list[str]:
    """Inject the PEFT adapter saved in ``folder`` (``adapter_config.json`` and
    ``adapter_model.safetensors``, as ``model.lora.export: adapter`` writes ``export/foundation_lora``)
    into ``module`` (the base foundation) and load its weights, strictly. Returns the adapted layer names.

    ``prefixes``: ``[(family prefix, omnicore prefix)]`` for an adapter of a published family's
    class (:func:`family_adapter`): its layer names are put back under ``module``'s and it is
    injected into exactly those layers.

    Raises:
        ValueError: the adapter's tensors and the injected layers differ (the names are listed):
            the adapter belongs to another model.
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model
    from safetensors.torch import load_file

    folder = Path(folder)
    config = PeftLoraConfig.from_pretrained(str(folder))
    saved = {}
    for key, value in load_file(str(folder / "adapter_model.safetensors")).items():
        key = key.removeprefix("base_model.model.")
        if prefixes:
            layer, _, leaf = key.partition(".lora_")
            key = f"{_swap_prefix(layer, prefixes)}.lora_{leaf}"
        saved[key.replace(".lora_A.", f".lora_A.{ADAPTER}.").replace(".lora_B.", f".lora_B.{ADAPTER}.")] = value
    if prefixes:
        config.target_modules = sorted({k.partition(".lora_")[0] for k in saved})
    with _tie_warning_off():
        inject_adapter_in_model(config, module, adapter_name=ADAPTER)
    own = {n: p for n, p in module.named_parameters() if "lora_" in n}
    if set(own) != set(saved):
        only_file, only_model = sorted(set(saved) - set(own))[:4], sorted(set(own) - set(saved))[:4]
        raise ValueError(f"{folder}: adapter does not fit the model: only in the file {only_file}, only in the model {only_model}")
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(saved[name])
    return sorted({n.rsplit(".lora_", 1)[0] for n in own})


def peft_adapter_config(module: nn.Module) -> Any:
    """The PEFT ``LoraConfig`` that :func:`apply_lora` attached to ``module`` (for ``save_pretrained``)."""
    return module.peft_config[ADAPTER]
