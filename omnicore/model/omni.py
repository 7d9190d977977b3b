"""OmniModel: encoders -> foundation -> decoders, as pure computation (no distribution inside).

Encoder outputs are scattered into the foundation's input embeddings at their placeholder positions
(``masked_scatter``); decoder targets become codes whose embeddings fill the ``<|m_out|>`` positions
(teacher forcing). The loss is the sum of the text cross-entropy over ``labels`` and, per decoder, the
cross-entropy of the codebook logits at the position before each code; the training loop divides it
by the global number of targets.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnicore.data.chat import IGNORE_INDEX
from omnicore.data.packing import MicroBatch
from omnicore.data.positions import RopeLayout, rope_layout
from omnicore.kernels.varlen import CU_SEQLENS_KWARGS, cu_seqlens_from_position_ids
from omnicore.model.code_cache import CodeCache


@functools.cache
def _codebooks(decoder: Any) -> int:
    """``K``, a decoder's codes per frame (its optional ``num_codebooks``; 1 without it)."""
    return int(getattr(decoder, "num_codebooks", 1) or 1)


def _default_cross_entropy() -> Any:
    """The one shared ``torch_cross_entropy`` instance (stateless), not a new one per forward."""
    from omnicore.kernels.cross_entropy import TorchCrossEntropy

    return TorchCrossEntropy()


def _lora_head_weight(head: nn.Module) -> torch.Tensor | None:
    """:func:`omnicore.model.lora.head_weight`: the weight of an LM head that carries a LoRA adapter."""
    from omnicore.model.lora import head_weight

    return head_weight(head)


def _in_dtype_of(module: nn.Module, batch: Any) -> Any:
    """``batch`` (a dict of features) with its floating-point tensors cast to the dtype of
    ``module``'s parameters, when those are not float32 (a component loaded in bfloat16 gets
    bfloat16 features; processors make float32 ones). Anything else is returned as it is."""
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    if dtype == torch.float32 or not isinstance(batch, dict):
        return batch
    return {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in batch.items()}


@dataclass
class LayerRows:
    """Encoder rows for the foundation's intermediate layers, gathered over every encoder modality
    that gave some (:class:`~omnicore.components.EncoderOutput`), as transformers'
    ``Qwen3VLModel.forward`` joins its image and video DeepStack features.

    Attributes:
        mask: bool ``[B, T]``, the placeholder positions of those modalities.
        per_layer: one ``[n, H]`` per layer (``n = mask.sum()``), rows in sequence order
            (row-major over ``mask``).
    """

    mask: torch.Tensor
    per_layer: list[torch.Tensor]


