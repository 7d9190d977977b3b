"""Model FLOPs (forward + backward) of every part of an :class:`~omnicore.model.omni.OmniModel`.

Three kinds of part, each counted its own way:

* ``foundation``: by formula (PaLM, Chowdhery et al. 2022, appendix B): ``6 N`` per token for the
  ``N`` weights a token multiplies, plus ``12 L d_attn s^2`` per packed sample of ``s`` tokens
  (``QK^T`` and ``AV``, forward + backward, per layer; the causal half is not subtracted). ``N``
  leaves out the input-embedding table (a lookup) and keeps the LM head even when tied. For a
  mixture of experts, ``N`` holds the shared weights and ``top_k`` of the ``E`` routed experts
  (each routed expert's weights count ``top_k / E``): the experts' count and top-k are read from
  the config (:func:`moe_routing`), the routed weights are the parameters under a module called
  ``experts`` (transformers' Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek layouts; shared experts are
  ``shared_expert(s)`` and count whole).
* ``encoder.<modality>`` and ``decoder.<modality>``: from the component's optional ``flops(batch)``
  (:class:`omnicore.components.Encoder`), else **measured** once: the first micro-batch holding
  the modality runs under :class:`PartCounter` (torch's FLOP formulas, attributed to the part
  whose call made the op, in forward and in backward), and later batches are estimated from
  FLOPs per **input element** (:func:`input_units`: the elements of the collated batch's
  floating-point tensors, so pixels, mel frames or samples, padding included) on that
  measurement. An encoder counts the batches its module is called on, where it is called: an
  encoder hook (``encoder_balance``) that moves items between ranks moves their FLOPs too. A
  decoder's count holds all its work on its targets: the tokenizer's ``encode`` (which
  ``train.code_cache_mb`` skips for a target seen before, and which is then left out), ``embed``,
  ``head`` and the depth decoder of a decoder with several codebooks per frame.

Dummy passes (a rank's micro-batch without a modality still runs its encoder on a dummy item, to
keep the collectives in step) do no model work and are not counted, as padding is not.
Recomputation is not counted either: activation checkpointing's second forward, and the scores a
fused attention kernel recomputes in its backward (torch's formula counts 5 score-sized matmuls
there, model FLOPs 4: twice the forward, PaLM's convention; :func:`flop_counter` gives torch's).
Frozen parts count what they run when measured (a frozen tower: its forward only); the
foundation's formula counts ``6 N`` whether or not its weights train, as published MFU figures do.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

logger = logging.getLogger(__name__)

FOUNDATION = "foundation"
"""The part name of the foundation in metrics rows (``flops_share/foundation``)."""

_DECODER_METHODS = ("encode", "embed", "head", "depth_logits")
"""The decoder members OmniModel calls in training (a measured decoder's calls of them are its part)."""

_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")


# --------------------------------------------------------------------------------------------
# the foundation, by formula
# --------------------------------------------------------------------------------------------


def moe_routing(config: Any) -> tuple[int, int]:
    """``(experts, top_k)`` of a mixture-of-experts text config (Qwen2-MoE and Qwen3-MoE
    ``num_experts``, Mixtral ``num_local_experts``, DeepSeek ``n_routed_experts``; top-k from
    ``num_experts_per_tok``); ``(0, 0)`` for a dense model."""
    experts = next((int(v) for k in _EXPERT_COUNT_KEYS if isinstance(v := getattr(config, k, None), int) and v > 0), 0)
    top_k = next((int(v) for k in _TOP_K_KEYS if isinstance(v := getattr(config, k, None), int) and v > 0), 0)
    return (experts, min(top_k, experts)) if experts and top_k else (0, 0)


@dataclass(frozen=True)
class FlopsModel:
    """The numbers behind the FLOP count of one foundation.

    Attributes:
        matmul_params: ``N``, weights multiplied per token (foundation minus input embeddings; for
            MoE, the shared weights plus ``top_k / experts`` of the routed experts' weights).
        layers: ``L``, transformer blocks.
        attn_dim: ``d_attn`` = attention heads x head dim.
        all_params: ``N`` with every routed expert counted whole (what omnicore counted before it
            knew experts); equal to ``matmul_params`` for a dense model.
        experts: ``E`` routed experts per MoE layer (0: dense); ``top_k``: experts per token.
    """

    matmul_params: int
    layers: int
    attn_dim: int
    all_params: int = 0
    experts: int = 0
    top_k: int = 0

    def step_flops(self, sample_lengths: list[int]) -> float:
        """Model FLOPs (forward + backward) of a micro-batch whose samples have these lengths
        (tokens): ``6 N sum(s) + 12 L d_attn sum(s^2)``."""
        tokens = sum(sample_lengths)
        return 6.0 * self.matmul_params * tokens + 12.0 * self.layers * self.attn_dim * float(sum(s * s for s in sample_lengths))

    def describe(self) -> str:
        """``6 x 1.2M weights per token (MoE: top-2 of 8 experts; 3.4M with every expert)``."""
        out = f"6 x {_short(self.matmul_params)} weights per token"
        if self.experts:
            out += f" (MoE: top-{self.top_k} of {self.experts} experts; {_short(self.all_params)} with every expert)"
        return out


def _short(n: float) -> str:
    """``27.1k``, ``1.2M``, ``7.62B``."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def flops_model(lm: Any) -> FlopsModel:
    """The :class:`FlopsModel` of a transformers causal LM (before any sharding).

    Raises:
        ValueError: the config lacks ``num_hidden_layers``/``num_attention_heads``/``hidden_size``.
    """
    cfg = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    try:
        layers, heads, hidden = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size
    except AttributeError as exc:
        raise ValueError(f"cannot count FLOPs of {type(lm).__name__}: its config lacks {exc.name}") from exc
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    emb = lm.get_input_embeddings().weight
    head = lm.get_output_embeddings()
    n = sum(p.numel() for p in lm.parameters()) - emb.numel()
    if head is not None and head.weight is emb:
        n += emb.numel()  # tied: the LM head still multiplies it
    experts, top_k = moe_routing(cfg)
    routed = sum(p.numel() for name, p in lm.named_parameters() if "experts" in name.split(".")) if experts else 0
    if experts and not routed:
        logger.warning(
            "%s: the config names %d experts but no parameter sits under an 'experts' module; every weight counted",
            type(lm).__name__,
            experts,
        )
    active = n - routed + routed * top_k // experts if routed else n
    return FlopsModel(int(active), int(layers), int(heads * head_dim), int(n), experts if routed else 0, top_k if routed else 0)


# --------------------------------------------------------------------------------------------
# counting ops: torch's formulas, plus the ops torch 2.13's FlopCounterMode leaves out
# --------------------------------------------------------------------------------------------


def _raw(fn: Callable[..., int]) -> Callable[..., int]:
    fn._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode: takes tensors, not shapes
    return fn


@_raw
def _cpu_attention(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return int(sdpa_flop_count(tuple(query.shape), tuple(key.shape), tuple(value.shape)))


@_raw
def _cpu_attention_backward(grad: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return int(sdpa_backward_flop_count(tuple(grad.shape), tuple(query.shape), tuple(key.shape), tuple(value.shape)))


@_raw
def _grouped_mm(a: Any, b: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """``torch._grouped_mm`` (transformers' ``grouped_mm`` experts): ``2 x`` the output's rows x
    columns x the contracted width (``a``'s last dim; for 2-D x 2-D, ragged along it, the groups'
    widths add up to it)."""
    out = out_val
    rows_cols = out.shape[-2] * out.shape[-1] if a.dim() == 2 and b.dim() == 2 else out.numel()
    return int(2 * rows_cols * a.shape[-1])


def extra_formulas() -> dict[Any, Callable[..., int]]:
    """FLOP formulas for ops that ``torch.utils.flop_counter`` (torch 2.13) does not count: CPU
    flash attention (what ``scaled_dot_product_attention`` runs on CPU) and ``_grouped_mm`` (MoE
    experts). Pass as ``FlopCounterMode(custom_mapping=...)``."""
    aten = torch.ops.aten
    out: dict[Any, Callable[..., int]] = {}
    for name, fn in (
        ("_scaled_dot_product_flash_attention_for_cpu", _cpu_attention),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_attention_backward),
        ("_grouped_mm", _grouped_mm),
    ):
        if hasattr(aten, name):
            out[getattr(aten, name)] = fn
    return out


def flop_counter(*, model_flops: bool = False) -> Any:
    """``torch.utils.flop_counter.FlopCounterMode`` (no table printed) with :func:`extra_formulas`:
    the reference the counts here are checked against. ``model_flops``: count the fused attention
    backward as :class:`PartCounter` does (without the recomputed scores)."""
    from torch.utils.flop_counter import FlopCounterMode

    mapping: dict[Any, Callable[..., int]] = dict(extra_formulas())
    if model_flops:
        formulas = _formulas()
        mapping.update({op: _raw(formulas[op]) for op in _attention_backward_ops() if op in formulas})
    return FlopCounterMode(display=False, custom_mapping=mapping)


_ATTENTION_BACKWARD = (
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_flash_attention_backward",
    "_efficient_attention_backward",
)


def _formulas() -> dict[Any, Callable[..., int]]:
    """Op overload packet -> ``formula(*args, out_val=..., **kwargs)``: :func:`flop_counter`'s,
    with the fused attention backward kernels counted as model FLOPs: torch counts five score-sized
    matmuls, one of them the recomputed scores; model FLOPs leave recomputation out, so four of
    the five (twice the forward, PaLM's convention and what the unfused backward multiplies, on
    any device and on meta tensors alike)."""
    from torch.utils.flop_counter import flop_registry, shape_wrapper

    extra = {k: v if getattr(v, "_get_raw", False) else shape_wrapper(v) for k, v in extra_formulas().items()}
    out = {**flop_registry, **extra}
    for op in _attention_backward_ops():
        if op in out:
            out[op] = _scaled(out[op], 4 / 5)
    return out


def _attention_backward_ops() -> list[Any]:
    return [getattr(torch.ops.aten, name) for name in _ATTENTION_BACKWARD if hasattr(torch.ops.aten, name)]


def _scaled(formula: Callable[..., int], factor: float) -> Callable[..., int]:
    return lambda *args, **kwargs: int(formula(*args, **kwargs) * factor)


# --------------------------------------------------------------------------------------------
# measuring the parts of one micro-batch
# --------------------------------------------------------------------------------------------


def _next_sequence_nr() -> int:
    """The autograd sequence number the next node of this thread gets (a node made and dropped)."""
    with torch.enable_grad():
        return torch.zeros((), requires_grad=True).view(()).grad_fn._sequence_nr() + 1  # type: ignore[union-attr]


class PartCounter(TorchDispatchMode):
    """Counts FLOPs per part while a forward and backward run (a ``TorchDispatchMode``).

    Forward: an op belongs to the part of the outermost owned call open when it runs: a forward of
    a module in ``owners`` (``id(module)`` -> owner key; global module hooks), or a call of one of
    ``methods`` (``(object, method name, owner key)``: a decoder's ``encode``, ``embed``, ``head``,
    ``depth_logits``, which OmniModel calls directly; wrapped on the object while the counter is
    open). ``label(owner)`` names the part of each outermost call when it ends (None: a call not to
    count, a dummy pass). Backward: an op belongs to the part whose forward calls made the autograd node
    running it (nodes are numbered in creation order: torch's private ``_current_autograd_node``
    and ``_sequence_nr``, the one place omnicore reads them). Ops outside owned calls land in
    ``"other"`` (the foundation, the losses).
    """

    def __init__(self, owners: dict[int, str], label: Callable[[str], str | None], methods: list[tuple[Any, str, str]] = ()):  # type: ignore[assignment]
        super().__init__()
        self.owners, self.label, self.methods = owners, label, list(methods)
        self.flops: dict[str, float] = {}
        self.no_grad: dict[str, float] = {}
        """Per part, the FLOPs of its forward ops run with gradients disabled (part of ``flops``)."""
        self._formulas = _formulas()
        self._depth = 0
        self._current: tuple[str, int, dict[str, float], dict[str, float]] | None = (
            None  # owner, first node, forward FLOPs, of them without grad
        )
        self._spans: list[tuple[int, int, str | None]] = []  # (first, last + 1, part), in order
        self._starts: list[int] = []
        self._undo: list[Callable[[], None]] = []
        self.nested: Any = None
        """A context manager entered and left with this counter (the encoder calls its labels read)."""

    def __enter__(self) -> PartCounter:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        if self.nested is not None:
            self.nested.__enter__()
        pre = register_module_forward_pre_hook(lambda module, args: self._open(self.owners.get(id(module))))
        post = register_module_forward_hook(lambda module, args, out: self._close(self.owners.get(id(module))), always_call=True)
        self._undo = [pre.remove, post.remove] + [self._wrap(obj, name, owner) for obj, name, owner in self.methods]
        return super().__enter__()  # type: ignore[return-value]

    def __exit__(self, *exc: Any) -> None:
        for undo in reversed(self._undo):
            undo()
        if self.nested is not None:
            self.nested.__exit__(*exc)
        super().__exit__(*exc)

    def _wrap(self, obj: Any, name: str, owner: str) -> Callable[[], None]:
        """Call ``obj.name`` inside an owned call until the returned function undoes it (an entry
        in the object's ``__dict__``, which shadows the class's method)."""
        own = vars(obj)
        had, before, method = name in own, own.get(name), getattr(obj, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._open(owner)
            try:
                return method(*args, **kwargs)
            finally:
                self._close(owner)

        own[name] = counted

        def undo() -> None:
            if had:
                own[name] = before
            else:
                own.pop(name, None)

        return undo

    def _open(self, owner: str | None) -> None:
        if owner is None:
            return
        self._depth += 1
        if self._depth == 1:
            self._current = (owner, _next_sequence_nr(), {}, {})

    def _close(self, owner: str | None) -> None:
        if owner is None:
            return
        self._depth -= 1
        if self._depth == 0 and self._current is not None:
            # named now, at the end of the call: what the call was (a dummy pass or not) is known by then
            key, first, fwd, no_grad = self._current
            part = self.label(key)
            if part is not None:
                self.flops[part] = self.flops.get(part, 0.0) + fwd.get("", 0.0)
                self.no_grad[part] = self.no_grad.get(part, 0.0) + no_grad.get("", 0.0)
            self._spans.append((first, _next_sequence_nr(), part))
            self._starts.append(first)
            self._current = None

    def _add(self, n: float) -> None:
        if torch._C._current_autograd_node() is None:  # forward
            if self._current is not None:  # inside an owned call: its part is named when the call ends
                self._current[2][""] = self._current[2].get("", 0.0) + n
                if not torch.is_grad_enabled():
                    self._current[3][""] = self._current[3].get("", 0.0) + n
                return
            self.flops["other"] = self.flops.get("other", 0.0) + n
            return
        seq = torch._C._current_autograd_node()._sequence_nr()
        i = bisect.bisect_right(self._starts, seq) - 1
        part = self._spans[i][2] if i >= 0 and seq < self._spans[i][1] else "other"
        if part is not None:
            self.flops[part] = self.flops.get(part, 0.0) + n

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self._formulas.get(getattr(func, "_overloadpacket", None))
        if formula is not None:
            try:
                n = float(formula(*args, **kwargs, out_val=out))
            except Exception:  # noqa: BLE001 - a formula that cannot read an op's shapes must not stop training
                n = 0.0
            self._add(n)
        return out


# --------------------------------------------------------------------------------------------
# the cost model of the whole model
# --------------------------------------------------------------------------------------------


def input_units(batch: Any) -> int:
    """The size of a collated encoder or decoder batch in the unit its measured FLOPs scale with:
    the elements of its floating-point tensors (pixels x channels, mel bins x frames, audio
    samples; padding included, since it is computed), searched through dicts, lists and tuples."""
    if isinstance(batch, torch.Tensor):
        return batch.numel() if batch.is_floating_point() else 0
    if isinstance(batch, dict):
        return sum(input_units(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(input_units(v) for v in batch)
    return 0


class _EncoderCalls:
    """The encoder calls of one forward, as they happen: each module's forward pre-hook notes the
    modality of the call (OmniModel calls a module once per modality it encodes, in modality
    order, hooks or not), whether it is a dummy pass (its ``dummy_batch`` was just called for it),
    the batch's :func:`input_units` and, for a module with ``flops``, that count."""

    def __init__(self, model: Any):
        self.served: dict[str, list[str]] = {}
        for modality in model.token_ids["encoder"]:
            self.served.setdefault(model.shared[modality][0] if modality in model.shared else modality, []).append(modality)
        self.encoders = dict(model.encoders.items())
        self.real: list[tuple[str, int, float | None]] = []
        """``(part, input units, own flops or None)`` of each call on real items, in call order."""
        self.last: dict[str, str | None] = {}
        """Module key -> the part of its latest call (None: a dummy pass)."""
        self._calls: dict[str, int] = {}
        self._dummy: set[str] = set()
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> _EncoderCalls:
        for key, enc in self.encoders.items():
            self._undo.append(enc.register_forward_pre_hook(functools.partial(self._pre, key)).remove)
            self._undo.append(_wrap_method(enc, "dummy_batch", functools.partial(self._dummy.add, key)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for undo in self._undo:
            undo()

    def _pre(self, key: str, module: Any, args: Any) -> None:
        mods = self.served.get(key, [key])
        i = self._calls.get(key, 0)
        self._calls[key] = i + 1
        if key in self._dummy:
            self._dummy.discard(key)
            self.last[key] = None
            return
        part = f"encoder.{mods[i % len(mods)]}"
        own = getattr(module, "flops", None)
        batch = args[0] if args else None
        self.real.append((part, input_units(batch), float(own(batch)) if own is not None else None))
        self.last[key] = part


def _wrap_method(obj: Any, name: str, before: Callable[[], Any]) -> Callable[[], None]:
    """Run ``before()`` ahead of every call of ``obj.name`` until the returned function undoes it
    (an entry in the object's ``__dict__``, which shadows the class's method)."""
    own = vars(obj)
    had, previous, method = name in own, own.get(name), getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before()
        return method(*args, **kwargs)

    own[name] = wrapped

    def undo() -> None:
        if had:
            own[name] = previous
        else:
            own.pop(name, None)

    return undo


@dataclass
class ModelFlops:
    """FLOPs of each part of an OmniModel per micro-batch, and of one encoder item (what a balancer
    of encoder work asks: :meth:`item_flops`). Build with :func:`model_flops` before sharding.

    Attributes:
        foundation: the foundation's :class:`FlopsModel`.
        per_unit: ``part -> FLOPs per input element`` (:func:`input_units`) of each encoder and
            decoder part measured so far (one whose component has ``flops`` is never measured); for
            a decoder, without its tokenizer's work, which is ``encode_per_unit``.
        encode_per_unit: ``decoder.<m> -> FLOPs per input element`` of the decoder's work done
            without gradients (its tokenizer's ``encode``), which a code-cache hit skips.
    """

    foundation: FlopsModel
    model: Any = field(repr=False, compare=False)
    per_unit: dict[str, float] = field(default_factory=dict)
    encode_per_unit: dict[str, float] = field(default_factory=dict)
    _missed: set[str] = field(default_factory=set, repr=False)

    def parts(self) -> list[str]:
        """``foundation``, ``encoder.<m>`` per encoder modality, ``decoder.<m>`` per decoder."""
        m = self.model
        return [FOUNDATION] + [f"encoder.{x}" for x in m.token_ids["encoder"]] + [f"decoder.{x}" for x in m.decoders]

    def _module(self, part: str) -> Any:
        kind, modality = part.split(".", 1)
        m = self.model
        if kind == "decoder":
            return m.decoders[modality]
        return m.encoders[m.shared[modality][0] if modality in m.shared else modality]

    def _encodes(self, part: str, mb: Any) -> bool:
        """Whether the decoder of ``part`` will run ``encode`` on ``mb``'s targets: not when the
        model's code cache holds them all (:meth:`OmniModel.target_codes`)."""
        modality = part.split(".", 1)[1]
        cache, keys, dec = getattr(self.model, "code_cache", None), mb.decoder_keys.get(modality), self._module(part)
        if cache is None or not keys or not getattr(dec, "fixed_codes", False):
            return True
        return not cache.holds(modality, keys, width=int(getattr(dec, "num_codebooks", 1) or 1))

    def estimate(self, mb: Any) -> dict[str, float]:
        """The FLOPs of the foundation and of each decoder in micro-batch ``mb`` (call it before the
        forward: it asks the code cache) from the formula, the decoders' ``flops`` and the
        measurements so far; a decoder not measured yet whose component has no ``flops`` is left
        out. Encoders are counted at their calls (:meth:`count`): a strategy may encode other
        ranks' items, or none of this rank's."""
        out = {FOUNDATION: self.foundation.step_flops(_sample_lengths(mb))}
        for modality, batch in mb.decoder_inputs.items():
            part = f"decoder.{modality}"
            own = getattr(self._module(part), "flops", None)
            if own is not None:
                out[part] = float(own(batch))
            elif part in self.per_unit:
                encode = self.encode_per_unit.get(part, 0.0) if self._encodes(part, mb) else 0.0
                out[part] = (self.per_unit[part] + encode) * input_units(batch)
        return out

    @contextlib.contextmanager
    def count(self, mb: Any) -> Iterator[dict[str, float]]:
        """Run the forward and backward of ``mb`` inside; the yielded dict then holds the FLOPs of
        each part this rank computed (``foundation`` always). An encoder counts the batches its
        module was called on here (an encoder hook may move items between ranks; dummy passes
        left out); a decoder this micro-batch's targets. A part whose component has no ``flops``
        and that was not measured yet is measured now (:class:`PartCounter`), exactly; the rest
        are estimates."""
        parts = self.estimate(mb)
        decoders = {f"decoder.{m}": b for m, b in mb.decoder_inputs.items()}
        todo = [p for p in decoders if p not in parts]
        expected = {f"encoder.{m}" for m in mb.encoder_inputs} | self._missed
        measure = bool(todo) or any(p not in self.per_unit and getattr(self._module(p), "flops", None) is None for p in expected)
        encodes = {p for p in todo if self._encodes(p, mb)}
        calls = _EncoderCalls(self.model)
        counter = self.counter(mb, calls) if measure else None
        with calls, counter if counter is not None else contextlib.nullcontext():
            yield parts
        if counter is not None:
            for p in todo:
                units = max(input_units(decoders[p]), 1)
                parts[p] = counter.flops.get(p, 0.0)
                encode = counter.no_grad.get(p, 0.0) if p in encodes else 0.0
                self.per_unit[p] = (parts[p] - encode) / units
                if p in encodes:
                    self.encode_per_unit[p] = encode / units
        self._add_encoders(parts, calls, counter)

    def _add_encoders(self, parts: dict[str, float], calls: _EncoderCalls, counter: PartCounter | None) -> None:
        """Add each encoder part's FLOPs of the calls just made (measured ones from ``counter``)."""
        units: dict[str, int] = {}
        for part, n, own in calls.real:
            if own is not None:
                parts[part] = parts.get(part, 0.0) + own
            units[part] = units.get(part, 0) + n
        for part, n in units.items():
            if part in parts:  # the component's own flops
                continue
            if counter is not None and part not in self.per_unit:
                parts[part] = counter.flops.get(part, 0.0)
                self.per_unit[part] = parts[part] / max(n, 1)
                self._missed.discard(part)
            elif part in self.per_unit:
                parts[part] = self.per_unit[part] * n
            else:  # encoded here before it was measured (items moved from other ranks): measured next time
                self._missed.add(part)

    def counter(self, mb: Any, calls: _EncoderCalls | None = None) -> PartCounter:
        """A :class:`PartCounter` for the forward and backward of ``mb``: its ``flops`` are keyed by
        part (``encoder.<m>``, ``decoder.<m>``; ``other`` for the foundation and the losses), dummy
        passes left out. ``calls``: the :class:`_EncoderCalls` open over the same forward (which
        tells each encoder call's modality and whether it is a dummy pass); by default its own."""
        m = self.model
        methods = [(dec, name, f"decoder:{key}") for key, dec in m.decoders.items() for name in _DECODER_METHODS if hasattr(dec, name)]
        own_calls = calls is None
        calls = calls or _EncoderCalls(m)

        def label(owner: str) -> str | None:
            kind, key = owner.split(":", 1)
            if kind == "decoder":
                return f"decoder.{key}" if key in mb.decoder_inputs else None
            return calls.last.get(key)

        counter = PartCounter(self._owners(), label, methods)
        if own_calls:
            counter.nested = calls
        return counter

    def _owners(self) -> dict[int, str]:
        m, owners = self.model, {}
        for kind, table in (("decoder", m.decoders), ("encoder", m.encoders)):
            for key, module in table.items():
                for sub in module.modules():
                    owners.setdefault(id(sub), f"{kind}:{key}")
        return owners

    def item_flops(self, modality: str, features: dict[str, Any]) -> float | None:
        """FLOPs (forward + backward) of one encoder item of ``modality`` (a processor's
        ``preprocess`` output): the module's ``flops`` of a one-item batch, else the measured FLOPs
        per input element x the one-item batch's :func:`input_units`; None before the modality was
        measured (its first micro-batch on this rank)."""
        part = f"encoder.{modality}"
        batch = self.model.encoder_processors()[modality].collate([features])
        own = getattr(self._module(part), "flops", None)
        if own is not None:
            return float(own(batch))
        if part not in self.per_unit:
            return None
        return self.per_unit[part] * input_units(batch)


def _sample_lengths(mb: Any) -> list[int]:
    if mb.cu_seqlens is not None:
        return [int(x) for x in mb.cu_seqlens.diff().tolist()]
    from omnicore.kernels.varlen import cu_seqlens_from_position_ids

    cu, _ = cu_seqlens_from_position_ids(mb.position_ids.detach().cpu())
    return [int(x) for x in cu.diff().tolist()]


def model_flops(model: Any) -> ModelFlops:
    """The :class:`ModelFlops` of an OmniModel, its foundation counted before sharding."""
    return ModelFlops(flops_model(model.lm), model)


# --------------------------------------------------------------------------------------------
# counting without compute: a part of a meta-device model (``omnicore plan``)
# --------------------------------------------------------------------------------------------


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to("meta")
    if isinstance(x, dict):
        return {k: _to_meta(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(v) for v in x)
    return x


@contextlib.contextmanager
def _meta_nonzero() -> Iterator[None]:
    """Let ``nonzero`` (boolean masks) run on meta tensors as if every element were true: a
    component that selects its valid frames by mask still gives shapes (torch's own switch)."""
    import torch.fx.experimental._config as fx_config

    before = getattr(fx_config, "meta_nonzero_assume_all_nonzero", False)
    fx_config.meta_nonzero_assume_all_nonzero = True
    try:
        yield
    finally:
        fx_config.meta_nonzero_assume_all_nonzero = before


def meta_part_flops(model: Any, part: str, batch: Any = None) -> float:
    """FLOPs (forward + backward, as training runs it) of one encoder or decoder part of a
    meta-device OmniModel on a collated ``batch`` (None: the component's dummy item; for a decoder,
    its dummy codes, so without its tokenizer's ``encode``), counted by :func:`flop_counter` on the
    meta device: shapes only, no compute. A component with ``flops`` answers itself.

    Raises:
        Exception: whatever the component raises on meta tensors (an op that needs values, such as
            ``.tolist()``); the caller reports the part as not counted.
    """
    from omnicore.components import EncoderOutput

    kind, modality = part.split(".", 1)
    module = ModelFlops(FlopsModel(0, 0, 0), model)._module(part)
    own = getattr(module, "flops", None)
    if own is not None and batch is not None:
        return float(own(batch))
    with flop_counter() as counter, _meta_nonzero():
        if kind == "encoder":
            out = module(_to_meta(module.dummy_batch() if batch is None else batch))
            rows = [out.embeds, *out.layer_embeds] if isinstance(out, EncoderOutput) else [out]
            loss = sum(r.float().sum() for r in rows)
        else:
            with torch.no_grad():
                codes = _to_meta(module.dummy_codes()) if batch is None else module.encode(_to_meta(batch))
            embeds = module.embed(codes)
            hidden = torch.zeros(embeds.shape, device="meta", requires_grad=True)
            loss = embeds.float().sum() + module.head(hidden).float().sum()
            if int(getattr(module, "num_codebooks", 1) or 1) > 1:
                loss = loss + module.depth_logits(hidden, codes).float().sum()
        if loss.requires_grad:
            loss.backward()
    return float(counter.get_total_flops())
