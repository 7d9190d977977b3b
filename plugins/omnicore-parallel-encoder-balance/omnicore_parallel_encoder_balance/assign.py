"""Which rank encodes which item: a pure function of every rank's item costs, so that every rank
computes the same answer from the same gathered numbers (no further collective decides it).

The rule, in two passes (a longest-processing-time greedy that keeps items where they are when it
can):

1. **Keep.** Each rank goes through its own items, costliest first, and keeps each one while its
   kept cost stays at most the mean load ``total / ranks``; the rest are released.
2. **Place.** The released items, costliest first (ties: lower source rank, then lower index), go
   one by one to the rank with the least load so far; among equally loaded ranks the item's own
   rank wins (it then does not move), else the lowest rank.

With equal costs (images of one size) the largest load ends at most one item above the mean. In
general the result is within the greedy's bound of ``4/3`` of the best makespan (Graham 1969), and an
item moves only off a rank that held more than the mean.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Assignment:
    """The outcome for one encoder call.

    Attributes:
        dest: ``dest[r][i]``, the rank that encodes item ``i`` of rank ``r``.
        before: each rank's cost as the data put it (its own items).
        after: each rank's cost as assigned.
    """

    dest: list[list[int]]
    before: list[float]
    after: list[float]

    @property
    def moved(self) -> int:
        """Items encoded on another rank than their own."""
        return sum(d != r for r, row in enumerate(self.dest) for d in row)


def spread(loads: list[float]) -> float:
    """``max / mean`` of the loads; 1.0 when they are all zero."""
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean > 0 else 1.0


def assign(costs: list[list[float]], min_spread: float = 1.0) -> Assignment:
    """The assignment of every rank's items (``costs[r][i]``: the cost of item ``i`` of rank
    ``r``, at least 0) to ranks, by the rule in the module docstring. When the ranks' own loads
    are already within ``min_spread`` (``max / mean``), every item stays where it is."""
    ranks = len(costs)
    before = [float(sum(c)) for c in costs]
    keep_all = Assignment([[r] * len(c) for r, c in enumerate(costs)], before, list(before))
    total = sum(before)
    if ranks <= 1 or total <= 0 or spread(before) <= min_spread:
        return keep_all
    target = total / ranks
    dest: list[list[int]] = [[-1] * len(c) for c in costs]
    load = [0.0] * ranks
    released: list[tuple[float, int, int]] = []
    for r, row in enumerate(costs):
        for i in sorted(range(len(row)), key=lambda i: (-row[i], i)):
            if load[r] + row[i] <= target:
                dest[r][i] = r
                load[r] += row[i]
            else:
                released.append((row[i], r, i))
    for c, r, i in sorted(released, key=lambda x: (-x[0], x[1], x[2])):
        least = min(load)
        d = r if load[r] == least else load.index(least)
        dest[r][i] = d
        load[d] += c
    return Assignment(dest, before, load)
