"""``torch.compile`` as a parallel strategy (``compile``, phase ``compile``): each transformer block
compiled in place (``nn.Module.compile``), as torchtitan compiles per block: every block shares one
compiled graph, and module identity (what FSDP2 and activation checkpointing hook into) is kept.

Configured in ``parallel.strategies`` (``{name: compile, options: {backend: aot_eager}}``). It does
not change the numbers a block computes beyond compiler rounding; tests compare losses and
gradients with the uncompiled model.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from omnicore.components import StrategyPlan
from omnicore.parallel.block import BlockStrategy, module_names


class CompileOptions(BaseModel):
    """Options of ``parallel/compile``."""

    model_config = ConfigDict(extra="forbid")

    backend: str = Field(default="inductor", description="torch.compile backend (inductor; aot_eager and eager for debugging)")
    fullgraph: bool = Field(default=False, description="fail on graph breaks instead of falling back to eager")
    dynamic: bool | None = Field(default=None, description="torch.compile's dynamic shapes (None: automatic, after a shape changes)")


class CompileBlocks(BlockStrategy):
    """The ``compile`` strategy (phase ``compile``): ``torch.compile`` each transformer block."""

    phase = "compile"

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = CompileOptions.model_validate(options or {})

    def apply(self, model: Any, state: Any) -> Any:
        """``torch.compile`` each block in place (``state`` is not read)."""
        o = self.options
        for block in model.blocks():
            block.compile(backend=o.backend, fullgraph=o.fullgraph, dynamic=o.dynamic)
        return model

    def plan(self, model: Any, state: Any, prior: dict[str, Any]) -> Any:
        names = module_names(model)
        blocks = model.blocks()
        return StrategyPlan([names[id(b)] for b in blocks], {}, f"torch.compile ({self.options.backend}) of {len(blocks)} blocks")
