"""The test cases: the tiny digits model's image and audio encoders (SigLIP, Whisper; the sizes of
the core's ``tests/conftest.py``) under a tiny Qwen2, and four hand-built packed rows whose media
are as uneven as can be. Shared by the one-process reference and the ranks, so both build the same
model and rows.

============  =====================================  =================================
row           image items (16 tokens each)           audio items (tokens from length)
============  =====================================  =================================
0             5                                      2 (1.9 s, 0.7 s: 19 and 7 tokens)
1             none                                   1 (2.3 s: 23 tokens)
2             none                                   none (text only)
3             1                                      none
============  =====================================  =================================

On 4 ranks each rank reads one row (rank 2 holds no item at all, ranks 1 and 2 no image, ranks 2
and 3 no audio); on 2 ranks rank 0 reads rows 0 and 1 and rank 1 rows 2 and 3, one per micro-step
(:func:`rows_of`), so the first micro-step pairs the heaviest row with the empty one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
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
TINY_WHISPER = {"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "num_mel_bins": 80}

ROWS: list[dict[str, list[Any]]] = [
    {"image": [0, 1, 2, 3, 4], "audio": [1.9, 0.7]},
    {"image": [], "audio": [2.3]},
    {"image": [], "audio": []},
    {"image": [5], "audio": []},
]
"""Per row: the seeds of its images and the lengths (seconds) of its clips."""


def model_dict() -> dict[str, Any]:
    return {
        "foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM)}},
        "encoders": {
            "image": {"name": "siglip", "options": {"config": dict(TINY_SIGLIP)}},
            "audio": {"name": "whisper", "options": {"config": dict(TINY_WHISPER), "chunk_seconds": 2.5, "pool": 5}},
        },
    }


def build_model():
    from omnicore.testing import Config, build_omni_model

    cfg = Config.model_validate({"run": {"seed": 0, "device": "cpu"}, "model": model_dict(), "data": {"train": "unused.jsonl"}})
    model, _ = build_omni_model(cfg)
    return model


def _image(seed: int):
    from PIL import Image

    g = np.random.default_rng(seed)
    return Image.fromarray(g.integers(0, 256, (28, 28, 3), dtype=np.uint8))


def _clip(seconds: float, seed: int):
    from omnicore.api import Audio

    g = np.random.default_rng(100 + seed)
    return Audio((0.1 * g.standard_normal(int(16000 * seconds))).astype(np.float32), 16000)


def build_row(model, k: int):
    """``(micro-batch, its targets)`` of row ``k``: two packed samples; the first holds the row's
    images, the second its clips, each media span between text."""
    from omnicore.testing import MicroBatch

    g = torch.Generator().manual_seed(1000 + k)
    procs = model.encoder_processors()
    feats = {"image": [procs["image"].preprocess(_image(s)) for s in ROWS[k]["image"]]}
    feats["audio"] = [procs["audio"].preprocess(_clip(s, i)) for i, s in enumerate(ROWS[k]["audio"])]
    ids: list[int] = []
    labels: list[int] = []
    pos: list[int] = []
    for modality in ("image", "audio"):
        sample: list[int] = []
        media: list[bool] = []
        for f in feats[modality]:
            text = torch.randint(3, 250, (3,), generator=g).tolist()
            sample += text + [model.token_ids["encoder"][modality]] * procs[modality].num_tokens(f)
            media += [False] * 3 + [True] * procs[modality].num_tokens(f)
        text = torch.randint(3, 250, (6,), generator=g).tolist()
        sample += text
        media += [False] * 6
        # labels shifted within the sample; none on placeholders or on the position before one
        lab = [(-100 if media[i] or media[i + 1] else sample[i + 1]) for i in range(len(sample) - 1)] + [-100]
        ids += sample
        labels += lab
        pos += list(range(len(sample)))
    mb = MicroBatch(
        torch.tensor([ids]),
        torch.tensor([labels]),
        torch.tensor([pos]),
        encoder_inputs={m: procs[m].collate(f) for m, f in feats.items() if f},
    )
    return mb, sum(1 for x in labels if x != -100)


def rows_of(data_rank: int, data_size: int) -> list[int]:
    """The rows a data group reads, one per micro-step: consecutive blocks of ``4 / data_size``."""
    per = len(ROWS) // data_size
    return list(range(data_rank * per, (data_rank + 1) * per))


def total_targets(model) -> int:
    return sum(build_row(model, k)[1] for k in range(len(ROWS)))


def reference() -> dict[str, Any]:
    """One process over all four rows: the loss sum and gradients of ``sum / targets``."""
    model = build_model()
    n = total_targets(model)
    model.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for k in range(len(ROWS)):
        mb, _ = build_row(model, k)
        out = model(mb)
        (out.loss_sum / n).backward()
        total += out.loss_sum.detach()
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone() for name, p in model.named_parameters()}
    return {"loss": total, "grads": grads}