def _rows(out: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """An encoder's output as ``(embeds [N, H], layer rows)``: a plain tensor has no layer rows."""
    from omnicore.components import EncoderOutput

    if isinstance(out, EncoderOutput):
        return out.embeds, list(out.layer_embeds)
    return out, []


def _join_layers(layered: list[tuple[torch.Tensor, list[torch.Tensor]]], where: str) -> LayerRows | None:
    """One :class:`LayerRows` from each modality's ``(mask [B, T], rows per layer)``: per layer, the
    modalities' rows put at their positions among the union of the masks."""
    if not layered:
        return None
    depths = {len(rows) for _, rows in layered}
    if len(depths) != 1:
        raise PlaceholderMismatch(f"encoders gave rows for different numbers of foundation layers {sorted(depths)}{where}")
    if len(layered) == 1:
        return LayerRows(layered[0][0], layered[0][1])
    union = functools.reduce(torch.logical_or, [mask for mask, _ in layered])
    per_layer = []
    for k in range(depths.pop()):
        joint = layered[0][1][k].new_zeros(int(union.sum()), layered[0][1][k].shape[-1])
        for mask, rows in layered:
            joint = joint.masked_scatter(mask[union].unsqueeze(-1), rows[k])
        per_layer.append(joint)
    return LayerRows(union, per_layer)


def media_spans(input_ids: torch.Tensor, placeholders: dict[str, int]) -> dict[str, torch.Tensor]:
    """The media spans of each modality in ``input_ids`` ``[B, T]``: modality -> LongTensor ``[B, T]``
    holding, on each placeholder token (id ``placeholders[modality]``), the index of its run of
    consecutive placeholders of that modality along the row (0, 1, ...: one medium's tokens), and -1
    elsewhere (transformers' ``block_sequence_ids`` convention). See
    :meth:`omnicore.components.FoundationOptional.media_span_inputs`."""
    out: dict[str, torch.Tensor] = {}
    for m, token in placeholders.items():
        mask = input_ids == token
        starts = mask & ~F.pad(mask, (1, 0))[..., :-1]
        out[m] = torch.where(mask, starts.long().cumsum(-1) - 1, -1)
    return out


class PlaceholderMismatch(ValueError):
    """The number of placeholder tokens does not match the encoder/decoder output for a micro-batch."""


@dataclass
class ModelOutput:
    """Sums, not means: ``loss_sum`` (scalar fp32) = ``text_loss_sum`` + sum of ``decoder_loss_sums``;
    ``n_targets`` counts the targets behind them. ``logits`` (``[1, T, V]``) only when asked.

    ``decoder_loss_sums`` and ``decoder_targets`` are keyed by decoder modality (its codes, or for
    a decoder with ``K > 1`` codebooks per frame its codebook 0) and, for such a decoder, also by
    ``"<modality>.depth"`` (the depth decoder's codebooks ``1..K-1``, ``K - 1`` targets a frame)."""

    loss_sum: torch.Tensor
    n_targets: int
    text_loss_sum: torch.Tensor
    decoder_loss_sums: dict[str, torch.Tensor]
    logits: torch.Tensor | None = None
    decoder_targets: dict[str, int] | None = None


class OmniModel(nn.Module):
    """The assembled model. Build it with :func:`omnicore.model.build.build_omni_model`.

    Args:
        lm: a transformers causal LM (``PreTrainedModel``).
        encoders: modality -> encoder module (:class:`omnicore.components.Encoder`).
        decoders: modality -> decoder module (:class:`omnicore.components.Decoder`).
        token_ids: ``{"encoder": {m: id}, "decoder": {m: id}, "decoder_start": {m: id}}``.
    """

    cross_entropy: Any = None
    """The text loss kernel (op ``cross_entropy``, :meth:`linear_cross_entropy_sum`); None:
    ``torch_cross_entropy``. :func:`~omnicore.model.build.build_omni_model` sets it from config."""

    layer_inputs: Any = None
    """The foundation's ``layer_inputs(mask, per_layer) -> dict`` (``FoundationOptional``): how
    encoder rows for its intermediate layers (:class:`~omnicore.components.EncoderOutput`) reach
    its forward; None: the foundation takes none. Set by
    :func:`~omnicore.model.build.build_omni_model`."""

    media_span_inputs: Any = None
    """The foundation's ``media_span_inputs(config, spans, position_ids, inputs_embeds, ...) -> dict``
    (``FoundationOptional``): its attention masks for attention that is bidirectional within each
    medium's placeholders (:meth:`span_kwargs`); None: plain causal attention. Set by
    :func:`~omnicore.model.build.build_omni_model`."""

    def __init__(
        self,
        lm: nn.Module,
        encoders: dict[str, nn.Module],
        decoders: dict[str, nn.Module],
        token_ids: dict[str, dict[str, int]],
        *,
        shared: dict[str, tuple[str, Any]] | None = None,
    ):
        super().__init__()
        self.lm = lm
        self.encoders = nn.ModuleDict(encoders)
        self.decoders = nn.ModuleDict(decoders)
        self.token_ids = token_ids
        self.shared: dict[str, tuple[str, Any]] = dict(shared or {})
        """Encoder modalities without a module of their own (``model.encoders.<m>.share``): modality
        -> ``(key of the module that encodes it, its own processor)``. That module lists the
        modality in its ``modalities`` and takes the processor's collated batches."""
        for m, (key, _) in self.shared.items():
            if key not in self.encoders:
                raise ValueError(f"encoder modality {m!r} shares the module of {key!r}, which is not an encoder here")
            served = getattr(self.encoders[key], "modalities", ())
            if m not in served:
                raise ValueError(
                    f"model.encoders.{m}.share: {key}: the {key} encoder ({type(self.encoders[key]).__name__}) does not encode {m} "
                    f"(its modalities: {tuple(served) or (key,)}); share only with an encoder that lists {m!r} in its modalities"
                )
        self._sequence_hooks: OrderedDict[int, Any] = OrderedDict()
        self._encoder_hooks: OrderedDict[int, Any] = OrderedDict()
        self.part_names: dict[str, list[str]] = {}
        """A published family's part name -> module prefixes (``Foundation.part_names``), which
        ``train.freeze`` and ``train.lr_multipliers`` accept; empty for other foundations."""
        self.pending_loads: list[Any] = []  # parameters on meta still to be read (omnicore.model.loading.fill_pending)
        self.code_cache: CodeCache | None = None
        """Decoder target codes kept across steps (:mod:`omnicore.model.code_cache`), used for the
        decoders whose ``fixed_codes`` is true; None: every target is encoded each time. The training
        loop sets it from ``train.code_cache_mb``."""
        config = getattr(lm, "config", None)
        self.rope: RopeLayout | None = rope_layout(config) if config is not None else None
        """The foundation's multi-dimensional rotary layout (mRoPE), or None for 1-D positions."""

    def register_sequence_hook(self, hook: Any) -> Any:
        """Call ``hook(model, seq) -> seq`` in :meth:`forward` after the media embeddings are merged
        and before the foundation runs: the sharding point of sequence parallelism.

        The contract is :meth:`omnicore.components.ParallelModel.register_sequence_hook` (what
        ``seq`` holds: ``inputs_embeds``, ``position_ids``, ``labels``, ``decoder_labels``,
        ``cu_seqlens``, ``max_seqlen``, ``foundation_kwargs``, ``layer_inputs``, ``layer_rows``,
        and ``rope_position_ids`` for an mRoPE foundation). Returns a handle whose ``remove()``
        unregisters the hook.
        """
        from torch.utils.hooks import RemovableHandle

        handle = RemovableHandle(self._sequence_hooks)
        self._sequence_hooks[handle.id] = hook
        return handle

    def register_encoder_hook(self, hook: Any) -> Any:
        """Call ``hook(model, call) -> output`` instead of the encoder module each time
        :meth:`embed_inputs` encodes a modality, with ``call`` an
        :class:`~omnicore.components.EncoderCall`: where a strategy moves encoder work between
        ranks. The contract is :meth:`omnicore.components.ParallelModel.register_encoder_hook`.
        Returns a handle whose ``remove()`` unregisters the hook.
        """
        from torch.utils.hooks import RemovableHandle

        handle = RemovableHandle(self._encoder_hooks)
        self._encoder_hooks[handle.id] = hook
        return handle

    def _encode(self, modality: str, enc: nn.Module, batch: Any, device: torch.device) -> Any:
        """``enc``'s output for ``batch`` (None: its dummy batch), through the encoder hooks."""
        from omnicore.components import EncoderCall

        def dummy_batch() -> Any:
            # the dummy input is data preparation (feature extractors, numpy): never under autocast
            with torch.autocast(device.type, enabled=False):
                return enc.dummy_batch()

        hooks = list(self._encoder_hooks.values())
        processor = self.shared[modality][1] if modality in self.shared else getattr(enc, "processor", None)

        def run(i: int, b: Any) -> Any:
            if i < len(hooks):
                return hooks[i](self, EncoderCall(modality, enc, processor, b, functools.partial(run, i + 1), dummy_batch))
            return enc(_in_dtype_of(enc, b if b is not None else dummy_batch()))

        return run(0, batch)

    def encoder_processors(self) -> dict[str, Any]:
        """``modality -> processor`` of every encoder modality, shared ones included: each module's
        ``processor`` (:func:`omnicore.data.chat.module_processors`), then each shared modality's own.

        Raises:
            TypeError: an encoder module has no ``processor`` attribute.
        """
        from omnicore.data.chat import module_processors

        out = module_processors(self.encoders, "encoder")
        out.update({m: proc for m, (_, proc) in self.shared.items()})
        return {m: out[m] for m in self.token_ids["encoder"] if m in out}

    def blocks(self) -> list[nn.Module]:
        """The foundation's repeated transformer blocks (the FSDP2 / checkpointing unit)."""
        names = set(getattr(self.lm, "_no_split_modules", None) or [])
        # the MRO, so blocks are still found after FSDP2 swapped in its FSDP<Block> subclass
        return [m for m in self.lm.modules() if any(c.__name__ in names for c in type(m).__mro__)]

    # ---- embedding ---------------------------------------------------------------------------

    def embed(
        self,
        input_ids: torch.Tensor,
        encoder_inputs: dict[str, Any],
        decoder_inputs: dict[str, Any],
        wheres: list[str] | None = None,
        decoder_keys: dict[str, list[tuple[str | None, int]]] | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """Input embeddings ``[1, T, H]`` with media merged in: the first three results of
        :meth:`embed_inputs` (which also gives the encoders' layer rows)."""
        return self.embed_inputs(input_ids, encoder_inputs, decoder_inputs, wheres, decoder_keys)[:3]

    def embed_inputs(
        self,
        input_ids: torch.Tensor,
        encoder_inputs: dict[str, Any],
        decoder_inputs: dict[str, Any],
        wheres: list[str] | None = None,
        decoder_keys: dict[str, list[tuple[str | None, int]]] | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, LayerRows | None]:
        """Input embeddings ``[1, T, H]`` with media merged in.

        Returns ``(embeds, codes, dummy, layers)``: the decoder codes per modality (LongTensor
        ``[N_m]``), a zero-valued scalar that ties the dummy passes of absent modalities into the
        graph, and the encoders' rows for the foundation's intermediate layers (:class:`LayerRows`;
        None when no encoder of this batch returned any, see
        :class:`~omnicore.components.EncoderOutput`). ``decoder_keys``: per modality,
        ``(digest, num_codes)`` of each target (:attr:`~omnicore.data.packing.MicroBatch.decoder_keys`),
        for :attr:`code_cache`.

        Raises:
            PlaceholderMismatch: when placeholder counts differ from what the components produce,
                or encoders give layer rows for different numbers of layers.
        """
        embeds = self.lm.get_input_embeddings()(input_ids)
        dummy = embeds.new_zeros(())
        where = f" (samples: {', '.join(wheres[:4])}{', ...' if wheres and len(wheres) > 4 else ''})" if wheres else ""
        layered: list[tuple[torch.Tensor, list[torch.Tensor]]] = []  # (placeholder mask, rows per layer) per modality
        # Every rank calls every encoder module the same number of times, in the same order (module
        # order, then modality order): once per modality it encodes, on the real inputs or on its
        # dummy batch. FSDP2 all-gathers on each call, so ranks whose micro-batches hold other
        # modalities must still issue the same collectives in the same sequence. Encoder hooks
        # (register_encoder_hook) run at each call on every rank alike, batch or not.
        for key, enc in self.encoders.items():
            for m in self.token_ids["encoder"]:
                if (self.shared[m][0] if m in self.shared else m) != key:
                    continue
                if m in encoder_inputs:
                    mask = input_ids == self.token_ids["encoder"][m]
                    out, rows = _rows(self._encode(m, enc, encoder_inputs[m], input_ids.device))
                    n = int(mask.sum())
                    if out.shape[0] != n:
                        raise PlaceholderMismatch(f"{m} encoder produced {out.shape[0]} embeddings for {n} placeholders{where}")
                    if any(r.shape[0] != n for r in rows):
                        got = [r.shape[0] for r in rows]
                        raise PlaceholderMismatch(f"{m} encoder produced {got} layer rows for {n} placeholders{where}")
                    embeds = embeds.masked_scatter(mask.unsqueeze(-1), out.to(embeds.dtype))
                    if rows:
                        layered.append((mask, [r.to(embeds.dtype) for r in rows]))
                else:  # no input for this modality: a dummy pass keeps the parameters in the graph
                    out, rows = _rows(self._encode(m, enc, None, input_ids.device))
                    dummy = dummy + 0.0 * sum((r.sum() for r in rows), out.sum())
        codes: dict[str, torch.Tensor] = {}
        for m, dec in self.decoders.items():
            mask = input_ids == self.token_ids["decoder"][m]
            if m in decoder_inputs:
                c = self.target_codes(m, decoder_inputs[m], (decoder_keys or {}).get(m), input_ids.device)
                if c.shape[0] != int(mask.sum()):
                    raise PlaceholderMismatch(f"{m} decoder produced {c.shape[0]} codes for {int(mask.sum())} placeholders{where}")
                embeds = embeds.masked_scatter(mask.unsqueeze(-1), dec.embed(c).to(embeds.dtype))
                codes[m] = c
            else:
                with torch.autocast(input_ids.device.type, enabled=False):
                    c = dec.dummy_codes().to(input_ids.device)
                h = dec.embed(c)
                dummy = dummy + 0.0 * dec.head(h).sum()
                depth = getattr(dec, "depth_decoder", None) if _codebooks(dec) > 1 else None
                if depth is not None:  # its parameters, at no forward's cost: each gets a zero gradient, as a dummy pass gives
                    dummy = dummy + 0.0 * sum((p.sum() for p in depth.parameters() if p.requires_grad), h.new_zeros(()))
        return embeds, codes, dummy, _join_layers(layered, where)

    def loss_parts(self) -> list[str]:
        """The names of the loss's parts, sorted, as metrics rows carry them (``loss/<part>``):
        ``"text"``, ``"decoder.<m>"`` per decoder and ``"decoder.<m>.depth"`` per decoder with
        ``K > 1`` codebooks per frame (its depth decoder's codebooks, :class:`ModelOutput`)."""
        parts = {"text", *(f"decoder.{m}" for m in self.decoders)}
        parts |= {f"decoder.{m}.depth" for m, dec in self.decoders.items() if _codebooks(dec) > 1}
        return sorted(parts)

    def layer_kwargs(self, layers: LayerRows | None) -> dict[str, Any]:
        """The foundation's keyword arguments for ``layers`` (:meth:`embed_inputs`): ``{}`` for
        None, else what the foundation's ``layer_inputs`` makes of them.

        Raises:
            ValueError: an encoder gave layer rows but the foundation has no ``layer_inputs``.
        """
        if layers is None:
            return {}
        if self.layer_inputs is None:
            raise ValueError(
                f"an encoder returned rows for {len(layers.per_layer)} foundation layers (EncoderOutput.layer_embeds), but the "
                "foundation takes none (it has no layer_inputs); use the foundation of the same published family"
            )
        return dict(self.layer_inputs(layers.mask, layers.per_layer))

    def span_kwargs(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, embeds: torch.Tensor, attention_mask: Any = None, cache: Any = None
    ) -> dict[str, Any]:
        """The foundation's keyword arguments for the media spans of ``input_ids`` ``[B, T]``
        (:func:`media_spans` of every encoder placeholder, given to :attr:`media_span_inputs` with
        the LM's config): ``{}`` when the foundation has none. ``attention_mask`` (``[B, T]``
        padding) and ``cache``: a generation prefill's; None for a packed training row."""
        if self.media_span_inputs is None:
            return {}
        spans = media_spans(input_ids, self.token_ids["encoder"])
        return dict(self.media_span_inputs(self.lm.config, spans, position_ids, embeds, attention_mask=attention_mask, cache=cache))

    def target_codes(self, modality: str, inputs: Any, keys: list[tuple[str | None, int]] | None, device: Any) -> torch.Tensor:
        """The codes of one modality's collated targets: LongTensor ``[sum of num_codes]`` on
        ``device``, from :attr:`code_cache` when every target is in it, else ``Decoder.encode`` (its
        codes then kept per target). The cache is used only with ``keys`` and a decoder whose
        ``fixed_codes`` is true."""
        dec = self.decoders[modality]
        cache = self.code_cache if keys and getattr(dec, "fixed_codes", False) else None
        if cache is not None:
            hit = cache.lookup(modality, keys, device, width=_codebooks(dec))  # type: ignore[arg-type]
            if hit is not None:
                return hit
        codes = dec.encode(_in_dtype_of(dec, inputs)).to(device)
        if cache is not None:
            cache.store(modality, keys, codes)  # type: ignore[arg-type]
        return codes

    # ---- forward -----------------------------------------------------------------------------

    def forward(self, batch: MicroBatch, *, return_logits: bool = False) -> ModelOutput:
        """Summed losses of one packed micro-batch: ``model(mb)``, ``mb`` from
        :func:`~omnicore.data.packing.collate` or built by hand (``input_ids``, ``labels`` and
        ``position_ids`` alone will do), its tensors on the model's device.

        ``cu_seqlens`` (None: computed from ``position_ids``) and ``max_seqlen`` reach the
        foundation as transformers' varlen keyword arguments
        (:data:`omnicore.kernels.varlen.CU_SEQLENS_KWARGS`), so varlen attention kernels never
        rebuild them per layer. An mRoPE foundation (:attr:`rope`) gets ``[4, 1, T]`` positions:
        ``position_ids`` first (the 1-D row that keeps packed samples apart, transformers' packed
        Qwen2-VL convention), then ``rope_position_ids`` (None: ``position_ids`` on every axis).
        A foundation with :attr:`media_span_inputs` gets the row's attention masks from it
        (:meth:`span_kwargs`: bidirectional within each medium's placeholders); they cover the whole
        row, so a sequence hook must leave the row whole (sequence parallelism is refused).
        ``decoder_keys`` feed :attr:`code_cache`. ``n_targets`` is the training loop's: the model
        counts its own targets (:attr:`ModelOutput.n_targets`).

        Args:
            batch: a :class:`~omnicore.data.packing.MicroBatch` (its fields' shapes are there).
            return_logits: also return the whole ``[1, T, V]`` fp32 logits (eval).

        Raises:
            PlaceholderMismatch: see :meth:`embed`.
        """
        input_ids, labels, position_ids = batch.input_ids, batch.labels, batch.position_ids
        cu_seqlens, max_seqlen = batch.cu_seqlens, batch.max_seqlen
        if cu_seqlens is None:
            cu_seqlens, max_seqlen = cu_seqlens_from_position_ids(position_ids.detach().cpu())
        elif max_seqlen is None:
            max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        embeds, codes, dummy, layers = self.embed_inputs(
            input_ids, batch.encoder_inputs, batch.decoder_inputs, batch.wheres, batch.decoder_keys
        )
        layer_kwargs = self.layer_kwargs(layers)
        span_kwargs = self.span_kwargs(input_ids, position_ids, embeds)
        seq: dict[str, Any] = {
            "inputs_embeds": embeds,
            "position_ids": position_ids,
            "labels": labels,
            "decoder_labels": self.decoder_labels(input_ids, codes),
            "cu_seqlens": cu_seqlens.to(position_ids.device),
            "max_seqlen": max_seqlen,
            "foundation_kwargs": {**layer_kwargs, **span_kwargs},
            "layer_inputs": tuple(layer_kwargs),
            "layer_rows": layers,
        }
        if self.rope is not None:
            rope = batch.rope_position_ids
            seq["rope_position_ids"] = rope if rope is not None else position_ids.expand(3, -1, -1)
        for hook in list(self._sequence_hooks.values()):
            seq = hook(self, seq)
        if span_kwargs and seq["inputs_embeds"].shape[1] != embeds.shape[1]:
            raise ValueError(
                f"the foundation attends bidirectionally within media spans, through masks over the whole row "
                f"({', '.join(span_kwargs)}), but a sequence hook cut the row to {seq['inputs_embeds'].shape[1]} of "
                f"{embeds.shape[1]} tokens; sequence parallelism cannot carry them: train this model with parallel.sp: 1"
            )
        # No attention mask (unless the foundation's media spans gave one): transformers builds a
        # block-diagonal causal mask from position_ids for dense kernels; varlen kernels take the
        # samples' boundaries from these keyword arguments.
        cu, max_len = seq.get("cu_seqlens"), seq.get("max_seqlen")
        varlen = dict(zip(CU_SEQLENS_KWARGS, (cu, cu, max_len, max_len))) if cu is not None else {}
        hidden = self.lm.base_model(
            inputs_embeds=seq["inputs_embeds"],
            position_ids=self.foundation_positions(seq),
            use_cache=False,
            **varlen,
            **seq["foundation_kwargs"],
        ).last_hidden_state
        return self.losses(hidden, seq["labels"], seq["decoder_labels"], dummy, return_logits)

    def foundation_positions(self, seq: dict[str, Any]) -> torch.Tensor:
        """The ``position_ids`` the foundation takes: ``seq["position_ids"]`` (``[B, T]``), or for an
        mRoPE foundation ``[4, B, T]``: that row, then ``seq["rope_position_ids"]`` (``[3, B, T]``).

        Raises:
            ValueError: a sequence hook dropped ``rope_position_ids`` or changed ``position_ids`` but
                not them (it must cut both alike along the sequence).
        """
        pos = seq["position_ids"]
        if self.rope is None:
            return pos
        rope = seq.get("rope_position_ids")
        if rope is None or rope.shape[1:] != pos.shape:
            raise ValueError(
                f"rope_position_ids {None if rope is None else tuple(rope.shape)} do not match position_ids {tuple(pos.shape)}: an mRoPE "
                "foundation needs every sequence hook (sequence parallelism) to pass seq['rope_position_ids'] on, cut along its "
                "last dim as seq['position_ids'] is"
            )
        return torch.cat([pos.unsqueeze(0), rope.to(pos.device)], dim=0)

    def decoder_labels(self, input_ids: torch.Tensor, codes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per decoder modality, ``[1, T]``: the code that each position's hidden state predicts (the
        position *before* each code placeholder), ``-100`` elsewhere; ``[1, T, K]`` (the frame's
        ``K`` codes) for a decoder with ``K > 1`` codebooks per frame."""
        out: dict[str, torch.Tensor] = {}
        for m, c in codes.items():
            mask = input_ids == self.token_ids["decoder"][m]
            pred = torch.zeros_like(mask)
            pred[:, :-1] = mask[:, 1:]
            if c.dim() == 2:  # [N, K]: every codebook of the frame at the predicting position
                full = torch.full((*input_ids.shape, c.shape[1]), IGNORE_INDEX, dtype=c.dtype, device=c.device)
                out[m] = full.masked_scatter(pred.unsqueeze(-1), c)
            else:
                out[m] = torch.full_like(input_ids, IGNORE_INDEX).masked_scatter(pred, c)
        return out

    def losses(
        self, hidden: torch.Tensor, labels: torch.Tensor, dec_labels: dict[str, torch.Tensor], dummy: torch.Tensor, return_logits: bool
    ) -> ModelOutput:
        """Summed text and decoder losses from the final hidden states ``[1, T, H]`` (this rank's
        part of the row under sequence parallelism)."""
        head = self.lm.get_output_embeddings()
        logits = None
        # a LoRA adapter on lm_head is part of the weight the kernel gets (head.weight alone is PEFT's base weight)
        weight = _lora_head_weight(head) if hasattr(head, "lora_A") else head.weight
        if return_logits or weight is None:  # eval: the whole logits, and the plain loss from them (= torch_cross_entropy)
            full = head(hidden).float()
            text_sum = F.cross_entropy(full.view(-1, full.shape[-1]), labels.view(-1), ignore_index=IGNORE_INDEX, reduction="sum")
            logits = full if return_logits else None
        else:  # the cross_entropy kernel (model.kernels.cross_entropy): lm_head and loss together
            ce = self.cross_entropy if self.cross_entropy is not None else _default_cross_entropy()
            flat = hidden.reshape(-1, hidden.shape[-1])
            text_sum = ce.linear_cross_entropy_sum(
                flat, weight, labels.reshape(-1), ignore_index=IGNORE_INDEX, bias=getattr(head, "bias", None)
            )
        n = int((labels != IGNORE_INDEX).sum())
        dec_sums: dict[str, torch.Tensor] = {}
        dec_counts: dict[str, int] = {}
        for m, lab in dec_labels.items():
            dec = self.decoders[m]
            frames = lab if lab.dim() == 2 else lab[..., 0]
            sel = frames != IGNORE_INDEX
            h, target = hidden[sel], lab[sel]  # [N, H]; [N] or [N, K]
            dec_logits = dec.head(h).float()
            dec_sums[m] = F.cross_entropy(dec_logits, target if target.dim() == 1 else target[:, 0], reduction="sum")
            dec_counts[m] = int(sel.sum())
            n += dec_counts[m]
            if target.dim() == 2:  # codebooks 1..K-1 from the depth decoder: their own part, "<m>.depth"
                depth = dec.depth_logits(h, target).float()
                dec_sums[f"{m}.depth"] = F.cross_entropy(depth.reshape(-1, depth.shape[-1]), target[:, 1:].reshape(-1), reduction="sum")
                dec_counts[f"{m}.depth"] = target[:, 1:].numel()
                n += dec_counts[f"{m}.depth"]
        loss = text_sum + sum(dec_sums.values(), torch.zeros((), device=text_sum.device)) + dummy.float()
        return ModelOutput(loss, n, text_sum.detach(), {k: v.detach() for k, v in dec_sums.items()}, logits, dec_counts)
