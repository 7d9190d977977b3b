"""Activation checkpointing as a parallel strategy (``activation_checkpointing``, phase
``checkpointing``): recompute activations in backward instead of keeping them, per transformer
block. Modes (torchtitan's ``activation_checkpoint`` options):

- ``full``: every block keeps only its input; everything inside is recomputed.
- ``selective``: every ``every``-th block is checkpointed in full, the others keep everything.
- ``op``: selective activation checkpointing per operator (PyTorch's
  ``torch.utils.checkpoint.create_selective_checkpoint_contexts``): the outputs of matrix
  multiplications and attention are saved, cheap elementwise and normalisation ops are recomputed.

Configured in ``parallel.strategies`` (``{name: activation_checkpointing, options: {mode: op}}``).
It does not change the numbers a block computes: checkpointing recomputes the same ops (dropout RNG
state is restored by ``torch.utils.checkpoint``), and tests compare losses and gradients with the
unwrapped model.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from omnicore.components import StrategyPlan
from omnicore.parallel.block import BlockStrategy, module_names


class ActivationCheckpointingOptions(BaseModel):
    """Options of ``parallel/activation_checkpointing``."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["full", "selective", "op"] = Field(
        default="full", description="full: every block; selective: every N-th block; op: save matmul/attention outputs, recompute the rest"
    )
    every: int = Field(default=2, gt=0, description="selective mode: checkpoint every N-th block (1 = all of them)")


def _save_compute_heavy_ops() -> set[Any]:
    """The aten ops whose outputs ``op`` mode keeps: matmuls and fused attention (torchtitan keeps
    the same set in its selective op policy)."""
    import torch

    aten = torch.ops.aten
    names = [
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_scaled_mm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_fused_attention_overrideable",
    ]
    ops = set()
    for n in names:
        packet = getattr(aten, n, None)
        if packet is not None:
            ops.add(packet.default)
    return ops


def _op_policy(ops: set[Any]):
    from torch.utils.checkpoint import CheckpointPolicy

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return CheckpointPolicy.MUST_SAVE if op in ops else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


CHECKPOINT_MODES: tuple[str, ...] = ("full", "op")
"""The modes of :func:`checkpoint_module` (``selective`` is the strategy's choice of blocks, each of
them then checkpointed ``full``)."""


def checkpoint_module(module: Any, mode: str = "full") -> None:
    """Make ``module``'s forward run under non-reentrant ``torch.utils.checkpoint`` (in place; the
    module keeps its class, hooks and parameters, so FSDP2 wraps it as before).

    Args:
        module: an ``nn.Module`` (a transformer block).
        mode: ``full`` (save only the inputs) or ``op`` (save matmul/attention outputs too).

    Raises:
        ValueError: ``mode`` is not one of :data:`CHECKPOINT_MODES` (checked before the module is
            touched, so a typo cannot silently checkpoint in another mode).
    """
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint_module: mode {mode!r} is not one of {', '.join(map(repr, CHECKPOINT_MODES))}")
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    inner = module.forward
    if mode == "op":
        ops = _save_compute_heavy_ops()
        context_fn = functools.partial(create_selective_checkpoint_contexts, _op_policy(ops))
    else:
        context_fn = None

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not module.training or not _grad_enabled():
            return inner(*args, **kwargs)
        extra = {"context_fn": context_fn} if context_fn is not None else {}
        return checkpoint(inner, *args, use_reentrant=False, **extra, **kwargs)

    module.forward = forward
    module._omnicore_checkpointed = mode


def _grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()


class ActivationCheckpointing(BlockStrategy):
    """The ``activation_checkpointing`` strategy (phase ``checkpointing``; uses no mesh dim)."""

    phase = "checkpointing"

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = ActivationCheckpointingOptions.model_validate(options or {})

    def chosen(self, model: Any) -> list[Any]:
        """The blocks this mode checkpoints (all of them, or every ``every``-th from the first)."""
        blocks = model.blocks()
        if self.options.mode == "selective":
            return [b for i, b in enumerate(blocks) if i % self.options.every == 0]
        return blocks

    def apply(self, model: Any, state: Any) -> Any:
        """Checkpoint each chosen block in place (``state`` is not read)."""
        mode = "op" if self.options.mode == "op" else "full"
        for block in self.chosen(model):
            checkpoint_module(block, mode)
        return model

    def plan(self, model: Any, state: Any, prior: dict[str, Any]) -> Any:
        names = module_names(model)
        chosen = self.chosen(model)
        o = self.options
        what = {"full": "every block", "op": "every block, saving matmul/attention outputs", "selective": f"one block in every {o.every}"}[
            o.mode
        ]
        return StrategyPlan(
            [names[id(b)] for b in chosen],
            {},
            f"activation checkpointing ({o.mode}): {len(chosen)} block{'s' if len(chosen) != 1 else ''}, {what}",
        )
