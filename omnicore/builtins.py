"""omnicore's built-in components, registered through the same hooks as any plugin.

This module is imported by ``omnicore plugins``: it names targets as strings and imports nothing
heavy.
"""

from __future__ import annotations

from omnicore.components import ComponentSpec
from omnicore.hookspecs import hookimpl


@hookimpl
def omnicore_foundations() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="hf_causal_lm",
            target="omnicore.model.foundation:build",
            options_model="omnicore.model.foundation:HFCausalLMOptions",
            description="any transformers causal LM, from a config dict or a local checkpoint directory",
        )
    ]


@hookimpl
def omnicore_parallel_strategies() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="fsdp2",
            target="omnicore.parallel.fsdp:FSDP2",
            options_model="omnicore.config:NoOptions",
            description="FSDP2 (torch.distributed.fsdp.fully_shard) per block, then the root, over the fsdp dim (dp_shard x ep x sp)",
        ),
        ComponentSpec(
            name="ep",
            target="omnicore.parallel.expert:ExpertParallel",
            options_model="omnicore.parallel.expert:ExpertParallelOptions",
            description="expert parallelism: MoE experts Shard(0) over ep, tokens dispatched/combined by all-to-all (transformers experts registry)",
        ),
        ComponentSpec(
            name="activation_checkpointing",
            target="omnicore.parallel.checkpointing:ActivationCheckpointing",
            options_model="omnicore.parallel.checkpointing:ActivationCheckpointingOptions",
            description="activation checkpointing per transformer block: full, selective (every N-th) or op-level",
        ),
        ComponentSpec(
            name="compile",
            target="omnicore.parallel.compile:CompileBlocks",
            options_model="omnicore.parallel.compile:CompileOptions",
            description="torch.compile of each transformer block, in place",
        ),
        ComponentSpec(
            name="none",
            target="omnicore.parallel.fsdp:NoParallel",
            options_model="omnicore.config:NoOptions",
            description="one process, no sharding (the reference every strategy is compared with)",
        ),
    ]


@hookimpl
def omnicore_kernels() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="sdpa",
            target="omnicore.kernels.attention:SDPAAttention",
            options_model="omnicore.config:NoOptions",
            description="torch scaled_dot_product_attention through transformers; packed samples kept apart",
        ),
        ComponentSpec(
            name="eager",
            target="omnicore.kernels.attention:EagerAttention",
            options_model="omnicore.config:NoOptions",
            description="transformers' eager (matmul + softmax) attention; a slow, simple reference",
        ),
        ComponentSpec(
            name="torch_cross_entropy",
            target="omnicore.kernels.cross_entropy:TorchCrossEntropy",
            options_model="omnicore.config:NoOptions",
            description="op cross_entropy (default): whole fp32 logits, then F.cross_entropy(reduction='sum')",
        ),
        ComponentSpec(
            name="chunked_cross_entropy",
            target="omnicore.kernels.cross_entropy:ChunkedCrossEntropy",
            options_model="omnicore.kernels.cross_entropy:ChunkedCrossEntropyOptions",
            description="op cross_entropy: lm_head + loss in row chunks, gradients in forward; never the whole [tokens, vocab] logits",
        ),
        ComponentSpec(
            name="torch_rms_norm",
            target="omnicore.kernels.rmsnorm:TorchRMSNorm",
            options_model="omnicore.config:NoOptions",
            description="op rmsnorm: the foundation's RMSNorm modules through torch.nn.functional.rms_norm (fp32)",
        ),
        ComponentSpec(
            name="sdpa_varlen",
            target="omnicore.kernels.attention_varlen:SDPAVarlenAttention",
            options_model="omnicore.config:NoOptions",
            description="scaled_dot_product_attention per packed sample (split by position_ids, batched by length); no [T, T] mask, CPU and GPU",
        ),
    ]


@hookimpl
def omnicore_loggers() -> list[ComponentSpec]:
    return [
        ComponentSpec(
            name="jsonl",
            target="omnicore.train.loggers:JsonlLogger",
            options_model="omnicore.config:NoOptions",
            description="metrics.jsonl in run.output_dir: one JSON object per metrics row (the default)",
        )
    ]
