"""The base of strategies that change each transformer block in place and use no mesh dim
(activation checkpointing, compile)."""

from __future__ import annotations

from typing import Any


def module_names(model: Any) -> dict[int, str]:
    """``id(module) -> qualified name`` for every module of ``model`` (the root is ``""``)."""
    return {id(m): n for n, m in model.named_modules()}


class BlockStrategy:
    """A strategy over ``model.blocks()`` that needs no mesh dim: :meth:`apply` and
    :meth:`apply_with_state` both change the blocks in place; nothing to validate."""

    mesh_dims: tuple[str, ...] = ()
    phase = "sharding"

    def apply_with_state(self, model: Any, state: Any) -> Any:
        raise NotImplementedError

    def apply(self, model: Any, mesh: Any) -> Any:
        return self.apply_with_state(model, None)

    def validate(self, model_or_config: Any, state: Any) -> list[Any]:
        return []
