"""Shared fixtures: tiny component configs and a small real-data JSONL built from the shipped digits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"

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
TINY_MOVQ = {"block_out_channels": [32, 32, 32], "latent_channels": 4, "vq_embed_dim": 4, "num_vq_embeddings": 64, "layers_per_block": 1}


def tiny_config_dict(train: str, *, eval: str | None = None, output_dir: str = "run", decoders: bool = True, **train_kw) -> dict:
    """A run config (as a dict) for the tiny omni-modal model on a JSONL file."""
    model = {
        "foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM)}},
        "encoders": {
            "image": {"name": "siglip", "options": {"config": dict(TINY_SIGLIP)}},
            "audio": {"name": "whisper", "options": {"config": dict(TINY_WHISPER), "chunk_seconds": 2.5, "pool": 5}},
        },
        "decoders": {"image": {"name": "movqgan", "options": {"config": dict(TINY_MOVQ), "image_size": 32}}} if decoders else {},
    }
    data = {"train": train, "max_tokens": 512, "shuffle": True}
    if eval:
        data["eval"] = eval
    train_cfg = {"max_steps": 4, "lr": 3e-3, "warmup_steps": 1, "progress": False, "export": False}
    train_cfg.update(train_kw)
    return {"run": {"output_dir": output_dir, "seed": 0}, "model": model, "data": data, "train": train_cfg}


@pytest.fixture(scope="session")
def text_jsonl(tmp_path_factory) -> Path:
    """24 text-only chats ("Say the number 3 0 7" -> "33"), for the tiny text model's run tests; a
    test module may define its own ``text_jsonl`` instead."""
    import json

    lines = []
    for i in range(24):
        q = "Say the number " + " ".join(str((i * 7 + k) % 10) for k in range(1 + i % 9))
        lines.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 5)}]})
    path = tmp_path_factory.mktemp("text") / "text.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(scope="session")
def digits_jsonl(tmp_path_factory) -> Path:
    """A small real-data set (train.jsonl, eval.jsonl, images/) built from examples/digits/raw."""
    out = tmp_path_factory.mktemp("digits")
    subprocess.run(
        [
            sys.executable,
            str(DIGITS / "build_data.py"),
            "--out",
            str(out),
            "--train-images",
            "24",
            "--train-audio",
            "16",
            "--gen",
            "8",
            "--eval-images",
            "6",
            "--eval-audio",
            "6",
            "--seed",
            "0",
        ],
        check=True,
        capture_output=True,
    )
    return out


def first_fit_by_scan(lengths: list[int], budget: int) -> list[list[int]]:
    """The textbook first-fit, the reference the packer's tests compare with: each index, in the
    given order, goes into the first open bin with room (a plain quadratic scan; the packer uses a
    segment tree), else it opens a new bin. Returns the bins as lists of indices."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return bins


def template_ids(rendered) -> list[int]:
    """``apply_chat_template(..., tokenize=True)``'s ids, whether a list or a dict-like encoding."""
    return list(rendered["input_ids"]) if not isinstance(rendered, list) else rendered


def labelled_spans(enc, tok) -> list[str]:
    """The decoded runs of consecutive labelled tokens of an encoded sample (the label at i is
    token i + 1); asserts that every label is the next token."""
    from omnicore.data.chat import IGNORE_INDEX

    spans, cur = [], []
    for i, lab in enumerate(enc.labels):
        if lab != IGNORE_INDEX:
            assert lab == enc.input_ids[i + 1]
            cur.append(lab)
        elif cur:
            spans.append(tok.decode(cur))
            cur = []
    return spans + ([tok.decode(cur)] if cur else [])
