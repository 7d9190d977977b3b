"""Throughput figures of a training step: model FLOPs, MFU, balance across ranks, padding waste and
peak memory.

Model FLOPs are those of every part: the foundation by formula (PaLM's ``6 N`` per token for the
weights a token multiplies, MoE experts at ``top_k / E``, plus attention per packed sample),
encoders and decoders by their own ``flops`` or measured once (:mod:`omnicore.model.flops`, which
says how). A metrics row carries ``tflops`` (achieved model TFLOP/s per device, all parts),
``mfu`` and ``flops_share/<part>`` (each part's fraction of the step's FLOPs: ``foundation``,
``encoder.<m>``, ``decoder.<m>``).

Balance (:func:`balance_figures`): ``flops_spread`` is the largest rank's model FLOPs of the step
over the mean across ranks (1.0 on one process; a rank whose micro-batches hold ten images while
another's hold text shows above 1; encoder FLOPs count on the rank that ran the encoder, so a
strategy that moves encoder work between ranks brings it down). ``reduce_wait_s`` is the mean, ``reduce_wait_max_s`` the
largest, and ``reduce_wait_s/rank<r>`` (up to :data:`MAX_RANK_FIELDS` ranks) each rank's wait at
the gradient reduction: after its last backward (and, on CUDA, its queued kernels), the seconds
until every rank has reached the step's reduction (a one-number all-reduce just before the step's
sums are reduced and the optimizer steps). The rank that finished last waits about 0. With FSDP2,
ranks also meet at every block's all-gather, so part of an imbalance shows up there (in
``step_time_s``) rather than here.

MFU = achieved model FLOP/s / peak FLOP/s of the devices. The peak comes from ``train.peak_tflops``
or, for known GPUs, :data:`PEAK_TFLOPS` (dense, no sparsity); on CPU it is unknown and MFU is not
reported (the achieved TFLOP/s is).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``FlopsModel`` and ``flops_model``, which moved to :mod:`omnicore.model.flops` (imported on
    first use: this module stays torch-free)."""
    if name in ("FlopsModel", "flops_model"):
        from omnicore.model import flops

        return getattr(flops, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


MAX_RANK_FIELDS = 16
"""Metrics rows carry each rank's ``reduce_wait_s/rank<r>`` up to this world size (mean and max always)."""

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # dense tensor-core peaks from the vendors' data sheets (SXM parts), TFLOP/s per GPU
    "H200": {"bf16": 989.0, "fp32": 494.0},  # fp32 via TF32 tensor cores
    "H100": {"bf16": 989.0, "fp32": 494.0},
    "A100": {"bf16": 312.0, "fp32": 156.0},
    "L40S": {"bf16": 362.0, "fp32": 183.0},
}
"""Known dense peaks by GPU name fragment and compute dtype (``bf16`` or ``fp32``)."""


def peak_tflops(device: Any, dtype: str, configured: float | None = None) -> float | None:
    """Peak dense TFLOP/s of one device: ``configured`` when set, else a CUDA device's entry in
    :data:`PEAK_TFLOPS` for ``dtype`` (``bf16``/``fp32``), else None (CPU, unknown GPU)."""
    if configured is not None:
        return configured
    if getattr(device, "type", str(device)) != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    for key, peaks in PEAK_TFLOPS.items():
        if key in name:
            return peaks.get(dtype)
    return None


def peak_memory_mib(device: Any) -> float:
    """Peak memory of this process so far, in MiB: ``torch.cuda.max_memory_allocated`` on CUDA,
    else the peak resident set size (``getrusage``'s ``ru_maxrss``, KiB on Linux)."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # macOS reports bytes


def padding_waste(real_tokens: int, micro_batches: int, max_tokens: int) -> float:
    """The fraction of the token budget (``micro_batches x max_tokens`` positions) that holds no
    sample: what padding every packed row to ``max_tokens`` would waste. omnicore's rows are not
    padded (they are as long as their samples), so this is the budget a fixed-shape run would
    lose; 0 when every row is full."""
    budget = micro_batches * max_tokens
    return 0.0 if budget == 0 else 1.0 - real_tokens / budget


def balance_figures(rank_flops: list[float], rank_waits: list[float]) -> dict[str, float]:
    """``flops_spread`` (max over mean of the ranks' model FLOPs; 1.0 when no rank has any),
    ``reduce_wait_s`` (mean), ``reduce_wait_max_s`` and, up to :data:`MAX_RANK_FIELDS` ranks,
    ``reduce_wait_s/rank<r>`` from per-rank figures of one step (module docstring)."""
    mean = sum(rank_flops) / len(rank_flops) if rank_flops else 0.0
    out = {"flops_spread": max(rank_flops) / mean if mean > 0 else 1.0}
    out["reduce_wait_s"] = sum(rank_waits) / len(rank_waits) if rank_waits else 0.0
    out["reduce_wait_max_s"] = max(rank_waits, default=0.0)
    if len(rank_waits) <= MAX_RANK_FIELDS:
        out.update({f"reduce_wait_s/rank{r}": w for r, w in enumerate(rank_waits)})
    return out
