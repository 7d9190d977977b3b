"""Ulysses attention (Jacobs et al. 2023, "DeepSpeed Ulysses"), installed through transformers'
attention-function registry: no edits to model code.

Each rank holds a contiguous slice of the (padded) sequence. Around the attention core, q, k and v
``[B, heads, T/sp, D]`` are exchanged by all-to-all into ``[B, heads/sp, T, D]`` (the full sequence
for a slice of the heads), attention runs on the full sequence, and the output goes back the same
way. Packed samples are kept apart by the *global* position_ids, which the sequence hook passes
down as the keyword argument :data:`POSITION_IDS_KWARG`; transformers forwards it from the
foundation's ``forward`` to the attention function. The core on the full sequence is the
foundation's own attention kernel when that is a *varlen* one (``sdpa_varlen``, ``flash_attn``:
marked by :func:`omnicore.kernels.varlen.mark_varlen`), called with the global position_ids as its
``position_ids`` and no mask; otherwise sdpa with a dense packed causal mask built from them.

With an mRoPE foundation (Qwen2-VL and kin: ``position_ids`` ``[4, B, T]``) the global positions
passed down are the 1-D row, which restarts per packed sample; the 3-D rows (time, height, width)
only rotate q and k, which each rank does on its own slice before the all-to-all (the sequence hook
cuts them like the 1-D row). An image's 3-D rows do not continue by one, so they could not give the
sample boundaries.

State is per module: the sequence-parallel group lives on each foundation attention module
(``module.omnicore_ulysses``, an :class:`SPState`). Modules without it (encoders) or calls without
the global position_ids (generation) run stock sdpa.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange

from omnicore_parallel_ulysses.comm import all_to_all, start_all_to_all

ATTN_IMPLEMENTATION = "omnicore_ulysses"
ATTN_IMPLEMENTATION_VARLEN = "omnicore_ulysses_varlen"
"""The same function under a name whose mask function builds no mask: used when the core is a
varlen kernel, so that the foundation does not build an unused ``[T/sp, T/sp]`` mask per forward."""
POSITION_IDS_KWARG = "ulysses_position_ids"


@dataclass
class SPState:
    """The sequence-parallel group of one attention module: its process group, size and this rank."""

    group: Any
    size: int
    rank: int
    inner: Any = None
    """The varlen attention function that runs on the full sequence (None: sdpa with a dense mask)."""

    def to_heads(self, x: torch.Tensor, pending: Any = None) -> torch.Tensor:
        """``[B, h, T/sp, D]`` -> ``[B, h/sp, T, D]``."""
        return all_to_all(x, self.group, 1, 2, pending)

    def to_sequence(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, h/sp, T, D]`` -> ``[B, h, T/sp, D]``."""
        return all_to_all(x, self.group, 2, 1)

    def expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """GQA with fewer KV heads than ranks: repeat each KV head ``sp / kv`` times so every rank
        gets one (a q head ``h`` keeps its KV head ``h // (H / kv)``)."""
        kv = x.shape[1]
        if kv % self.size == 0:
            return x
        return x.repeat_interleave(self.size // kv, dim=1)


def packed_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, 1, T, T]``: causal within each packed sample (a sample starts wherever
    position_ids do not continue by one, as in transformers' ``find_packed_sequence_indices``)."""
    first = position_ids[:, :1] - 1
    sample = (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
    t = position_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    return ((sample[:, :, None] == sample[:, None, :]) & causal).unsqueeze(1)


def inner_attention(lm: Any) -> Any:
    """The varlen attention function of ``lm``'s current attention implementation, or None when it
    is not a varlen one (sdpa, eager, ...). Read before Ulysses switches ``lm`` to its own."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from omnicore.api import is_varlen

    fn = ALL_ATTENTION_FUNCTIONS.get(getattr(lm.config, "_attn_implementation", None) or "")
    return fn if is_varlen(fn) else None


def core_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    position_ids: torch.Tensor,
    dropout: float,
    scaling: float | None,
    module: Any = None,
    inner: Any = None,
    varlen: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Attention on head-sharded, full-sequence q ``[B, h/sp, T, D]`` and k/v ``[B, kv/sp, T, D]``
    (``position_ids``: the global ``[B, T]``); returns ``[B, h/sp, T, D]``. With ``inner`` (a varlen
    attention function) that function does it, given the global position_ids, the whole row's
    ``cu_seqlens`` keyword arguments (``varlen``, from OmniModel through transformers) and no mask;
    else sdpa with a dense packed causal mask, KV heads repeated for the local q heads."""
    if inner is not None:
        out, _ = inner(module, q, k, v, None, dropout=dropout, scaling=scaling, position_ids=position_ids, **(varlen or {}))
        return rearrange(out, "b t h d -> b h t d")
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    mask = packed_causal_mask(position_ids)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)


def ulysses_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
):
    """The registered attention function (transformers' signature): returns ``([B, T/sp, H, D], None)``."""
    position_ids = kwargs.pop(POSITION_IDS_KWARG, None)
    state = getattr(module, "omnicore_ulysses", None)
    if state is None or position_ids is None:
        if state is not None and state.inner is not None:  # no Ulysses here (generation): the varlen kernel alone
            return state.inner(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("ulysses: sliding-window attention layers are not supported")
    q = state.to_heads(query)
    k = state.to_heads(state.expand_kv(key))
    v = state.to_heads(state.expand_kv(value))
    out = core_attention(q, k, v, position_ids, dropout, scaling, module, state.inner, varlen_kwargs(kwargs))
    return rearrange(state.to_sequence(out), "b h t d -> b t h d").contiguous(), None


def varlen_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The whole row's ``cu_seqlens`` keyword arguments among an attention call's ``kwargs``."""
    from omnicore.api import CU_SEQLENS_KWARGS

    return {k: kwargs[k] for k in CU_SEQLENS_KWARGS if kwargs.get(k) is not None}


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """Mask function of :data:`ATTN_IMPLEMENTATION_VARLEN`: the varlen core needs none."""
    return None


def register_attention() -> None:
    """Register the attention function under :data:`ATTN_IMPLEMENTATION` with stock sdpa's mask
    function (so that a call without Ulysses, such as generation, gets the usual mask), and under
    :data:`ATTN_IMPLEMENTATION_VARLEN` with none. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, ulysses_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    AttentionInterface.register(ATTN_IMPLEMENTATION_VARLEN, ulysses_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION_VARLEN, _no_mask)


# ---- Async-Ulysses: the all-to-alls overlap the projections --------------------------------------


def _project(module: Any, name: str, norm: str, hidden_states: torch.Tensor) -> torch.Tensor:
    """``[B, T/sp, H]`` hidden states through projection ``name`` to heads ``[B, heads, T/sp, D]``
    (the module's per-head ``norm`` applied first, when it has one)."""
    x = rearrange(getattr(module, name)(hidden_states), "b t (h d) -> b t h d", d=module.head_dim)
    n = getattr(module, norm, None)  # Qwen3-style per-head q_norm / k_norm
    return rearrange(n(x) if n is not None else x, "b t h d -> b h t d")


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Heads ``[B, heads, T/sp, D]`` back to the hidden layout ``[B, T/sp, heads * D]`` that the
    output projection takes (contiguous)."""
    return rearrange(x, "b h t d -> b t (h d)").contiguous()


def async_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: Any = None,
    *args: Any,
    **kwargs: Any,
):
    """A foundation attention module's forward (bound per instance) that starts the all-to-all of
    q while k and v are projected, and that of k while v is projected; the numbers are those of
    :func:`ulysses_attention`. Without the global position_ids it runs the module's own forward."""
    position_ids = kwargs.get(POSITION_IDS_KWARG)
    state: SPState = self.omnicore_ulysses
    if position_ids is None:
        if args:  # a positional call: the order of Qwen2/Llama-style attention modules
            return type(self).forward(self, hidden_states, position_embeddings, attention_mask, *args, **kwargs)
        # by name: modules order their parameters differently (Qwen2-VL: attention_mask, position_ids, ...)
        return type(self).forward(
            self, hidden_states=hidden_states, position_embeddings=position_embeddings, attention_mask=attention_mask, **kwargs
        )
    if getattr(self, "sliding_window", None) is not None:
        raise NotImplementedError("async_ulysses: sliding-window attention layers are not supported")
    rope = sys.modules[type(self).__module__].apply_rotary_pos_emb
    cos, sin = position_embeddings
    q = rope(*(2 * (_project(self, "q_proj", "q_norm", hidden_states),)), cos, sin)[0]
    q_pending = start_all_to_all(q, state.group, 1, 2, async_op=True)  # runs during the k and v projections
    k = state.expand_kv(rope(*(2 * (_project(self, "k_proj", "k_norm", hidden_states),)), cos, sin)[0])
    k_pending = start_all_to_all(k, state.group, 1, 2, async_op=True)  # runs during the v projection
    v = state.expand_kv(_project(self, "v_proj", "v_norm", hidden_states))
    v_pending = start_all_to_all(v, state.group, 1, 2, async_op=True)
    qh, kh, vh = state.to_heads(q, q_pending), state.to_heads(k, k_pending), state.to_heads(v, v_pending)
    dropout = 0.0 if not self.training else getattr(self, "attention_dropout", 0.0)
    out = core_attention(qh, kh, vh, position_ids, dropout, self.scaling, self, state.inner, varlen_kwargs(kwargs))
    out = _merge_heads(state.to_sequence(out))
    return self.o_proj(out), None


def install_async(module: Any) -> None:
    """Bind :func:`async_attention_forward` as this module's forward (the class is untouched)."""
    module.forward = MethodType(async_attention_forward, module)


def attention_modules(lm: Any) -> list[Any]:
    """The foundation's self-attention modules: those with q/k/v/o projections and a head_dim."""
    need = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")
    return [m for m in lm.modules() if all(hasattr(m, a) for a in need)]
