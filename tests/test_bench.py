"""Smoke of the benchmark suite's pieces (bench/suite) with tiny sizes; asserts values, not timings."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from suite import data, overhead, waste  # noqa: E402

TINY = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 1024,
}


def test_pad_to_longest_matches_a_hand_count():
    # one batch of 4: computed 4 x 7 = 28 positions, 3 + 5 + 2 + 7 = 17 real
    r = waste.pad_to_longest([3, 5, 2, 7], batch_size=4, seed=0)
    assert (r["real"], r["computed"], r["batches"]) == (17, 28, 1)
    assert r["waste"] == pytest.approx(11 / 28)
    # batches of 2: whatever the shuffle, the count is sum(len(b) * max(b)) over the batches
    lengths = [3, 5, 2, 7, 1]
    batches = waste.shuffled_batches(lengths, 2, seed=1)
    assert sorted(x for b in batches for x in b) == sorted(lengths) and [len(b) for b in batches] == [2, 2, 1]
    r = waste.pad_to_longest(lengths, 2, seed=1)
    assert r["computed"] == sum(len(b) * max(b) for b in batches)
    assert waste.pad_to_longest(lengths, 1, seed=0)["waste"] == 0.0


def test_packing_budget_fill_and_batch_size():
    r = waste.packing([5, 5, 5], max_tokens=8, seed=0)  # no two fit together: 3 rows
    assert (r["rows"], r["real"], r["waste"]) == (3, 15, 0.0)
    assert r["budget_fill_waste"] == pytest.approx(1 - 15 / 24)
    assert waste.packing([4, 4, 4, 4], max_tokens=8, seed=3)["budget_fill_waste"] == 0.0
    assert waste.choose_batch_size([100] * 50, max_tokens=1000, seed=0) == 10


def test_text_lengths_follow_the_stated_distribution():
    pairs = data.draw_lengths(4000, seed=0, max_tokens=2048)
    assert pairs == data.draw_lengths(4000, seed=0, max_tokens=2048)
    assert all(p + r + data.TEMPLATE_TOKENS <= 2048 for p, r in pairs)
    assert statistics.median(p for p, _ in pairs) == pytest.approx(data.lognormal_median(69.5, 1.0), rel=0.1)
    assert statistics.median(r for _, r in pairs) == pytest.approx(data.lognormal_median(214.5, 1.0), rel=0.1)
    assert data.lognormal_median(214.5, 1.0) == pytest.approx(130.1, abs=0.1)


@pytest.fixture(scope="module")
def text_jsonl(tmp_path_factory):
    return data.write_jsonl(data.text_samples(12, seed=0, max_tokens=256), tmp_path_factory.mktemp("bench") / "t.jsonl")


def test_samples_fit_the_budget_and_template_count(text_jsonl):
    samples, _ = overhead.encode(overhead.config_dict(str(text_jsonl), "x", max_tokens=256, max_steps=1, lm=TINY))
    assert len(samples) == 12 and max(len(s) for s in samples) <= 256
    # the template adds exactly TEMPLATE_TOKENS to the prompt and response bytes
    one = data.text_samples(1, seed=5, max_tokens=256)[0]
    nbytes = sum(len(m["content"][0]["text"].encode()) for m in one["messages"])
    path = data.write_jsonl([one], text_jsonl.parent / "one.jsonl")
    (enc,), _ = overhead.encode(overhead.config_dict(str(path), "x", max_tokens=256, max_steps=1, lm=TINY))
    assert len(enc) == nbytes + data.TEMPLATE_TOKENS


@pytest.mark.slow
def test_handwritten_loop_matches_omnicore(text_jsonl):
    """Same weights, rows, optimizer and loss: identical losses step by step."""
    r = overhead.measure(str(text_jsonl), max_tokens=256, steps=3, warmup=1, repeats=1, lm=TINY)
    assert r["max_loss_diff"] < 1e-6
    assert r["ratio"] > 0 and len(r["omnicore_step_ms"]) == len(r["handwritten_step_ms"]) == 2


@pytest.mark.slow
def test_trainer_runs_see_the_same_tokens(text_jsonl):
    pytest.importorskip("accelerate")
    from suite import hf_trainer
    from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening

    cfg = overhead.config_dict(str(text_jsonl), "x", max_tokens=256, max_steps=2, lm=TINY)
    samples, tok = overhead.encode(cfg)
    feats = hf_trainer.hf_features(samples)
    # unshifted labels: token j is a target in transformers' labels iff omnicore trains position j - 1
    s, f = samples[0], feats[0]
    assert [j for j, x in enumerate(f["labels"]) if x != -100] == [i + 1 for i, x in enumerate(s.labels) if x != -100]
    assert all(f["labels"][j] == f["input_ids"][j] for j in range(len(f["labels"])) if f["labels"][j] != -100)
    real = sum(len(x) for x in samples)
    pad = hf_trainer.run_trainer(cfg, len(tok), feats, DataCollatorForSeq2Seq(tok, padding="longest"), 4, 1, tok.pad_token_id)
    assert pad["steps"] == 3 and pad["real_tokens"] == real and 0 < pad["padding_waste"] < 1
    assert pad["computed_positions"] >= real and math.isfinite(pad["train_loss"]) and pad["tokens_per_s"] > 0
    flat = hf_trainer.run_trainer(cfg, len(tok), feats, DataCollatorWithFlattening(), 6, 1, tok.pad_token_id)
    assert flat["steps"] == 2 and flat["real_tokens"] == flat["computed_positions"] == real and flat["padding_waste"] == 0.0


def test_startup_reuses_plugins_startup():
    from suite import startup

    r = startup.measure(runs=1, warmup=0)
    assert r["python_c_pass_median_ms"] > 0 and r["ratio"] > 0
    # the ratio is the two medians' quotient, and the listing really ran (it takes longer than `pass`)
    assert r["ratio"] == pytest.approx(r["omnicore_plugins_median_ms"] / r["python_c_pass_median_ms"])
    assert r["omnicore_plugins_median_ms"] > r["python_c_pass_median_ms"]


@pytest.mark.slow
def test_data_scale_dataset_repeats_real_media_round_robin(tmp_path):
    import data_scale

    pool = data_scale.build_digits(tmp_path / "pool", *data_scale.POOL)
    lines = data_scale.media_samples(pool, tmp_path / "set")
    assert len(lines) == len(pool.read_text().splitlines()) == 48
    media = sorted(p.name for p in (tmp_path / "set" / "media").iterdir())
    paths = [part["path"] for line in lines for m in json.loads(line)["messages"] for part in m["content"] if "path" in part]
    # every sample points at a copied file, and every copy is referenced
    assert (
        sorted({p.removeprefix("media/") for p in paths}) == media and len(media) == 48
    )  # one file per sample: 24 + 8 images, 16 recordings
    out = data_scale.write_dataset(tmp_path / "set" / "train.jsonl", 101, lines)
    written = out.read_text().splitlines()
    assert len(written) == 101 and written == [lines[i % 48] for i in range(101)]
    with pytest.raises(ValueError, match="no sample lines"):
        data_scale.write_dataset(tmp_path / "x.jsonl", 3, [])


def test_data_scale_wait_share_skips_step_one():
    import data_scale

    rows = [{"step": 1, "data_wait_s": 5.0, "step_time_s": 6.0}] + [
        {"step": s, "data_wait_s": 0.1 * s, "step_time_s": 1.0} for s in (2, 3, 4)
    ]
    r = data_scale.wait_share(rows)
    assert (
        r["share"] == pytest.approx(0.9 / 3) and r["steps"] == 3 and r["max_wait_s"] == pytest.approx(0.4) and r["first_step_wait_s"] == 5.0
    )
    with pytest.raises(ValueError, match="after step 1"):
        data_scale.wait_share(rows[:1])


@pytest.mark.cli
def test_data_scale_memory_counts_the_child_tree():
    """A parent holding ~0 extra and a child holding 200 MiB: the tree's RSS sum sees the child."""
    import subprocess

    import data_scale

    code = "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', 'b = bytearray(200 << 20); import time; time.sleep(30)']); c.wait()"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):
            m = data_scale.memory(proc.pid)
            if m["processes"] == 2 and m["rss_tree"] - m["rss_main"] > 200 << 20:
                break
            time.sleep(0.1)
        assert m["processes"] == 2 and data_scale.process_tree(proc.pid)[0] == proc.pid
        assert m["rss_tree"] - m["rss_main"] > 200 << 20  # the child's bytearray, counted in the tree only
        assert m["rss_main"] < 100 << 20 and m["pss_tree"] > 200 << 20
    finally:
        for pid in reversed(data_scale.process_tree(proc.pid)):
            os.kill(pid, signal.SIGKILL)
        proc.wait()
