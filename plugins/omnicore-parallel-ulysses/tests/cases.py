"""The test cases: a tiny omni-modal model (Qwen2 foundation, SigLIP image encoder, MoVQGAN image
decoder) and hand-built packed rows that hit Ulysses' edge cases. Shared by the reference (one
process) and the workers (several), so both build the same model and batch."""

from __future__ import annotations

from typing import Any

import torch

TINY_LM = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}
TINY_SIGLIP = {
    "image_size": 28,
    "patch_size": 7,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}
TINY_MOVQ = {"block_out_channels": [32, 32, 32], "latent_channels": 4, "vq_embed_dim": 4, "num_vq_embeddings": 64, "layers_per_block": 1}

# name -> (foundation config changes, [sample lengths], where an image input span starts, where an image target span starts)
CASES: dict[str, dict[str, Any]] = {
    # 37 tokens: not divisible by 2 or 4
    "odd_length": {"lm": {}, "samples": [37], "image_at": None, "target_at": None},
    # one KV head, fewer than SP
    "gqa_one_kv_head": {"lm": {"num_key_value_heads": 1}, "samples": [30], "image_at": None, "target_at": None},
    # two packed samples; the second (positions 11..) crosses the shard boundary at 16 (and 8, 24 with SP 4)
    "packed_crossing": {"lm": {}, "samples": [11, 21], "image_at": None, "target_at": None},
    # an image input span (16 placeholders) over the middle of the row, and an image target span
    "image_straddling": {"lm": {}, "samples": [49], "image_at": 10, "target_at": None, "decoder": True},
    # everything at once: odd length, packing, one KV head, image input and target spans
    "all": {"lm": {"num_key_value_heads": 1}, "samples": [9, 101], "image_at": 15, "target_at": 37, "decoder": True},
    # with the varlen kernel as the core on the full sequence (no [T, T] mask): packing across the
    # boundary, odd length (padding sample), samples of equal and unequal lengths (batched and
    # padded groups), and one KV head replicated over SP
    "packed_varlen": {"lm": {}, "samples": [11, 21, 5, 5, 3], "image_at": None, "target_at": None, "attention": "sdpa_varlen"},
    "all_varlen": {
        "lm": {"num_key_value_heads": 1},
        "samples": [9, 101, 9, 17],
        "image_at": 15,
        "target_at": 37,
        "decoder": True,
        "attention": "sdpa_varlen",
    },
}


def config(case: str):
    from omnicore.config import Config

    c = CASES[case]
    model = {
        "foundation": {"name": "hf_causal_lm", "options": {"config": {**TINY_LM, **c["lm"]}}},
        "encoders": {"image": {"name": "siglip", "options": {"config": dict(TINY_SIGLIP)}}} if c["image_at"] is not None else {},
        "decoders": {"image": {"name": "movqgan", "options": {"config": dict(TINY_MOVQ), "image_size": 32}}} if c.get("decoder") else {},
    }
    model["kernels"] = {"attention": c.get("attention", "sdpa")}
    return Config.model_validate({"run": {"seed": 0, "device": "cpu"}, "model": model, "data": {"train": "unused.jsonl"}})


def build(case: str):
    """``(model, batch, n_targets)`` for one case, deterministic."""
    from PIL import Image

    from omnicore.model.build import build_omni_model

    c = CASES[case]
    model, _ = build_omni_model(config(case))
    g = torch.Generator().manual_seed(1)
    lengths = c["samples"]
    ids = torch.randint(3, 250, (sum(lengths),), generator=g)
    img = Image.fromarray((torch.rand(32, 32, 3, generator=g) * 255).to(torch.uint8).numpy())
    enc_inputs, dec_inputs = {}, {}
    placeholder = torch.zeros_like(ids, dtype=torch.bool)
    # an image input (encoder placeholders) and an image target (decoder placeholders), where the case puts them
    for at, side, components, inputs in (
        (c["image_at"], "encoder", model.encoders, enc_inputs),
        (c["target_at"], "decoder", model.decoders, dec_inputs),
    ):
        if at is None:
            continue
        comp = components["image"]
        feats = comp.preprocess(img)
        n = comp.num_tokens(feats)
        ids[at : at + n] = model.token_ids[side]["image"]
        placeholder[at : at + n] = True
        inputs["image"] = comp.collate([feats])
    # labels shifted within each sample (as omnicore's data side does), none on placeholders or sample ends
    labels = torch.full_like(ids, -100)
    pos = []
    start = 0
    for n in lengths:
        labels[start : start + n - 1] = ids[start + 1 : start + n]
        pos.append(torch.arange(n))
        start += n
    labels[placeholder.roll(-1)] = -100
    labels[placeholder] = -100
    batch = {
        "input_ids": ids.unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "position_ids": torch.cat(pos).unsqueeze(0),
        "encoder_inputs": enc_inputs,
        "decoder_inputs": dec_inputs,
    }
    n_codes = int((ids == model.token_ids["decoder"].get("image", -1)).sum()) if c["target_at"] is not None else 0
    return model, batch, int((labels != -100).sum()) + n_codes


def loss_and_grads(model, batch, n_targets: int, scale: float = 1.0):
    """Forward and backward of ``loss_sum * scale / n_targets``; returns (loss sum, {name: grad})."""
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    (out.loss_sum * scale / n_targets).backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    return out.loss_sum.detach(), grads
