"""The base of strategies that change each transformer block in place and use no mesh dim
(activation checkpointing, compile)."""

from __future__ import annotations

from typing import Any


def module_names(model: Any) -> dict[int, str]:
    """``id(module) -> qualified name`` for every module of ``model`` (the root is ``""``)."""
    return {id(m): n for n, m in model.named_modules()}


class BlockStrategy:
    """A strategy over ``model.blocks()`` that needs no mesh dim: :meth:`apply` changes the blocks
    in place (``state`` may be None); nothing to validate.

    Its phase is ``checkpointing`` unless a subclass declares another (``compile`` does): a block
    change must come before the ``sharding`` phase, whose ``fully_shard`` registers its hooks on
    the blocks as they finally run (:mod:`omnicore.parallel.parallelize`). A subclass that changes
    what a block computes (an attention wrapper) declares ``attention``; one that also shards in
    its own ``apply`` declares ``sharding``, since its last step must come last.
    """

    mesh_dims: tuple[str, ...] = ()
    phase = "checkpointing"

    def apply(self, model: Any, state: Any) -> Any:
        """Change ``model.blocks()`` in place and return the model.

        Raises:
            NotImplementedError: in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement apply(model, state)")

    def validate(self, model_or_config: Any, state: Any) -> list[Any]:
        return []
