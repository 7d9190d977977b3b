"""parallel/ulysses and parallel/async_ulysses against omnicore's parallel-strategy contract suite.
Without a process group ``apply`` leaves the model as it is (nothing to split)."""

from __future__ import annotations

from omnicore.testing import ParallelStrategyContract


class TestUlyssesContract(ParallelStrategyContract):
    name = "ulysses"
    single_process = True


class TestAsyncUlyssesContract(ParallelStrategyContract):
    name = "async_ulysses"
    single_process = True


class TestUlyssesPlannedOverSP(ParallelStrategyContract):
    """On planned layouts where every rank is in one sp group: every rank reads the same data."""

    name = "ulysses"
    single_process = True
    mesh = {"sp": -1}
