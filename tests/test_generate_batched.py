"""Batched generation and eval: the same tokens as one prompt at a time, reproducible sampling,
``eval.json`` rows, ``--limit``, and the command-line flags."""

from __future__ import annotations

import io
import json

import pytest
import torch
from conftest import tiny_config_dict

from omnicore.config import Config, ConfigError
from omnicore.data.jsonl import read_jsonl
from omnicore.model.build import build_omni_model
from omnicore.model.generation import Sampling, generate, generate_batch, pick


@pytest.fixture(scope="module")
def built(digits_jsonl):
    from omnicore.data.chat import ChatProcessor

    cfg = Config.model_validate(tiny_config_dict(str(digits_jsonl / "train.jsonl")))
    model, tok = build_omni_model(cfg)
    model.eval()
    return model, tok, ChatProcessor.for_model(tok, model, cfg.data)  # the modules' processors, as eval and generate build it


@pytest.fixture(scope="module")
def prompts(built, digits_jsonl):
    """Image, audio and text-to-image prompts of the digits set: several lengths, media merged."""
    _, _, processor = built
    samples = read_jsonl(digits_jsonl / "eval.jsonl") + read_jsonl(digits_jsonl / "train.jsonl")[-8:]
    return [processor.encode(s, prompt_only=True) for s in samples]


def _same(a: dict, b: dict) -> bool:
    images = lambda o: {m: [i.tobytes() for i in v] for m, v in o["images"].items()}  # noqa: E731
    return a["token_ids"] == b["token_ids"] and a["text"] == b["text"] and images(a) == images(b)


@pytest.mark.slow
def test_batched_greedy_equals_one_at_a_time(built, prompts):
    """One left-padded batch gives, row by row, exactly the tokens, text and images of generating each
    prompt alone; with the image-start logit raised a little, some rows open an image (decoder codes
    batched beside text rows) and some do not."""
    model, tok, _ = built
    assert len({len(p) for p in prompts}) >= 3 and any(kind == "encoder" for p in prompts for kind, _, _ in p.media)
    head = model.lm.get_output_embeddings()
    saved = head.weight.data.clone()
    try:
        head.weight.data[model.token_ids["decoder_start"]["image"]] += 0.5
        alone = [generate(model, tok, p, max_new_tokens=4) for p in prompts]
        batched = generate_batch(model, tok, prompts, max_new_tokens=4)
    finally:
        head.weight.data.copy_(saved)
    with_images = sum(bool(o["images"]) for o in alone)
    assert 0 < with_images < len(prompts), "the check needs rows with and without images"
    assert [i for i, (a, b) in enumerate(zip(alone, batched)) if not _same(a, b)] == []


def test_batched_text_stops_per_row(built, prompts):
    """Plain text (no bias): every row equals its alone run; a row stops at the stop id or at
    ``max_new_tokens``, whichever first, while the others go on."""
    model, tok, _ = built
    stop = tok.eos_token_id
    alone = [generate(model, tok, p, max_new_tokens=10, stop_id=stop) for p in prompts]
    batched = generate_batch(model, tok, prompts, max_new_tokens=10, stop_id=stop)
    assert [o["token_ids"] for o in batched] == [o["token_ids"] for o in alone]
    for o in batched:
        ids = o["token_ids"]
        assert (len(ids) == 10 and stop not in ids[:-1]) or (ids[-1] == stop and stop not in ids[:-1])


