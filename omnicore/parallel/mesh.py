"""The parallel layout: named mesh dims, their sizes, and which ranks form which groups.

One DeviceMesh holds every rank with four named dims, outermost first::

    dp_replicate x dp_shard x ep x sp          (their product is the world size)

* ``dp_replicate``: HSDP replicas (parameters replicated; gradients all-reduced across them).
* ``dp_shard``: FSDP shards (parameters sharded; gradients reduce-scattered).
* ``ep``: expert parallelism. Expert weights are split ``Shard(0)`` over ``ep``; everything else
  treats ``ep`` as one more data-parallel dim (each ep rank reads its own samples and dispatches
  their tokens to the experts' owners by all-to-all).
* ``sp``: (Ulysses) sequence parallelism, innermost so that an sp group is a run of consecutive
  ranks (one node, the fastest links for its all-to-alls). Ranks that differ only in ``sp`` read the
  *same* samples and each handle a slice of the sequence.

Derived (flattened) dims, built once at start-up so that every strategy sees the same groups:

* ``dp`` = dp_replicate x dp_shard x ep: the data-parallel dim. The data loader shards samples by
  :attr:`MeshLayout.dp_rank` / ``dp_size``; counts of targets and tokens are summed over it.
* ``fsdp`` = dp_shard x ep x sp: the shard dim of FSDP2 for dense (non-expert) parameters. Every rank
  of a replica holds a different shard; gradients of ranks that differ in sp or ep (different tokens
  of the same or other samples) are reduced together. HSDP is the 2-D mesh ``(dp_replicate, fsdp)``.
* ``dp_shard_sp`` = dp_shard x sp: the FSDP2 shard dim of expert parameters (already split over
  ``ep``); HSDP for experts is ``(dp_replicate, dp_shard_sp)``.

This module is pure Python (no torch): ``omnicore plan`` uses :class:`MeshLayout` to print groups
and check sizes without starting processes; :mod:`omnicore.parallel.state` builds the real
DeviceMesh from the same layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MESH_DIMS: tuple[str, ...] = ("dp_replicate", "dp_shard", "ep", "sp")
"""The real mesh dims, outermost first (the DeviceMesh's ``mesh_dim_names``)."""

FLAT_DIMS: dict[str, tuple[str, ...]] = {
    "dp": ("dp_replicate", "dp_shard", "ep"),
    "fsdp": ("dp_shard", "ep", "sp"),
    "dp_shard_sp": ("dp_shard", "sp"),
}
"""Derived dims: name -> the real dims it spans (in mesh order)."""


class MeshError(ValueError):
    """The ``parallel`` sizes do not fit the world size; the message names the field and the fix."""


@dataclass(frozen=True)
class MeshLayout:
    """Sizes of the named dims (resolved, no -1) over ``world_size`` ranks, and rank arithmetic.

    A rank's coordinate in dim ``d`` follows row-major order over :data:`MESH_DIMS` (the order
    ``init_device_mesh`` uses), so the groups computed here are exactly the DeviceMesh's.
    """

    world_size: int
    sizes: dict[str, int]

    @classmethod
    def from_config(cls, parallel: Any, world_size: int) -> MeshLayout:
        """Resolve ``parallel.{dp_replicate, dp_shard, ep, sp}`` (one of them may be -1: the rest).

        ``parallel`` is an :class:`omnicore.config.ParallelConfig` or a dict with those keys.

        Raises:
            MeshError: a size is 0 or below -1, more than one is -1, or the sizes do not multiply to
                ``world_size``; the message names the ``parallel.*`` field and what to set it to.
        """
        get = parallel.get if isinstance(parallel, dict) else (lambda k, d: getattr(parallel, k, d))
        raw = {d: int(get(d, -1 if d == "dp_shard" else 1)) for d in MESH_DIMS}
        errors = layout_errors(raw, world_size)
        if errors:
            raise MeshError("; ".join(f"{f}: {m}" for f, m in errors))
        fill = [d for d, v in raw.items() if v == -1]
        if fill:
            known = math.prod(v for v in raw.values() if v != -1)
            raw[fill[0]] = world_size // known
        return cls(world_size, raw)

    @classmethod
    def data_parallel(cls, world_size: int) -> MeshLayout:
        """Every rank in ``dp_shard`` (plain FSDP2): the layout when the config says nothing."""
        return cls(world_size, {"dp_replicate": 1, "dp_shard": world_size, "ep": 1, "sp": 1})

    # ---- sizes --------------------------------------------------------------------------------

    def size(self, dim: str) -> int:
        """Number of ranks in one group of ``dim`` (a real or a derived dim)."""
        return math.prod(self.sizes[d] for d in self._parts(dim))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[d] for d in MESH_DIMS)

    @property
    def dp_size(self) -> int:
        """How many different data shards a step reads (ranks that differ only in sp share one)."""
        return self.size("dp")

    # ---- rank arithmetic ------------------------------------------------------------------------

    def coordinate(self, rank: int) -> dict[str, int]:
        """``rank``'s index in each real dim."""
        out: dict[str, int] = {}
        rest = rank
        for d in reversed(MESH_DIMS):
            out[d] = rest % self.sizes[d]
            rest //= self.sizes[d]
        return dict((d, out[d]) for d in MESH_DIMS)

    def rank_of(self, coord: dict[str, int]) -> int:
        r = 0
        for d in MESH_DIMS:
            r = r * self.sizes[d] + coord.get(d, 0)
        return r

    def rank_in(self, dim: str, rank: int) -> int:
        """``rank``'s index within its group of ``dim`` (row-major over the dims a derived dim spans)."""
        c = self.coordinate(rank)
        r = 0
        for d in self._parts(dim):
            r = r * self.sizes[d] + c[d]
        return r

    def dp_rank(self, rank: int) -> int:
        """The data shard ``rank`` reads (the same for ranks that differ only in sp)."""
        return self.rank_in("dp", rank)

    def group_of(self, dim: str, rank: int) -> list[int]:
        """The ranks in ``rank``'s group of ``dim``, ordered by their index in that group."""
        parts = self._parts(dim)
        base = self.coordinate(rank)
        ranks = []
        for i in range(self.size(dim)):
            c = dict(base)
            rest = i
            for d in reversed(parts):
                c[d] = rest % self.sizes[d]
                rest //= self.sizes[d]
            ranks.append(self.rank_of(c))
        return ranks

    def groups(self, dim: str) -> list[list[int]]:
        """Every group of ``dim`` (each a list of ranks), in order of their first rank."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world_size):
            seen.setdefault(tuple(self.group_of(dim, r)), None)
        return [list(g) for g in seen]

    def describe(self) -> str:
        """``dp_replicate=2 x dp_shard=2 x ep=1 x sp=1 (world 4)``."""
        return " x ".join(f"{d}={self.sizes[d]}" for d in MESH_DIMS) + f" (world {self.world_size})"

    @staticmethod
    def _parts(dim: str) -> tuple[str, ...]:
        if dim in MESH_DIMS:
            return (dim,)
        if dim in FLAT_DIMS:
            return FLAT_DIMS[dim]
        raise KeyError(f"unknown mesh dim {dim!r}; dims are {', '.join(MESH_DIMS + tuple(FLAT_DIMS))}")


def layout_errors(raw: dict[str, int], world_size: int) -> list[tuple[str, str]]:
    """Every problem with the sizes ``raw`` (dim -> size, -1 = the rest) for ``world_size`` ranks,
    as ``(config field, what is wrong and what to change)``. Empty when they fit."""
    errors = []
    for d, v in raw.items():
        if v == 0 or v < -1:
            errors.append((f"parallel.{d}", f"is {v}; a size must be a positive integer, or -1 for the rest of the world size"))
    fill = [d for d, v in raw.items() if v == -1]
    if len(fill) > 1:
        errors.append(
            (
                "parallel",
                f"{', '.join('parallel.' + d for d in fill)} are all -1; only one dim can take the rest of the world size, set the others to numbers",
            )
        )
    if errors:
        return errors
    known = math.prod(v for v in raw.values() if v != -1)
    sizes = ", ".join(f"{d}={v}" for d, v in raw.items() if v != -1)
    if fill:
        if world_size % known:
            errors.append(
                (
                    f"parallel.{fill[0]}",
                    f"is -1 (the rest) but the world size {world_size} is not divisible by {sizes} (product {known}); "
                    f"use a world size that is a multiple of {known} or make the fixed sizes divide {world_size}",
                )
            )
    elif known != world_size:
        dims = "parallel.dp_replicate x parallel.dp_shard x parallel.ep x parallel.sp"
        hint = ""
        other = math.prod(v for d, v in raw.items() if d != "dp_shard")
        if world_size % other == 0:
            hint = f" (for example parallel.dp_shard: {world_size // other}, or -1 to fill the rest)"
        errors.append(
            (
                "parallel",
                f"{dims} = {' x '.join(str(v) for v in raw.values())} = {known}, but the world size is {world_size}; make the product {world_size}{hint}",
            )
        )
    return errors
