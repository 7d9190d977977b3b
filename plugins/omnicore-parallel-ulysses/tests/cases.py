"""The test cases: a tiny omni-modal model (Qwen2 foundation, or Qwen2-VL's for the mRoPE cases;
SigLIP image encoder, MoVQGAN image decoder) and hand-built packed rows that hit Ulysses' edge
cases. Shared by the reference (one process) and the workers (several), so both build the same
model and batch."""

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
# qwen2_vl's text model (mRoPE): head dim 8, so the 4 rotary frequencies split as time 2, height 1, width 1
MROPE_LM = {"model_type": "qwen2_vl", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}}
TINY_MOVQ = {"block_out_channels": [32, 32, 32], "latent_channels": 4, "vq_embed_dim": 4, "num_vq_embeddings": 64, "layers_per_block": 1}

# name -> (foundation config changes, [sample lengths], where an image input span starts (or a list of
# starts: one image each), where an image target span starts)
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
    # mRoPE (qwen2_vl): three packed samples (23 + 40 + 14 = 77, odd: a padding sample), images of
    # 4 x 4 tokens in the first two, whose 3-D positions differ from the 1-D ones; the second image
    # (tokens 31..46) straddles the SP 2 boundary at 39
    "mrope_images": {"lm": MROPE_LM, "samples": [23, 40, 14], "image_at": [3, 31], "target_at": None},
    # the same with the varlen core on the full sequence (it must get the 1-D row), a length that
    # needs no padding, and an image straddling the boundary at 40 (tokens 33..48)
    "mrope_varlen": {"lm": MROPE_LM, "samples": [20, 40, 20], "image_at": [2, 33], "target_at": None, "attention": "sdpa_varlen"},
}


def config(case: str):
    from omnicore.testing import Config

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

    from omnicore.testing import MicroBatch, build_omni_model

    c = CASES[case]
    model, _ = build_omni_model(config(case))
    g = torch.Generator().manual_seed(1)
    lengths = c["samples"]
    ids = torch.randint(3, 250, (sum(lengths),), generator=g)
    img = Image.fromarray((torch.rand(32, 32, 3, generator=g) * 255).to(torch.uint8).numpy())
    enc_inputs, dec_inputs = {}, {}
    placeholder = torch.zeros_like(ids, dtype=torch.bool)
    grids: list[tuple[int, tuple[int, int, int]]] = []  # (start, (t, h, w)) of each image input
    # image inputs (encoder placeholders) and an image target (decoder placeholders), where the case puts them
    for at, side, components, inputs in (
        (c["image_at"], "encoder", model.encoders, enc_inputs),
        (c["target_at"], "decoder", model.decoders, dec_inputs),
    ):
        if at is None:
            continue
        comp = components["image"]
        feats = comp.processor.preprocess(img)
        n = comp.processor.num_tokens(feats)
        starts = at if isinstance(at, list) else [at]
        for a in starts:
            ids[a : a + n] = model.token_ids[side]["image"]
            placeholder[a : a + n] = True
            if side == "encoder" and model.rope is not None:
                grids.append((a, comp.processor.grid(feats)))
        inputs["image"] = comp.processor.collate([feats] * len(starts))
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
    batch = MicroBatch(
        ids.unsqueeze(0),
        labels.unsqueeze(0),
        torch.cat(pos).unsqueeze(0),
        encoder_inputs=enc_inputs,
        decoder_inputs=dec_inputs,
        rope_position_ids=rope_rows(lengths, grids, model.rope) if model.rope is not None else None,
    )
    n_codes = int((ids == model.token_ids["decoder"].get("image", -1)).sum()) if c["target_at"] is not None else 0
    return model, batch, int((labels != -100).sum()) + n_codes


def rope_rows(lengths: list[int], grids: list[tuple[int, tuple[int, int, int]]], layout) -> torch.Tensor:
    """``[3, 1, T]``: each packed sample's own 3-D positions (restarting at 0), its images laid out
    by their grids (``grids``: row start and ``(t, h, w)``; an image lies inside one sample)."""
    from omnicore.testing import mrope_positions

    rows: list[list[int]] = [[], [], []]
    start = 0
    for n in lengths:
        blocks = [(a - start, g) for a, g in grids if start <= a < start + n]
        for row, more in zip(rows, mrope_positions(n, blocks, layout)):
            row.extend(more)
        start += n
    return torch.tensor(rows).unsqueeze(1)


def loss_and_grads(model, batch, n_targets: int, scale: float = 1.0):
    """Forward and backward of ``loss_sum * scale / n_targets``; returns (loss sum, {name: grad})."""
    model.zero_grad(set_to_none=True)
    out = model(batch)
    (out.loss_sum * scale / n_targets).backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    return out.loss_sum.detach(), grads
