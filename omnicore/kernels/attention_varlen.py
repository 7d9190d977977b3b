"""The ``sdpa_varlen`` attention kernel: packed samples split by their ``position_ids``, no mask.

transformers' ``sdpa`` keeps packed samples apart with a dense block-diagonal causal mask of
``[T, T]`` elements per row (built by ``masking_utils`` from restarting ``position_ids``): memory and
time quadratic in the *row* length even when every sample is short, and on CPU the mask (boolean
plus an additive float copy) is the largest attention term. ``sdpa_varlen`` instead cuts the row
into its samples (the ``cu_seqlens`` built at collate and passed down by OmniModel, the
FlashAttention varlen convention) and runs ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``
on each sample: no mask at all, cost quadratic in the *sample* lengths only. It runs wherever
torch's SDPA does (CPU included).

Many short samples would mean many small calls, so samples are grouped
(:func:`omnicore.kernels.varlen.plan_varlen`): equal lengths share one batched call, and samples
shorter than :data:`PAD_BELOW` tokens are right-padded to a coarse length grid so that similar
lengths share a call too (exact for causal attention: a real query never sees a padded key). The
grouping is computed once per ``position_ids`` tensor and reused by every layer.

Sources: transformers' attention-function interface (``AttentionInterface``,
``integrations/sdpa_attention.py``: q/k/v ``[B, H, T, D]`` in, ``[B, T, H, D]`` out) and mask
interface (``masking_utils.AttentionMaskInterface``); the varlen layout of FlashAttention's
``flash_attn_varlen_func`` (Dao 2023), as used by ``plugins/omnicore-kernels-flash-attn``.
"""

from __future__ import annotations

import weakref
from typing import Any

from omnicore.kernels.varlen import CU_SEQLENS_KWARGS, cu_seqlens_from_position_ids, mark_varlen, plan_varlen

IMPLEMENTATION = "sdpa_varlen"
"""The name registered in transformers' ``AttentionInterface`` and ``AttentionMaskInterface``."""

PAD_BELOW = 512
"""Samples shorter than this are right-padded to a length grid (at most 25% longer) so that they
share batched calls; longer ones run at their exact length (padding would cost more compute than
the call it saves)."""

_cache: dict[str, Any] = {}


def _plan(kwargs: dict[str, Any], b: int, t: int, device: Any, causal: bool) -> Any:
    """The :class:`~omnicore.kernels.varlen.VarlenPlan` of a ``[B, T]`` batch, from the attention
    function's keyword arguments: the ``cu_seqlens`` OmniModel passes (built once, at collate;
    :data:`~omnicore.kernels.varlen.CU_SEQLENS_KWARGS`), else the ``position_ids`` (restarting at 0
    per sample), else one sample per row. Cached for the last tensor seen: every layer of a forward
    gets the same one.

    Raises:
        ValueError: the boundaries do not cover the ``B * T`` rows.
    """
    import torch

    src = kwargs.get(CU_SEQLENS_KWARGS[0])
    from_cu = src is not None
    if src is None:
        src = kwargs.get("position_ids")
    key = (b, t, str(device), causal, from_cu, None if src is None else src._version)
    ref = _cache.get("ref")
    if src is not None and ref is not None and ref() is src and _cache.get("key") == key:
        return _cache["plan"]
    if src is None:
        cu = torch.arange(0, b * t + 1, t, dtype=torch.int32)
    elif from_cu:
        cu = src.detach().cpu()
        if int(cu[-1]) != b * t:
            raise ValueError(f"{IMPLEMENTATION}: cu_seqlens ends at {int(cu[-1])}, expected B*T = {b * t} rows")
    else:
        if src.numel() != b * t:
            raise ValueError(f"{IMPLEMENTATION}: position_ids has {src.numel()} elements, expected [B, T] = [{b}, {t}]")
        cu, _ = cu_seqlens_from_position_ids(src.detach().reshape(b, t).cpu())
    plan = plan_varlen(cu, pad=causal, pad_below=PAD_BELOW, device=device)
    if src is not None:
        _cache.update(ref=weakref.ref(src), key=key, plan=plan)
    return plan


def _decode_attention(query: Any, key: Any, value: Any, scaling: float | None, dropout: float, causal: bool) -> Any:
    """Queries shorter than keys (generation with a KV cache): one sample per row, the queries being
    the *last* ``Tq`` positions (causal aligned bottom-right). ``[B, Tq, H, D]``."""
    import torch
    import torch.nn.functional as F

    tq, tk = query.shape[2], key.shape[2]
    mask = None
    if causal and tq > 1:
        mask = torch.ones(tq, tk, dtype=torch.bool, device=query.device).tril(tk - tq)
    gqa = query.shape[1] != key.shape[1]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous()


