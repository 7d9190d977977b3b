"""omnicore-parallel-encoder-balance: encoder work balanced over the data-parallel ranks (parallel
strategy ``encoder_balance``). The hook module is :mod:`omnicore_parallel_encoder_balance.plugin`;
the strategy lives in :mod:`omnicore_parallel_encoder_balance.strategy`, the exchange in
:mod:`omnicore_parallel_encoder_balance.exchange` and the assignment in
:mod:`omnicore_parallel_encoder_balance.assign`."""
