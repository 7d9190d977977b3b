"""``build_omni_model``: resolve the configured components from the registry and assemble them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnicore.config import ComponentConfig, Config, ModelConfig
from omnicore.data.chat import placeholder_ids, special_tokens
from omnicore.registry import Registry, RegistryError, registry_for


def prepare_tokenizer(tokenizer: Any, encoders: Any, decoder_modalities: Any, *, chat_template: str = "auto") -> Any:
    """Add the chat and placeholder tokens omnicore needs (:func:`omnicore.data.chat.special_tokens`)
    that ``tokenizer`` lacks, and set ``eos_token`` to the token that ends an assistant turn, so that
    generation (here and with ``AutoTokenizer.from_pretrained`` of the export) stops there: the chat
    template's end-of-turn token when the tokenizer has a template omnicore can follow (also under
    ``chat_template="chatml"``, where ChatProcessor stops at ``<|im_end|>`` itself)
    (:func:`omnicore.data.chat_template.inspect_template`: ``<|eot_id|>`` for Llama 3, ``<|im_end|>``
    for Qwen), else ChatML's ``<|im_end|>``.

    A token the tokenizer already has is left as it is, so a published checkpoint's tokenizer, whose
    processors name its own placeholders (``<|image_pad|>``, ``<image>``), keeps its vocabulary.
    ``<|pad|>`` is added only when there is no pad token, and ChatML's ``<|im_start|>`` /
    ``<|im_end|>`` only when samples are rendered with ChatML (no usable template, or
    ``chat_template="chatml"``).

    Args:
        encoders: encoder modalities, or a mapping modality -> processor (see
            :func:`omnicore.data.chat.media_tokens`).
        decoder_modalities: decoder modalities, or a mapping modality -> processor (see
            :func:`omnicore.data.chat.decoder_tokens`).
        chat_template: ``data.chat_template`` (``auto`` or ``chatml``).
    """
    from omnicore.data.chat import IM_END, IM_START, PAD, _token_id
    from omnicore.data.chat_template import has_template, inspect_template

    end = None
    if has_template(tokenizer):
        try:
            end = inspect_template(tokenizer).end_of_turn
        except ValueError:
            pass  # a template omnicore cannot follow: data.chat_template auto refuses it in ChatProcessor, chatml uses <|im_end|>
    chatml = chat_template == "chatml" or end is None
    skip = ({PAD} if tokenizer.pad_token is not None else set()) | (set() if chatml else {IM_START, IM_END})
    missing = [t for t in special_tokens(encoders, decoder_modalities) if t not in skip and _token_id(tokenizer, t) is None]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = PAD
    tokenizer.eos_token = end if end is not None else IM_END  # the template's end of turn even under chatml (its ids stay the same)
    return tokenizer


def _check_modality(component: Any, kind: str, key: str, name: str, part: str = "") -> None:
    got = getattr(component, "modality", None)
    if got != key:
        raise RegistryError(
            f"model.{kind}s.{key}: {kind} {name!r}{part} handles modality {got!r}, not {key!r}; put it under model.{kind}s.{got}"
        )


PATH_OPTIONS = ("checkpoint", "tokenizer")
"""Component options that name a folder or a Hugging Face model, resolved by :func:`_resolve_checkpoints`
(``tokenizer: byte``, the foundation's built-in choice, is left as it is)."""


def _resolve_checkpoints(options: dict[str, Any], base: Path | None) -> dict[str, Any]:
    """A component's ``checkpoint`` (and ``tokenizer``) option as a local folder: a relative path is
    relative to the config file's folder; a Hugging Face model name (``org/name``) that is not a
    folder there is looked up in the local HF cache (:func:`omnicore.model.loading.resolve_pretrained`).
    A file that exists is passed on, for the component to read or refuse.

    Raises:
        RegistryError: starting ``options.checkpoint:`` (or ``options.tokenizer:``; the caller puts
            the component's field in front): a missing folder given as a path (``no such folder:
            /abs/path``, :func:`omnicore.model.loading.no_such_folder`), or a model name that is
            neither cached nor downloadable.
    """
    from omnicore.model.loading import LoadError, resolve_pretrained

    out = dict(options)
    for key in PATH_OPTIONS:
        value = options.get(key)
        if not isinstance(value, str) or (key == "tokenizer" and value == "byte"):
            continue
        local = Path(value).expanduser()
        local = local if local.is_absolute() or base is None else base / local
        if local.exists():
            out[key] = str(local)
            continue
        try:
            out[key] = str(resolve_pretrained(value, base=base, what=f"options.{key}"))
        except LoadError as exc:
            raise RegistryError(str(exc)) from exc
    return out


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
    field, so the CLI reports it as a one-line error. A foundation named ``auto`` is the installed
    family that serves its checkpoint's ``model_type`` (:meth:`Registry.build`)."""
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
    (:meth:`omnicore.registry.Registry.build_processor`). A relative ``checkpoint`` in a component's options is
    taken relative to the config file, as :func:`build_omni_model` does. This is what data workers
    use.

    Raises:
        RegistryError: naming the config field (``model.encoders.<key>``): a component is unknown,
            fails its options, its processor factory raises ``ValueError`` or ``OSError`` (a missing
            checkpoint folder), or its processor handles another modality than its key.
    """
    registry = registry or registry_for(cfg)
    base = Path(cfg.source).parent if cfg.source else None
    add_foundation_encoders(cfg, registry)
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


def add_foundation_encoders(cfg: Config, registry: Registry, foundation: Any = None) -> Any:
    """Add to ``cfg.model.encoders`` the encoder entries that the foundation's checkpoint brings
    (the optional :meth:`omnicore.components.Foundation.encoders`: a published model's vision or
    audio tower with its projector), under each key the config does not set itself; a configured
    key wins. Idempotent. Returns the foundation object (built from its options when not given;
    building it reads no weights).

    Raises:
        RegistryError: the foundation cannot be built, or an entry it brings is not a valid
            encoder entry (named ``model.encoders.<key>``, from the foundation).
    """
    from omnicore.config import check_shares

    m = cfg.model
    base = Path(cfg.source).parent if cfg.source else None
    if foundation is None:
        foundation = _build(registry, "model.foundation", "foundation", m.foundation.name, _options("model.foundation", m.foundation, base))
    brings = getattr(foundation, "encoders", None)
    if not callable(brings):
        return foundation
    added = False
    for key, entry in dict(brings()).items():
        if key in m.encoders:
            continue
        try:
            entry = dict(entry)
            # the foundation was given its paths resolved (relative to the working directory); a
            # brought entry's are made absolute so that they are not taken as relative to the config again
            options = dict(entry.get("options") or {})
            for name in PATH_OPTIONS:
                value = options.get(name)
                if isinstance(value, str) and not Path(value).is_absolute() and Path(value).exists():
                    options[name] = str(Path(value).absolute())
            entry["options"] = options
            m.encoders[key] = ComponentConfig.model_validate(entry)
            m._brought.add(key)
        except ValueError as exc:
            raise RegistryError(
                f"model.encoders.{key} (brought by foundation {m.foundation.name!r}): {' '.join(str(exc).split())}"
            ) from exc
        added = True
    if added:
        try:
            check_shares(m)
        except ValueError as exc:
            raise RegistryError(f"{exc} (entries brought by foundation {m.foundation.name!r})") from exc
    return foundation


def build_foundation(cfg: Config, registry: Registry | None = None) -> Any:
    """The foundation object of ``cfg.model.foundation`` (its factory's result: no weights read).

    Raises:
        RegistryError: naming ``model.foundation``: unknown, bad options, or a checkpoint that is
            neither a folder nor a cached model.
    """
    registry = registry or registry_for(cfg)
    base = Path(cfg.source).parent if cfg.source else None
    m = cfg.model
    return _build(registry, "model.foundation", "foundation", m.foundation.name, _options("model.foundation", m.foundation, base))


def component_dtype(cfg: Config, component: ComponentConfig) -> Any:
    """The torch dtype of a component's parameters: its own ``dtype``, else ``run.dtype``."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[component.dtype or cfg.run.dtype]


SPAN_ATTENTION = ("sdpa", "eager")
"""The attention implementations that apply the dense masks of a foundation's media spans
(``FoundationOptional.media_span_inputs``); varlen kernels (``sdpa_varlen``, ``flash_attn``) split
the row by ``cu_seqlens`` and apply no mask."""


def check_span_attention(lm: Any, foundation: str) -> None:
    """Raise unless ``lm``'s attention implementation (the ``model.kernels.attention`` kernel, already
    activated) applies the masks of a foundation with media spans (:data:`SPAN_ATTENTION`).

    Raises:
        RegistryError: naming ``model.kernels.attention``, the kernel and what to choose.
    """
    impl = getattr(lm.config, "_attn_implementation", None)
    if impl not in SPAN_ATTENTION:
        raise RegistryError(
            f"model.kernels.attention: the foundation {foundation!r} attends bidirectionally within each medium's placeholder "
            f"tokens, through an attention mask per layer type, which the {impl!r} attention implementation does not apply "
            f"(varlen kernels split the row by cu_seqlens and take no mask); choose {' or '.join(SPAN_ATTENTION)}"
        )


def _build_lm(foundation: Any, vocab_size: int, dtype: Any) -> Any:
    """``foundation.build_model`` in ``dtype``: passed on when the foundation's ``build_model``
    takes a ``dtype`` keyword (optional in the contract), else the model is cast after building."""
    import inspect

    if "dtype" in inspect.signature(foundation.build_model).parameters:
        return foundation.build_model(vocab_size=vocab_size, dtype=dtype)
    return foundation.build_model(vocab_size=vocab_size).to(dtype)


def build_omni_model(cfg: Config, registry: Registry | None = None, *, defer_load: bool = False) -> tuple[Any, Any]:
    """Build ``(OmniModel, tokenizer)`` from ``cfg.model``, on CPU, randomly initialised or loaded.

    A component's ``checkpoint`` may be a folder (relative to the config file) or a Hugging Face
    model name (:func:`_resolve_checkpoints`). Each component's parameters are in its ``dtype``
    (else ``run.dtype``). The foundation's vocabulary is sized to the tokenizer after omnicore's
    special tokens are added; each encoder and decoder is built with the foundation's hidden size.
    The kernels of ``cfg.model.kernels`` are built and checked first (see :func:`build_kernels`),
    then activated on the foundation; the ``cross_entropy`` kernel computes the model's text loss.

    A foundation checkpoint that can be read shard by shard is not read here: its parameters are on
    the meta device and ``model.pending_loads`` holds the plan
    (:class:`omnicore.model.loading.PendingLoad`, keys already checked against the checkpoint).
    With ``defer_load`` the caller fills them after sharding
    (:func:`omnicore.model.loading.fill_pending`; the training loop does); otherwise they are filled
    here, on this process.

    Raises:
        RegistryError: a component is unknown, ambiguous, fails its options, sits under the wrong
            modality key, or its checkpoint is neither a folder nor a cached model; a kernel is
            unknown, implements another op or is unavailable here; the foundation checkpoint does
            not fit the model (the keys named).
    """
    import torch

    from omnicore.model.loading import fill_pending
    from omnicore.model.omni import OmniModel

    registry = registry or registry_for(cfg)
    torch.manual_seed(cfg.run.seed)
    m = cfg.model
    base = Path(cfg.source).parent if cfg.source else None
    # Every configured kernel first: an unknown, mismatched or unavailable one (its requires unmet,
    # or its own check failing) stops the run before any weights are built or loaded.
    kernels = build_kernels(m, registry)
    foundation = _build(registry, "model.foundation", "foundation", m.foundation.name, _options("model.foundation", m.foundation, base))
    add_foundation_encoders(cfg, registry, foundation)
    processors, dec_processors = build_processors(cfg, registry)
    tokenizer = prepare_tokenizer(foundation.build_tokenizer(), processors, dec_processors, chat_template=cfg.data.chat_template)
    try:
        lm = _build_lm(foundation, len(tokenizer), component_dtype(cfg, m.foundation))
    except ValueError as exc:
        raise RegistryError(f"model.foundation: {' '.join(str(exc).split())}") from exc
    hidden = lm.config.get_text_config().hidden_size
    parts: dict[str, dict[str, Any]] = {"encoder": {}, "decoder": {}}
    shared: dict[str, tuple[str, Any]] = {}
    for kind, table in (("encoder", m.encoders), ("decoder", m.decoders)):
        for key, c in table.items():
            field = f"model.{kind}s.{key}"
            if c.share is not None:  # no module of its own: its batches go to the module of c.share
                shared[key] = (c.share, processors[key])
                continue
            module = _build(registry, field, kind, c.name, _options(field, c, base), hidden_size=hidden)
            _check_modality(module, kind, key, c.name)
            dtype = component_dtype(cfg, c)
            parts[kind][key] = module.to(dtype) if any(p.is_floating_point() and p.dtype != dtype for p in module.parameters()) else module
    for kernel in kernels.values():
        kernel.activate(lm)
    table = {k: processors[k] for k in m.encoders}
    try:
        ids = placeholder_ids(tokenizer, table, {k: dec_processors[k] for k in parts["decoder"]})
        model = OmniModel(lm, parts["encoder"], parts["decoder"], ids, shared=shared)
    except ValueError as exc:
        raise RegistryError(" ".join(str(exc).split())) from exc
    if "cross_entropy" in kernels:
        model.cross_entropy = kernels["cross_entropy"]
    span_inputs = getattr(foundation, "media_span_inputs", None)
    if callable(span_inputs):  # bidirectional media spans: masks the attention kernel must apply
        check_span_attention(lm, m.foundation.name)
        model.media_span_inputs = span_inputs
    layer_inputs = getattr(foundation, "layer_inputs", None)
    if callable(layer_inputs):
        model.layer_inputs = layer_inputs
    declared_rope = getattr(foundation, "rope_layout", None)
    if callable(declared_rope):  # a foundation that names its mRoPE layout (else inferred from the config)
        from omnicore.data.positions import RopeLayout

        rope = declared_rope()
        if rope is not None and not isinstance(rope, RopeLayout):
            raise RegistryError(
                f"model.foundation: {m.foundation.name}'s rope_layout() returned {type(rope).__name__}, not a RopeLayout or None"
            )
        model.rope = rope
    family_parts = getattr(foundation, "part_names", None)
    if callable(family_parts):
        model.part_names = {str(k): [str(p).rstrip(".") for p in v] for k, v in dict(family_parts()).items()}
    for prefix, module in [("lm.", lm)] + [(f"encoders.{k}.", e) for k, e in parts["encoder"].items()]:
        pending = getattr(module, "omnicore_pending_load", None)
        if pending is not None:  # read after sharding, each rank its own slices (omnicore.model.loading.fill_pending)
            pending.prefix, pending.seed = prefix, cfg.run.seed
            model.pending_loads.append(pending)
            del module.omnicore_pending_load
    if not defer_load and torch.get_default_device().type != "meta":
        fill_pending(model)
    return model, tokenizer


def _options(field: str, c: ComponentConfig, base: Path | None) -> dict[str, Any]:
    """A component's options with its checkpoint resolved (:func:`_resolve_checkpoints`); errors name ``field``."""
    try:
        return _resolve_checkpoints(c.options, base)
    except RegistryError as exc:
        raise RegistryError(f"{field}: {exc}") from exc


def open_data(cfg: Config, registry: Registry, tokenizer: Any, rope: Any = None) -> tuple[Any, list[Any]]:
    """The chat processor of the data side (a :class:`~omnicore.data.chat.ChatProcessor`: the
    tokenizer and the components' processors, no weights; ``rope``: the foundation's mRoPE layout,
    ``OmniModel.rope``) and the opened data sources (nothing read yet). Training opens its data
    with it, and ``omnicore plan`` reads a step through it.

    Raises:
        SampleError: a source cannot be opened, or two have one name.
    """
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.jsonl import SampleError
    from omnicore.data.sources import open_source

    encoders, decoders = build_processors(cfg, registry)
    d = cfg.data
    processor = ChatProcessor(
        tokenizer,
        encoders,
        decoders,
        d.system_prompt,
        special_tokens_in_text=d.special_tokens_in_text,
        max_tokens=d.max_tokens,
        chat_template=d.chat_template,
        rope=rope,
    )
    base = Path(cfg.source).parent if cfg.source else Path.cwd()
    sources = []
    for i, sc in enumerate(d.source_list()):
        try:
            sources.append(open_source(sc, base, max_tokens=d.max_tokens))  # a line too long for max_tokens: refused unread
        except ValueError as exc:
            raise SampleError(f"{'data.train' if d.train is not None else f'data.sources[{i}]'}: {exc}") from exc
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise SampleError(f"data.sources: two sources are named alike ({names}); give each a distinct name")
    return processor, sources