def sdpa_varlen_attention_forward(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None, dropout: float = 0.0, **kwargs: Any
) -> tuple[Any, None]:
    """transformers attention function.

    Args:
        module: the attention module (its ``is_causal``, default True, is honoured).
        query: ``[B, Hq, T, D]``; key, value: ``[B, Hkv, T, D]`` with ``Hq % Hkv == 0`` (GQA through
            SDPA's ``enable_gqa``, no copies of the KV heads).
        attention_mask: ignored (the mask function returns None); samples come from
            ``kwargs["cu_seq_lens_q"]`` (int32 ``[n+1]``, passed by OmniModel from collate), else
            ``kwargs["position_ids"]`` (``[B, T]``, restarting at 0 at each sample start), else one
            sample per row.
        scaling: the softmax scale (None: ``1/sqrt(D)``); dropout: attention dropout probability
            (transformers passes 0.0 outside training).

    Returns:
        ``(out [B, T, Hq, D], None)``. With a KV cache (``Tq < Tk``) the queries are the last
        positions of one sample per row.
    """
    import torch
    import torch.nn.functional as F

    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError(f"{IMPLEMENTATION}: sliding-window attention layers are not supported")
    if kwargs.get("softcap") is not None:
        raise NotImplementedError(f"{IMPLEMENTATION}: logit soft-capping is not supported")
    causal = bool(getattr(module, "is_causal", True))
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    if key.shape[2] != t:
        return _decode_attention(query, key, value, scaling, dropout, causal), None
    plan = _plan(kwargs, b, t, query.device, causal)
    # [B, H, T, D] -> [B*T, H, D]: a view when the projections were laid out as [B, T, H, D]
    q = query.transpose(1, 2).reshape(b * t, hq, d)
    k = key.transpose(1, 2).reshape(b * t, hkv, d)
    v = value.transpose(1, 2).reshape(b * t, hkv, value.shape[-1])
    pieces = []
    for g in plan.groups:
        if g.index is None:
            rows = slice(g.start, g.start + g.n * g.length)
            qg, kg, vg = (x[rows].view(g.n, g.length, *x.shape[1:]) for x in (q, k, v))
        else:
            qg, kg, vg = q[g.index], k[g.index], v[g.index]  # [n, L, H, D]
        o = F.scaled_dot_product_attention(
            qg.transpose(1, 2),
            kg.transpose(1, 2),
            vg.transpose(1, 2),
            dropout_p=dropout,
            is_causal=causal,
            scale=scaling,
            enable_gqa=hq != hkv,
        )  # [n, H, L, D]
        o = o.transpose(1, 2).reshape(g.n * g.length, hq, o.shape[-1])
        pieces.append(o if g.keep is None else o[g.keep])
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    if plan.inverse is not None:
        out = out[plan.inverse]
    return out.view(b, t, hq, out.shape[-1]), None


def _eager_only(fn: Any) -> Any:
    """``torch.compiler.disable(fn)``: the sample grouping is data-dependent Python (lengths read on
    the host, a plan cached per ``position_ids`` tensor), which a compiled block must not trace or
    bake in; compiled blocks call the attention eagerly (a graph break), as for a custom kernel."""
    import torch

    return torch.compiler.disable(fn)


sdpa_varlen_attention_forward = mark_varlen(_eager_only(sdpa_varlen_attention_forward))


def no_mask(*args: Any, **kwargs: Any) -> None:
    """Mask function: none is needed (samples are split by their ``position_ids``)."""
    return None


def register() -> None:
    """Register :data:`IMPLEMENTATION` in transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, sdpa_varlen_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, no_mask)


class SDPAVarlenAttention:
    """The ``sdpa_varlen`` kernel (op ``attention``): see the module docstring. Pure PyTorch."""

    op = "attention"
    implementation = IMPLEMENTATION

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    def available(self) -> tuple[bool, str]:
        return True, "pure PyTorch (scaled_dot_product_attention per sample); runs on CPU and GPU"

    def activate(self, model: Any) -> None:
        """Register the function and switch ``model`` (a transformers model) to it."""
        register()
        model.set_attn_implementation(IMPLEMENTATION)
