"""The assignment rule (``omnicore_parallel_encoder_balance.assign``): pure Python, no processes."""

from __future__ import annotations

import itertools
import random

import pytest

from omnicore_parallel_encoder_balance.assign import assign, spread


def test_equal_costs_end_at_most_one_item_above_the_mean():
    for counts in ([5, 0], [8, 1], [10, 0, 0, 0], [3, 3, 0, 7], [1, 0], [0, 0, 9]):
        a = assign([[16.0] * n for n in counts])
        mean = 16.0 * sum(counts) / len(counts)
        assert max(a.after) <= mean + 16.0, (counts, a.after)
        assert sorted(sum(1 for row in a.dest for d in row if d == r) * 16.0 for r in range(len(counts))) == sorted(a.after)


def test_the_skewed_pair_of_the_tests():
    """5 images on rank 0, none on rank 1 (the first micro-step of test_balance's two ranks): rank 0
    keeps 2, rank 1 takes 2, and the fifth goes back to its own rank on a tie."""
    a = assign([[16.0] * 5, []])
    assert a.before == [80.0, 0.0] and a.after == [48.0, 32.0] and a.moved == 2
    assert spread(a.before) == 2.0 and spread(a.after) == pytest.approx(1.2)


def test_balanced_ranks_keep_their_items():
    a = assign([[3.0, 1.0], [2.0, 2.0]], min_spread=1.05)
    assert a.moved == 0 and a.dest == [[0, 0], [1, 1]]
    a = assign([[10.0], [9.0]], min_spread=1.1)  # 10 / 9.5 = 1.053: within
    assert a.moved == 0
    assert assign([[], []]).dest == [[], []] and assign([[0.0], []]).moved == 0  # nothing to balance


def test_items_leave_only_overloaded_ranks_and_no_rank_ends_above_the_mean_plus_one_item():
    """List scheduling's bound: each released item lands on a least-loaded rank, which is at most
    the mean, so no rank ends above ``mean + the costliest item``."""
    rng = random.Random(0)
    for _ in range(200):
        ranks = rng.choice([2, 3, 4, 8])
        costs = [[float(rng.choice([1, 4, 16, 64, 100])) for _ in range(rng.randint(0, 9))] for _ in range(ranks)]
        a = assign(costs)
        total = sum(a.before)
        assert sum(a.after) == pytest.approx(total)
        mean = total / ranks
        for r, row in enumerate(a.dest):
            if a.before[r] <= mean:
                assert all(d == r for d in row), (costs, a.dest)  # a rank at or under the mean sends nothing
        assert max(a.after) <= mean + max((c for row in costs for c in row), default=0.0) + 1e-9, (costs, a.after)


def test_the_plan_is_a_function_of_the_costs_alone():
    costs = [[5.0, 1.0, 3.0], [], [2.0, 2.0, 9.0, 1.0], [7.0]]
    first = assign(costs)
    assert all(assign([list(row) for row in costs]) == first for _ in range(3))
    # every item goes somewhere, and only to a real rank
    assert all(0 <= d < len(costs) for d in itertools.chain.from_iterable(first.dest))