def test_sampling_is_reproducible_and_independent_of_the_batch(built, prompts):
    """With a seed per row, sampling repeats exactly, each row equals that row generated alone with its
    seed, and other seeds give other answers."""
    model, tok, _ = built
    sampling = Sampling(temperature=1.5, top_k=50, top_p=0.95)
    seeds = [100 + i for i in range(len(prompts))]
    first = generate_batch(model, tok, prompts, max_new_tokens=6, sampling=sampling, seeds=seeds)
    again = generate_batch(model, tok, prompts, max_new_tokens=6, sampling=sampling, seeds=seeds)
    assert [o["token_ids"] for o in first] == [o["token_ids"] for o in again]
    for i in (0, len(prompts) // 2, len(prompts) - 1):
        one = generate(model, tok, prompts[i], max_new_tokens=6, temperature=1.5, top_k=50, top_p=0.95, seed=seeds[i])
        assert one["token_ids"] == first[i]["token_ids"]
    other = generate_batch(model, tok, prompts, max_new_tokens=6, sampling=sampling, seeds=[s + 1000 for s in seeds])
    assert [o["token_ids"] for o in other] != [o["token_ids"] for o in first]


@pytest.mark.slow
def test_pick_top_k_and_top_p_keep_the_right_tokens():
    """Draw frequencies match the renormalised kept probabilities: top_k keeps the k largest, top_p the
    smallest set whose probability reaches p."""
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log()
    gen = torch.Generator().manual_seed(0)

    def freq(sampling: Sampling, n: int = 4000) -> torch.Tensor:
        draws = torch.tensor([pick(logits, sampling, gen) for _ in range(n)])
        return torch.bincount(draws, minlength=4).float() / n

    assert pick(logits, Sampling(), None) == 1  # greedy
    f = freq(Sampling(temperature=1.0, top_k=2))  # keeps 0.5 and 0.3
    assert f[0] == 0 and f[2] == 0 and abs(f[1] - 0.5 / 0.8) < 0.03
    f = freq(Sampling(temperature=1.0, top_p=0.7))  # 0.5 < 0.7 <= 0.5 + 0.3: keeps the same two
    assert f[0] == 0 and f[2] == 0 and abs(f[1] - 0.5 / 0.8) < 0.03
    f = freq(Sampling(temperature=1.0, top_p=0.5))  # 0.5 alone reaches it
    assert f[1] == 1
    f = freq(Sampling(temperature=1.0))
    assert torch.allclose(f, probs, atol=0.03)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(temperature=1.0, top_p=0.0)


def test_eval_json_rows_limit_and_batch_size(built, digits_jsonl, tmp_path, monkeypatch):
    """``evaluate`` with ``--limit 7`` and batches of 3 writes one ``eval.json`` row per sample with
    the answer of one-at-a-time generation, the expected answer and whether they match; the summary
    counts them."""
    import omnicore.eval.loading
    from omnicore.eval.scoring import evaluate

    model, tok, processor = built
    d = tiny_config_dict(str(digits_jsonl / "train.jsonl"), eval=str(digits_jsonl / "eval.jsonl"), output_dir=str(tmp_path / "run"))
    d["generate"] = {"batch_size": 3, "max_new_tokens": 3}
    cfg = Config.model_validate(d)
    monkeypatch.setattr(omnicore.eval.loading, "load_trained", lambda *a, **k: (model, tok, processor))
    result = evaluate(cfg, limit=7, progress=False)
    saved = json.loads((tmp_path / "run" / "eval.json").read_text())
    samples = read_jsonl(digits_jsonl / "eval.jsonl")[:7]
    assert result["eval_json"] == str(tmp_path / "run" / "eval.json") and result["batch_size"] == 3
    assert [r["where"] for r in saved["samples"]] == [s.where for s in samples]
    for row, s in zip(saved["samples"], samples):
        want = generate(model, tok, processor.encode(s, prompt_only=True), max_new_tokens=3, stop_id=processor.end_of_turn_id)
        assert set(row) == {"where", "task", "prompt", "expected", "answer", "correct"}
        assert row["answer"] == want["text"].strip() and row["expected"] == s.messages[-1].parts[0].value
        assert row["correct"] == (row["answer"] == row["expected"]) and row["task"] == s.meta["task"]
        media = [p for p in s.messages[0].parts if p.type != "text"]
        assert all(f"<{p.type}: {p.value}>" in row["prompt"] for p in media)
    assert saved["summary"]["total"] == result["total"] == 7
    assert saved["summary"]["correct"] == sum(r["correct"] for r in saved["samples"])


@pytest.mark.slow
def test_generate_cli_prompts_and_samples(built, tmp_path, monkeypatch):
    """Two prompts x two samples: four labelled answers, prompt-major, answer ``k`` drawn with seed
    ``run.seed + k``; several samples with greedy decoding are refused."""
    import omnicore.eval.loading
    from omnicore.eval.generate import generate_cli

    model, tok, processor = built
    d = tiny_config_dict("unused.jsonl", decoders=False)
    d["generate"] = {"temperature": 1.0, "max_new_tokens": 5, "batch_size": 3}
    cfg = Config.model_validate(d)
    monkeypatch.setattr(omnicore.eval.loading, "load_trained", lambda *a, **k: (model, tok, processor))
    texts = ["What is 2?", "Say a digit."]
    lines = list(
        generate_cli(cfg, prompts=texts, image=None, audio=None, out_dir=str(tmp_path), checkpoint=None, export=None, num_samples=2)
    )
    from omnicore.data.jsonl import Message, Part, Sample

    want = []
    for k, (p, s) in enumerate([(p, s) for p in range(2) for s in range(2)]):
        enc = processor.encode(Sample([Message("user", [Part("text", texts[p])])], "<command line>", 0), prompt_only=True)
        out = generate(model, tok, enc, max_new_tokens=5, temperature=1.0, seed=cfg.run.seed + k, stop_id=processor.end_of_turn_id)
        want.append(f"prompt {p + 1}, sample {s + 1}: text: {out['text']!r}")
    assert lines == want
    greedy = cfg.model_copy(update={"generate": cfg.generate.model_copy(update={"temperature": 0.0})})
    with pytest.raises(ConfigError, match="--num-samples 2"):
        list(
            generate_cli(greedy, prompts=texts, image=None, audio=None, out_dir=str(tmp_path), checkpoint=None, export=None, num_samples=2)
        )


def test_cli_flags_become_config_overrides():
    """``--temperature`` and friends set the config keys they name (validated by the config)."""
    from omnicore.cli import _flag_overrides, build_parser

    args, extra = build_parser().parse_known_args(
        ["generate", "c.yaml", "--prompt", "a", "--prompt", "b", "--temperature", "0.7", "--top-k", "5", "--seed", "3", "--top-p", "0.9"]
    )
    assert args.prompt == ["a", "b"] and extra == []
    assert _flag_overrides(args) == ["--generate.temperature", "0.7", "--generate.top_k", "5", "--generate.top_p", "0.9", "--run.seed", "3"]
    args, _ = build_parser().parse_known_args(["eval", "c.yaml", "--batch-size", "32", "--limit", "5"])
    assert _flag_overrides(args) == ["--generate.batch_size", "32"] and args.limit == 5


def test_plain_progress_lines():
    """Outside a terminal, eval progress is training's plain-line helper counting samples: the first
    batch, then a line once 30 s have passed since the previous one, and the end."""
    from omnicore.progress import PlainProgress

    now, out = [0.0], io.StringIO()
    bar = PlainProgress(100, desc="eval", count="{n}/{total} samples", stream=out, clock=lambda: now[0])
    for _ in range(25):  # 4 samples every 4 s
        now[0] += 4.0
        bar.update(4)
    assert out.getvalue().splitlines() == [
        "eval: 4/100 samples (4%); 4 s elapsed, about 96 s left",
        "eval: 36/100 samples (36%); 36 s elapsed, about 64 s left",
        "eval: 68/100 samples (68%); 68 s elapsed, about 32 s left",
        "eval: 100/100 samples (100%); 100 s elapsed",
    ]
