"""parallel/encoder_balance against omnicore's parallel-strategy contract suite. It has no mesh dims
(it reduces no gradient), so ``apply`` without a process group must leave the loss as it is."""

from __future__ import annotations

from omnicore.testing import ParallelStrategyContract


class TestEncoderBalanceContract(ParallelStrategyContract):
    name = "encoder_balance"
    single_process = True


class TestEncoderBalanceOnHSDPLayouts(ParallelStrategyContract):
    name = "encoder_balance"
    single_process = True
    mesh = {"dp_replicate": 2, "dp_shard": -1}
    planned_world_sizes = (2, 4)
