"""Throughput figures of a training step: model FLOPs, MFU, padding waste and peak memory.

Model FLOPs follow PaLM (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways",
appendix B): a forward and backward pass over one token costs ``6 * N`` FLOPs for the ``N`` weights
it multiplies, plus ``12 * L * d_attn * S`` for attention over a context of ``S`` tokens
(``QK^T`` and ``AV``: 2 matmuls x 2 FLOPs per multiply-add x 3 for forward + backward, per layer, with
``d_attn = heads x head_dim``). torchtitan and nanoGPT use the same count. Two choices are ours:

* Packed rows are counted **per sample**: a sample of ``s`` tokens attends over ``s`` positions, not
  the whole row, so the attention term of a row is ``12 * L * d_attn * sum(s_i^2)``, which is the work
  a varlen kernel does. The causal half is not subtracted (PaLM's convention), so figures compare
  with published MFU.
* ``N`` is the foundation's weights minus the input-embedding table (a lookup, not a matmul); the LM
  head is counted even when tied to it. Encoders and decoders are not counted, so MFU is a lower
  bound for models with large media towers.

MFU = achieved model FLOP/s / peak FLOP/s of the devices. The peak comes from ``train.peak_tflops``
or, for known GPUs, :data:`PEAK_TFLOPS` (dense, no sparsity); on CPU it is unknown and MFU is not
reported (the achieved TFLOP/s is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # dense tensor-core peaks from the vendors' data sheets (SXM parts), TFLOP/s per GPU
    "H200": {"bf16": 989.0, "fp32": 494.0},  # fp32 via TF32 tensor cores
    "H100": {"bf16": 989.0, "fp32": 494.0},
    "A100": {"bf16": 312.0, "fp32": 156.0},
    "L40S": {"bf16": 362.0, "fp32": 183.0},
}
"""Known dense peaks by GPU name fragment and compute dtype (``bf16`` or ``fp32``)."""


@dataclass(frozen=True)
class FlopsModel:
    """The numbers behind the FLOP count of one foundation.

    Attributes:
        matmul_params: ``N``, weights multiplied per token (foundation minus input embeddings).
        layers: ``L``, transformer blocks.
        attn_dim: ``d_attn`` = attention heads x head dim.
    """

    matmul_params: int
    layers: int
    attn_dim: int

    def step_flops(self, sample_lengths: list[int]) -> float:
        """Model FLOPs (forward + backward) of a micro-batch whose samples have these lengths
        (tokens): ``6 N sum(s) + 12 L d_attn sum(s^2)``."""
        tokens = sum(sample_lengths)
        return 6.0 * self.matmul_params * tokens + 12.0 * self.layers * self.attn_dim * float(sum(s * s for s in sample_lengths))


def flops_model(lm: Any) -> FlopsModel:
    """The :class:`FlopsModel` of a transformers causal LM (before any sharding).

    Raises:
        ValueError: the config lacks ``num_hidden_layers``/``num_attention_heads``/``hidden_size``.
    """
    cfg = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    try:
        layers, heads, hidden = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size
    except AttributeError as exc:
        raise ValueError(f"cannot count FLOPs of {type(lm).__name__}: its config lacks {exc.name}") from exc
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    emb = lm.get_input_embeddings().weight
    head = lm.get_output_embeddings()
    n = sum(p.numel() for p in lm.parameters()) - emb.numel()
    if head is not None and head.weight is emb:
        n += emb.numel()  # tied: the LM head still multiplies it
    return FlopsModel(int(n), int(layers), int(heads * head_dim))


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
