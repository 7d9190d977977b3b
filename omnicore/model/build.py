"""``build_omni_model``: resolve the configured components from the registry and assemble them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnicore.config import Config, ModelConfig
from omnicore.data.chat import placeholder_ids, special_tokens
from omnicore.registry import Registry, RegistryError, registry_for


def prepare_tokenizer(tokenizer: Any, encoder_modalities: list[str], decoder_modalities: list[str]) -> Any:
    """Add omnicore's chat and placeholder tokens (see :func:`omnicore.data.chat.special_tokens`)."""
    from omnicore.data.chat import IM_END, PAD

    tokenizer.add_special_tokens(
        {"additional_special_tokens": special_tokens(encoder_modalities, decoder_modalities)}, replace_extra_special_tokens=False
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = PAD
    tokenizer.eos_token = IM_END
    return tokenizer


def _check_modality(component: Any, kind: str, key: str, name: str, part: str = "") -> None:
    got = getattr(component, "modality", None)
    if got != key:
        raise RegistryError(
            f"model.{kind}s.{key}: {kind} {name!r}{part} handles modality {got!r}, not {key!r}; put it under model.{kind}s.{got}"
        )


def _resolve_checkpoints(options: dict[str, Any], base: Path | None) -> dict[str, Any]:
    """A relative ``checkpoint`` option is relative to the config file's folder."""
    ckpt = options.get("checkpoint")
    if base is None or not isinstance(ckpt, str) or Path(ckpt).is_absolute():
        return options
    return dict(options, checkpoint=str(base / ckpt))


def build_kernels(m: ModelConfig, registry: Registry) -> dict[str, Any]:
    """Build the kernel of each configured op (:meth:`ModelConfig.kernel_choices`) and check it.

    Runs before the foundation is built, so a bad choice costs no weight loading. Returns op ->
    kernel object (``attention`` always; other ops only where configured).

    Raises:
        RegistryError: naming the config field (``model.kernels.<op>``): the kernel is unknown or its options are invalid, it implements
            another op (``model.kernels.rmsnorm: kernel 'liger_swiglu' implements op 'swiglu', not
            'rmsnorm'``), or it is unavailable here (its ``requires`` unmet, or ``available()``
            false; the reason follows).
    """
    out: dict[str, Any] = {}
    for op, c in m.kernel_choices().items():
        field = f"model.kernels.{op}"
        try:
            kernel = registry.build("kernel", c.name, c.options)
        except RegistryError as exc:
            raise RegistryError(f"{field}: {exc}") from exc
        got = getattr(kernel, "op", None)
        if got != op:
            raise RegistryError(f"{field}: kernel {c.name!r} implements op {got!r}, not {op!r}")
        if op == "cross_entropy" and not callable(getattr(kernel, "linear_cross_entropy_sum", None)):
            raise RegistryError(f"{field}: kernel {c.name!r} has no linear_cross_entropy_sum method (the cross_entropy contract)")
        ok, why = kernel.available()
        if not ok:
            raise RegistryError(f"{field}: kernel {c.name!r} is unavailable here: {why}")
        out[op] = kernel
    return out


def _build(registry: Registry, field: str, kind: str, name: str, options: dict[str, Any], **kwargs: Any) -> Any:
    """``registry.build`` for one configured component; a factory's ``ValueError`` or ``OSError``
    (a missing checkpoint folder, a bad file) becomes a :class:`RegistryError` naming the config
    field, so the CLI reports it as a one-line error."""
    try:
        return registry.build(kind, name, options, **kwargs)
    except RegistryError:
        raise
    except (ValueError, OSError) as exc:
        raise RegistryError(f"{field}: {kind} {name!r}: {' '.join(str(exc).split())}") from exc  # one line


def build_processors(cfg: Config, registry: Registry | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The data side of ``cfg.model``: ``(encoder processors, decoder processors)``, each modality
    key -> :class:`omnicore.components.Processor`, built from the components' options alone.

    Nothing of the model is imported or built: no foundation, no ``nn.Module``, no weights read
    (:meth:`omnicore.registry.Registry.build_processor`; a plugin written for API 1.1 is the
    exception, built whole with a warning). A relative ``checkpoint`` in a component's options is
    taken relative to the config file, as :func:`build_omni_model` does. This is what data workers
    use.

    Raises:
        RegistryError: naming the config field (``model.encoders.<key>``): a component is unknown,
            fails its options, its processor factory raises ``ValueError`` or ``OSError`` (a missing
            checkpoint folder), or its processor handles another modality than its key.
    """
    registry = registry or registry_for(cfg)
    base = Path(cfg.source).parent if cfg.source else None
    out: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    for kind, table, built in (("encoder", cfg.model.encoders, out[0]), ("decoder", cfg.model.decoders, out[1])):
        for key, c in table.items():
            field = f"model.{kind}s.{key}"
            try:
                built[key] = registry.build_processor(kind, c.name, _resolve_checkpoints(c.options, base))
            except RegistryError as exc:
                raise RegistryError(f"{field}: {exc}") from exc
            except (ValueError, OSError) as exc:
                raise RegistryError(f"{field}: {kind} {c.name!r}: {' '.join(str(exc).split())}") from exc
            _check_modality(built[key], kind, key, c.name, "'s processor")
    return out


def build_omni_model(cfg: Config, registry: Registry | None = None) -> tuple[Any, Any]:
    """Build ``(OmniModel, tokenizer)`` from ``cfg.model``, on CPU, randomly initialised or loaded.

    A relative ``checkpoint`` in a component's options is taken relative to the config file. The
    foundation's vocabulary is sized to the tokenizer after omnicore's special tokens are added;
    each encoder and decoder is built with the foundation's hidden size. The kernels of
    ``cfg.model.kernels`` are built and checked first (see
    :func:`build_kernels`), then activated on the foundation; the ``cross_entropy`` kernel computes
    the model's text loss.

    Raises:
        RegistryError: a component is unknown, ambiguous, fails its options, or sits under the wrong
            modality key; a kernel is unknown, implements another op or is unavailable here.
    """
    import torch

    from omnicore.model.omni import OmniModel

    registry = registry or registry_for(cfg)
    torch.manual_seed(cfg.run.seed)
    m = cfg.model
    base = Path(cfg.source).parent if cfg.source else None
    # Every configured kernel first: an unknown, mismatched or unavailable one (its requires unmet,
    # or its own check failing) stops the run before any weights are built or loaded.
    kernels = build_kernels(m, registry)
    foundation = _build(registry, "model.foundation", "foundation", m.foundation.name, _resolve_checkpoints(m.foundation.options, base))
    tokenizer = prepare_tokenizer(foundation.build_tokenizer(), list(m.encoders), list(m.decoders))
    lm = foundation.build_model(vocab_size=len(tokenizer))
    hidden = lm.config.get_text_config().hidden_size
    encoders = {}
    for key, c in m.encoders.items():
        encoders[key] = _build(
            registry, f"model.encoders.{key}", "encoder", c.name, _resolve_checkpoints(c.options, base), hidden_size=hidden
        )
        _check_modality(encoders[key], "encoder", key, c.name)
    decoders = {}
    for key, c in m.decoders.items():
        decoders[key] = _build(
            registry, f"model.decoders.{key}", "decoder", c.name, _resolve_checkpoints(c.options, base), hidden_size=hidden
        )
        _check_modality(decoders[key], "decoder", key, c.name)
    for kernel in kernels.values():
        kernel.activate(lm)
    model = OmniModel(lm, encoders, decoders, placeholder_ids(tokenizer, list(encoders), list(decoders)))
    if "cross_entropy" in kernels:
        model.cross_entropy = kernels["cross_entropy"]
    return model, tokenizer
