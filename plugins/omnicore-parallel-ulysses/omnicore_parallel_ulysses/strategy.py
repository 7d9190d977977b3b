"""The parallel strategies ``ulysses`` and ``async_ulysses``.

``apply(model, state)``:

1. finds the sequence-parallel group: ``state.mesh``'s ``sp`` dim when the mesh has one, otherwise groups
   of ``options.sp`` consecutive ranks built from the world (default: every rank in one group);
2. checks the foundation's heads against it (q heads divisible by ``sp``; KV heads divisible by
   ``sp``, or ``sp`` divisible by the KV heads, which are then replicated);
3. stores an :class:`~omnicore_parallel_ulysses.attention.SPState` on each foundation attention
   module and switches the foundation to the registered attention function (``async_ulysses`` also
   binds an overlapping forward to those modules); encoders keep their own attention. When the
   foundation's attention kernel was a varlen one (``model.kernels.attention: sdpa_varlen`` or
   ``flash_attn``), it stays the core that runs on the full sequence (no ``[T, T]`` mask);
4. registers a sequence hook on the :class:`~omnicore.model.omni.OmniModel`: after the media
   embeddings are merged, the row is padded to a multiple of ``sp`` (padding is a sample of its own
   with ``-100`` labels) and each rank keeps its contiguous slice of every per-token tensor (with an
   mRoPE foundation also the 3-D ``rope_position_ids``, cut like ``position_ids``); the global 1-D
   position_ids go down to the attention function;
5. averages the gradients of parameters that no FSDP2 wraps (plain tensors, not DTensors) over all
   ranks, so that Ulysses alone gives the one-process gradient; with FSDP2, shard over
   ``dp_shard x sp`` and FSDP2 does the averaging.

The training loop reads the data split from :meth:`Ulysses.data_split`: the ranks of one SP group
read the same micro-batches.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class UlyssesOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sp: int | None = Field(
        default=None, gt=0, description="sequence-parallel size; default: the mesh's sp dim, or every rank when the mesh has none"
    )
    reduce_gradients: bool = Field(
        default=True,
        description="average gradients of parameters not sharded by FSDP2 over all ranks (turn off when another wrapper does it)",
    )


class Ulysses:
    """Ulysses sequence parallelism (Jacobs et al. 2023) over the ``sp`` group; see the module docstring."""

    mesh_dims: tuple[str, ...] = ("sp",)
    phase = "attention"  # omnicore.parallel.parallelize: before checkpointing, compile and FSDP2
    asynchronous = False

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = UlyssesOptions.model_validate(options or {})
        self.state: Any = None
        self._data: tuple[int, int] | None = None

    # ---- groups ----------------------------------------------------------------------------------

    def _group(self, mesh: Any) -> tuple[Any, list[int]]:
        import torch.distributed as dist

        names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
        if "sp" in names:
            group = mesh.get_group("sp")
            ranks = dist.get_process_group_ranks(group)
            if self.options.sp is not None and self.options.sp != len(ranks):
                raise ValueError(f"ulysses: options.sp={self.options.sp} but the mesh's sp dim has {len(ranks)} ranks")
            return group, ranks
        # No sp dim in the mesh: consecutive ranks of the world form the SP groups.
        world, rank = dist.get_world_size(), dist.get_rank()
        sp = self.options.sp or world
        if world % sp:
            raise ValueError(f"ulysses: sp={sp} does not divide the world size {world}; choose sp among the divisors of {world}")
        mine = None
        for start in range(0, world, sp):
            ranks = list(range(start, start + sp))
            g = dist.new_group(ranks)  # every rank creates every group, in the same order
            if rank in ranks:
                mine = (g, ranks)
        assert mine is not None
        return mine

    @staticmethod
    def check_heads(config: Any, sp: int) -> None:
        """Raise ``ValueError`` naming what to change when the heads do not fit ``sp``."""
        heads = config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        if heads % sp:
            raise ValueError(f"ulysses: num_attention_heads={heads} is not divisible by sp={sp}; choose sp among the divisors of {heads}")
        if kv % sp and sp % kv:
            raise ValueError(f"ulysses: num_key_value_heads={kv} and sp={sp}: one must divide the other (KV heads are split or replicated)")

    # ---- apply -----------------------------------------------------------------------------------

    def apply(self, model: Any, state: Any) -> Any:
        """Shard the sequence over the sp group of ``state.mesh`` (module docstring); the model as
        it is on one process or with an sp group of one rank."""
        import torch.distributed as dist

        from omnicore_parallel_ulysses.attention import (
            ATTN_IMPLEMENTATION,
            ATTN_IMPLEMENTATION_VARLEN,
            SPState,
            attention_modules,
            inner_attention,
            install_async,
            register_attention,
        )

        if not (dist.is_available() and dist.is_initialized()):
            return model  # one process: nothing to split
        group, ranks = self._group(getattr(state, "mesh", None))
        mins: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(mins, min(ranks))
        groups = sorted(set(mins))
        self._data = (groups.index(min(ranks)), len(groups))
        sp = len(ranks)
        if sp == 1:
            return model
        self.check_heads(model.lm.config.get_text_config(), sp)
        modules = attention_modules(model.lm)
        if not modules:
            raise ValueError(
                f"ulysses: found no attention modules (with q_proj, k_proj, v_proj, o_proj, head_dim) in {type(model.lm).__name__}"
            )
        self.state = SPState(group, sp, dist.get_rank(group), inner_attention(model.lm))
        register_attention()
        model.lm.set_attn_implementation(ATTN_IMPLEMENTATION_VARLEN if self.state.inner is not None else ATTN_IMPLEMENTATION)
        for m in modules:
            m.omnicore_ulysses = self.state
            if self.asynchronous:
                install_async(m)
        model.register_sequence_hook(SequenceShard(self.state, self.options.reduce_gradients))
        return model

    def data_split(self, state: Any) -> tuple[int, int]:
        """``(index, count)`` of this rank's data group: the ranks of one SP group read the same data
        (before ``apply``, from the state alone: the mesh's data-parallel rank and size)."""
        return self._data if self._data is not None else (state.dp_rank, state.dp_size)


class AsyncUlysses(Ulysses):
    """Async-Ulysses: the all-to-alls of q and k overlap the k and v projections; same numbers."""

    asynchronous = True


class SequenceShard:
    """The OmniModel sequence hook: pad the merged row to a multiple of ``sp`` and keep this rank's
    contiguous slice; passes the global position_ids down to the attention function.

    With an mRoPE foundation ``seq`` also holds ``rope_position_ids`` ``[3, 1, T]`` (time, height and
    width rows): they are padded and cut along the sequence exactly as ``position_ids``, so each
    rank rotates its own tokens by their own 3-D positions. The 1-D ``position_ids`` row, not the
    3-D rows, is what goes down as the global positions: it restarts per packed sample and so
    keeps the samples apart in the attention on the full sequence (the 3-D rows of an image do not
    continue by one).

    Encoder rows for the foundation's intermediate layers (``seq["layer_rows"]``, Qwen3-VL's
    DeepStack) are cut alike: each rank keeps its part of the mask and the rows of those positions
    (:func:`layer_rows_part`), and the model's ``layer_kwargs`` rebuilds the foundation's keyword
    arguments from them; the foundation adds them to its own slice of the hidden states."""

    def __init__(self, state: Any, reduce_gradients: bool):
        self.state = state
        self.reduce_gradients = reduce_gradients
        self._hooked = False

    def __call__(self, model: Any, seq: dict[str, Any]) -> dict[str, Any]:
        from omnicore_parallel_ulysses.attention import POSITION_IDS_KWARG

        if seq.get("layer_inputs") and seq.get("layer_rows") is None:
            raise NotImplementedError(
                f"ulysses cannot slice the foundation's layer inputs {list(seq['layer_inputs'])} (encoder rows added to "
                "intermediate layers, e.g. Qwen3-VL's DeepStack): the sequence holds no layer_rows to cut them from; "
                "train this model without sequence parallelism (parallel.sp: 1)"
            )
        if self.reduce_gradients and not self._hooked:
            self._hook_gradients(model)
        sp, r = self.state.size, self.state.rank
        seq = pad_row(seq, sp)
        n = seq["position_ids"].shape[-1] // sp
        part = slice(r * n, (r + 1) * n)
        out = {
            "inputs_embeds": seq["inputs_embeds"][:, part],
            "position_ids": seq["position_ids"][:, part],
            "labels": seq["labels"][:, part],
            "decoder_labels": {m: x[:, part] for m, x in seq["decoder_labels"].items()},
            "cu_seqlens": seq.get("cu_seqlens"),
            "max_seqlen": seq.get("max_seqlen"),
            "foundation_kwargs": {**seq["foundation_kwargs"], POSITION_IDS_KWARG: seq["position_ids"]},
        }
        if seq.get("rope_position_ids") is not None:  # mRoPE: [3, 1, T], cut along the sequence
            out["rope_position_ids"] = seq["rope_position_ids"][..., part]
        if seq.get("layer_inputs"):  # DeepStack-like rows: this rank's positions and their rows
            rows = layer_rows_part(seq["layer_rows"], seq["position_ids"].shape[-1], part)
            out["foundation_kwargs"].update(model.layer_kwargs(rows))
            out["layer_inputs"], out["layer_rows"] = seq["layer_inputs"], rows
        return out

    def _hook_gradients(self, model: Any) -> None:
        """Average each plain (non-FSDP) parameter's gradient over all ranks as autograd produces it
        (before accumulation, so gradient accumulation stays right). Registered at the first
        forward, after every strategy has been applied.

        Parameters inside a ``fully_shard``-ed module are FSDP2's to reduce, even those that are
        plain tensors right now: this hook runs inside the root's forward, when FSDP2 has already
        swapped the root group's DTensor shards for unsharded plain parameters (hooking those would
        all-reduce the embeddings and LM head twice per step)."""
        import torch.distributed as dist
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        managed = {id(p) for m in model.modules() if isinstance(m, FSDPModule) for p in m.parameters()}

        world = dist.get_world_size()

        def average(grad):
            grad = grad.contiguous()
            dist.all_reduce(grad)
            return grad / world

        for p in model.parameters():
            if p.requires_grad and not isinstance(p, DTensor) and id(p) not in managed:
                p.register_hook(average)
        self._hooked = True


def layer_rows_part(rows: Any, length: int, part: slice) -> Any:
    """This rank's part of the encoders' rows for the foundation's intermediate layers
    (``seq["layer_rows"]``: ``mask`` bool ``[1, T]``, ``per_layer`` ``[mask.sum(), H]`` each, rows
    in sequence order): the mask padded with False to the padded row's ``length`` and cut to
    ``part``, and the rows of the positions it keeps (those between the marked positions before
    ``part`` and the ones in it)."""
    import dataclasses

    import torch.nn.functional as F

    mask = F.pad(rows.mask, (0, length - rows.mask.shape[-1]), value=False)
    local = mask[..., part]
    first = int(mask[..., : part.start].sum())
    n = int(local.sum())
    return dataclasses.replace(rows, mask=local, per_layer=[r[first : first + n] for r in rows.per_layer])


def pad_row(seq: dict[str, Any], sp: int) -> dict[str, Any]:
    """``seq`` (an OmniModel sequence dict, the whole row ``[1, T]``) padded at the end to a multiple
    of ``sp``. The padding is a sample of its own: positions restart at 0 (on every axis of
    ``rope_position_ids`` ``[3, 1, T]`` too, the text layout), labels are ``-100``, and
    ``cu_seqlens`` gain it as one more sample so they keep describing the whole padded row.
    Returns ``seq`` itself when no padding is needed."""
    import torch
    import torch.nn.functional as F

    from omnicore.api import IGNORE_INDEX

    pos = seq["position_ids"]
    pad = -pos.shape[-1] % sp
    if not pad:
        return seq
    fill = torch.arange(pad, device=pos.device, dtype=pos.dtype)
    out = dict(seq)
    out["inputs_embeds"] = F.pad(seq["inputs_embeds"], (0, 0, 0, pad))
    out["position_ids"] = torch.cat([pos, fill.expand(pos.shape[0], pad)], dim=1)
    out["labels"] = F.pad(seq["labels"], (0, pad), value=IGNORE_INDEX)
    # [1, T] codes, or [1, T, K] for a decoder with K codebooks per frame: padded along T either way
    out["decoder_labels"] = {m: F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad), value=IGNORE_INDEX) for m, x in seq["decoder_labels"].items()}
    rope = seq.get("rope_position_ids")
    if rope is not None:
        out["rope_position_ids"] = torch.cat([rope, fill.to(rope.device).expand(*rope.shape[:-1], pad)], dim=-1)
    cu = seq.get("cu_seqlens")
    if cu is not None:
        out["cu_seqlens"] = torch.cat([cu, cu[-1:] + pad])
        out["max_seqlen"] = max(seq.get("max_seqlen") or 0, pad)
    return out
