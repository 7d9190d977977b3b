"""Generation and evaluation, checked against computations done another way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import first_fit_by_scan, tiny_config_dict

from omnicore.config import Config
from omnicore.data.jsonl import Message, Part, Sample
from omnicore.model.build import build_omni_model
from omnicore.model.generation import generate


@pytest.fixture(scope="module")
def built(digits_jsonl):
    from omnicore.data.chat import ChatProcessor

    cfg = Config.model_validate(tiny_config_dict(str(digits_jsonl / "train.jsonl")))
    model, tok = build_omni_model(cfg)
    model.eval()
    return model, tok, ChatProcessor.for_model(tok, model, cfg.data)  # the modules' processors, as eval and generate build it


def _prompt(processor, parts):
    return processor.encode(Sample([Message("user", parts)], "t.jsonl", 1), prompt_only=True)


@pytest.mark.slow
def test_text_generation_matches_transformers_generate(built):
    """Our KV-cached greedy loop gives the token ids of transformers' own greedy ``generate``."""
    model, tok, processor = built
    enc = _prompt(processor, [Part("text", "Which digit is this?")])
    ours = generate(model, tok, enc, max_new_tokens=12)["token_ids"]
    ids = torch.tensor([enc.input_ids])
    with torch.no_grad():
        ref = model.lm.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=12,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    assert ours == ref[0, ids.shape[1] :].tolist()[: len(ours)]
    assert len(ours) == 12 or ours[-1] == tok.eos_token_id


@pytest.mark.slow
def test_image_generation_equals_teacher_forced_argmax(built, digits_jsonl, tmp_path):
    """Force the LM to open an image span; each generated code must be the argmax of the decoder
    head at the previous position when the whole sequence is run again without a cache."""
    model, tok, processor = built
    dec = model.decoders["image"]
    start = model.token_ids["decoder_start"]["image"]
    head = model.lm.get_output_embeddings()

    def bump(module, args, logits):  # make <|image_start|> the greedy first token, whatever the weights
        logits = logits.clone()
        logits[..., start] += 1e4
        return logits

    handle = head.register_forward_hook(bump)
    try:
        enc = _prompt(processor, [Part("text", "Draw the digit 7.")])
        out = generate(model, tok, enc, max_new_tokens=1)
    finally:
        handle.remove()
    assert out["token_ids"] == [start]
    (img,) = out["images"]["image"]
    n = int(dec.dummy_codes().numel())
    assert img.size == (dec.image_size, dec.image_size)
    # replay: prompt + start + codes, as one sequence, through the plain forward path
    with torch.no_grad():
        ids = enc.input_ids + [start]
        x = model.lm.get_input_embeddings()(torch.tensor([ids]))
        codes: list[int] = []
        for _ in range(n):
            seq = x if not codes else torch.cat([x, dec.embed(torch.tensor(codes)).unsqueeze(0)], dim=1)
            h = model.lm.base_model(inputs_embeds=seq, position_ids=torch.arange(seq.shape[1])[None]).last_hidden_state
            codes.append(int(dec.head(h[0, -1:]).argmax()))
    want = dec.decode(torch.tensor(codes))
    assert img.tobytes() == want.tobytes()


@pytest.mark.slow
def test_eval_accuracy_counts_exact_matches(built, digits_jsonl, tmp_path, monkeypatch):
    """``evaluate`` scores generated answers by exact match per task; compare with a manual count."""
    import omnicore.eval.loading
    from omnicore.data.jsonl import read_jsonl
    from omnicore.eval.scoring import evaluate

    model, tok, processor = built
    cfg = Config.model_validate(
        tiny_config_dict(str(digits_jsonl / "train.jsonl"), eval=str(digits_jsonl / "eval.jsonl"), output_dir=str(tmp_path / "run"))
    )
    monkeypatch.setattr(omnicore.eval.loading, "load_trained", lambda *a, **k: (model, tok, processor))
    result = evaluate(cfg, limit=8, progress=False)
    samples = read_jsonl(digits_jsonl / "eval.jsonl")[:8]
    want: dict[str, list[int]] = {}
    for s in samples:
        text = generate(model, tok, processor.encode(s, prompt_only=True), max_new_tokens=cfg.generate.max_new_tokens)["text"]
        answer = s.messages[-1].parts[0].value
        want.setdefault(s.meta["task"], []).append(int(text.strip() == answer))
    assert result["total"] == 8
    for task, hits in want.items():
        assert result["tasks"][task]["total"] == len(hits)
        assert result["tasks"][task]["correct"] == sum(hits)


@pytest.mark.slow
def test_generate_cli_labels_the_text_and_saves_images(built, tmp_path, monkeypatch):
    """``omnicore generate`` prints the text labelled and quoted (an image prompt's stray text is not
    read as an answer), then one ``saved PATH`` line per image, equal to :func:`generate`'s."""
    import omnicore.eval.loading
    from omnicore.eval.generate import generate_cli

    model, tok, processor = built
    cfg = Config.model_validate(tiny_config_dict("unused.jsonl"))
    monkeypatch.setattr(omnicore.eval.loading, "load_trained", lambda *a, **k: (model, tok, processor))
    lines = list(
        generate_cli(cfg, prompts=["Draw the digit 7."], image=None, audio=None, out_dir=str(tmp_path), checkpoint=None, export=None)
    )
    want = generate(model, tok, _prompt(processor, [Part("text", "Draw the digit 7.")]), max_new_tokens=cfg.generate.max_new_tokens)
    assert lines[0] == f"text: {want['text']!r}"
    saved = [x for x in lines[1:] if x.startswith("saved ")]
    assert len(saved) == sum(len(v) for v in want["images"].values())
    for line in saved:
        assert (tmp_path / line.split("/")[-1]).is_file()


SEQUENCE = [("3 7 1 4 2 9 0 5", " 3 7 1 4 2 9 0 5\n"), ("2 5", "2  5"), ("8 6 0", "8 6")]
"""Multi-token text answers (as video_to_text's "3 7 1") and what a stub generator answers to them:
right after ``strip``, wrong with an inner space doubled, wrong when cut short."""


def _sequence_line(answer: str) -> str:
    return json.dumps(
        {
            "task": "digit_sequence",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Which digits appear, in order?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": answer}]},
            ],
        }
    )


@pytest.fixture(scope="module")
def tasks_file(digits_jsonl) -> Path:
    """Four tasks interleaved so that file-order rows would mix them: 8 questions (image_to_text,
    audio_to_text), 3 drawings (text_to_image: text and decoder targets), 3 digit sequences."""
    questions = (digits_jsonl / "eval.jsonl").read_text().splitlines()[:8]
    drawings = [x for x in (digits_jsonl / "train.jsonl").read_text().splitlines() if '"text_to_image"' in x][:3]
    seqs = [_sequence_line(a) for a, _ in SEQUENCE]
    lines = [seqs[0], questions[0], drawings[0], questions[1], seqs[1], drawings[1], *questions[2:5], seqs[2], drawings[2], *questions[5:]]
    path = digits_jsonl / "eval_tasks.jsonl"  # beside images/: the drawings' paths are relative
    path.write_text("\n".join(lines) + "\n")
    return path


def _task_reference(model, processor, path: Path) -> dict[str, tuple[float, int, int]]:
    """Per task, ``(loss per target, targets, samples)`` one sample at a time: the text loss from
    the whole logits and plain cross-entropy, the decoder codes' from the decoder heads."""
    from omnicore.data.chat import IGNORE_INDEX
    from omnicore.data.jsonl import read_jsonl
    from omnicore.data.packing import collate

    acc: dict[str, list[float]] = {}
    with torch.no_grad():
        for s in read_jsonl(path):
            mb = collate([processor.encode(s)], processor.encoders, processor.decoders)
            out = model(mb, return_logits=True)
            labels = mb.labels.view(-1)
            total = float(torch.nn.functional.cross_entropy(out.logits.view(-1, out.logits.shape[-1]), labels, reduction="sum"))
            count = int((labels != IGNORE_INDEX).sum())
            total += sum(float(v) for v in out.decoder_loss_sums.values())
            count += sum(out.decoder_targets.values())
            t = acc.setdefault(s.meta["task"], [0.0, 0, 0])
            t[0], t[1], t[2] = t[0] + total, t[1] + count, t[2] + 1
    return {task: (v[0] / v[1], v[1], v[2]) for task, v in acc.items()}


def _answer_tokens(processor, answer: str) -> int:
    """The tokens an answer needs, from the full encoding: its targets less the end-of-turn token."""
    return (
        processor.encode(Sample([Message("user", [Part("text", "q")]), Message("assistant", [Part("text", answer)])], "t", 1)).n_targets - 1
    )


@pytest.mark.slow
def test_eval_reports_the_loss_of_every_task_as_each_task_alone(built, tasks_file, tmp_path, monkeypatch, caplog):
    """``evaluate`` gives every task (media answers included) its loss per target over its own
    samples, equal to a sample-by-sample reference; text tasks keep their accuracy; the overall
    loss is unchanged by packing per task; an answer longer than generate.max_new_tokens is warned
    about once, naming the task and the field."""
    import logging

    import omnicore.eval.loading
    from omnicore.eval.scoring import evaluate

    model, tok, processor = built
    need = _answer_tokens(processor, SEQUENCE[0][0])
    d = tiny_config_dict(str(tasks_file), eval=str(tasks_file), output_dir=str(tmp_path / "run"))
    d["generate"] = {"max_new_tokens": need - 1}
    cfg = Config.model_validate(d)
    monkeypatch.setattr(omnicore.eval.loading, "load_trained", lambda *a, **k: (model, tok, processor))
    with caplog.at_level(logging.WARNING, logger="omnicore.eval.scoring"):
        result = evaluate(cfg, limit=2, progress=False)  # generation for the first two text answers only
    ref = _task_reference(model, processor, tasks_file)
    assert sorted(result["tasks"]) == ["audio_to_text", "digit_sequence", "image_to_text", "text_to_image"]
    for task, (loss, targets, samples) in ref.items():
        got = result["tasks"][task]
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
        assert (got["loss_targets"], got["loss_samples"]) == (targets, samples)
    assert ref["text_to_image"][1] > 3 * 64  # the drawings' codes are counted (64 per 32x32 image)
    assert "accuracy" not in result["tasks"]["text_to_image"]
    assert result["tasks"]["digit_sequence"]["total"] == 1 and result["tasks"]["image_to_text"]["total"] == 1
    all_sum = sum(v[0] * v[1] for v in ref.values())
    assert result["loss"] == pytest.approx(all_sum / sum(v[1] for v in ref.values()), rel=1e-5)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned == result["warnings"]
    assert warned[0].startswith(f"digit_sequence: 1 of 1 expected answers need more than generate.max_new_tokens={need - 1} tokens")
    assert f"at least {need}" in warned[0]
    saved = json.loads((tmp_path / "run" / "eval.json").read_text())["summary"]
    assert saved["tasks"]["text_to_image"]["loss_targets"] == ref["text_to_image"][1]


def test_rows_packed_by_task_hold_one_task_packedfirst_fit_by_scan(built, tasks_file):
    """With ``by_task`` each row holds one task's samples, and each task's rows are first-fit over
    that task's samples in file order (training's packer), within the budget."""
    from omnicore.data.jsonl import read_jsonl
    from omnicore.eval.heldout import eval_rows

    _, _, processor = built
    samples = read_jsonl(tasks_file)
    task = {s.where: s.meta["task"] for s in samples}
    lengths = {s.where: len(processor.encode(s)) for s in samples}
    rows = [[e.where for e in row] for row in eval_rows(tasks_file, processor, 300, by_task=True)]
    assert all(len({task[w] for w in row}) == 1 for row in rows)
    assert all(sum(lengths[w] for w in row) <= 300 for row in rows) and max(len(row) for row in rows) >= 3
    for t in set(task.values()):
        mine = [w for w in task if task[w] == t]
        assert [row for row in rows if task[row[0]] == t] == [
            [mine[i] for i in r] for r in first_fit_by_scan([lengths[w] for w in mine], 300)
        ]
    assert sorted(w for row in rows for w in row) == sorted(task)


def test_multi_token_answers_score_by_exact_match_after_strip(built, tasks_file, monkeypatch):
    """Scoring only (a stub generator): ``" 3 7 1 ...\\n"`` matches ``"3 7 1 ..."``; a doubled inner
    space or a cut answer does not."""
    import omnicore.eval.scoring as scoring
    from omnicore.data.jsonl import read_jsonl

    model, tok, processor = built
    samples = [s for s in read_jsonl(tasks_file) if s.meta["task"] == "digit_sequence"]
    replies = {s.where: reply for s, (_, reply) in zip(samples, SEQUENCE)}
    monkeypatch.setattr(scoring, "generate_batch", lambda m, t, prompts, **k: [{"text": replies[p.where]} for p in prompts])
    cfg = Config.model_validate(tiny_config_dict(str(tasks_file)))
    summary, rows = scoring.score_samples(cfg, model, tok, processor, samples, progress=False)
    assert [r["correct"] for r in rows] == [True, False, False]
    assert [r["expected"] for r in rows] == [a for a, _ in SEQUENCE]
    assert summary["tasks"]["digit_sequence"] == {"correct": 1, "total": 3, "accuracy": pytest.approx(1 / 3)}


def test_short_answer_warning_names_task_and_field_only_when_too_short(built, tasks_file):
    from omnicore.data.jsonl import read_jsonl
    from omnicore.eval.scoring import short_answer_warnings

    _, _, processor = built
    samples = [s for s in read_jsonl(tasks_file) if s.meta["task"] in ("digit_sequence", "image_to_text")]
    longest = max(_answer_tokens(processor, a) for a, _ in SEQUENCE)
    second = sorted(_answer_tokens(processor, a) for a, _ in SEQUENCE)[-2]
    cfg = Config.model_validate(tiny_config_dict(str(tasks_file)))
    for limit, want in ((longest, []), (second, [1, longest]), (second - 1, [2, longest])):
        cfg.generate.max_new_tokens = limit
        got = short_answer_warnings(cfg, processor, samples)
        if not want:
            assert got == []
            continue
        assert len(got) == 1  # the one-digit answers of image_to_text fit
        assert got[0].startswith(f"digit_sequence: {want[0]} of 3 expected answers need more than generate.max_new_tokens={limit} ")
        assert f"raise generate.max_new_tokens to at least {want[1]} (--max-new-tokens {want[1]}" in got[0]


def test_task_line_prints_accuracy_for_text_tasks_and_loss_for_all():
    from omnicore.eval.scoring import task_line

    text = {"accuracy": 0.95, "correct": 95, "total": 100, "loss": 0.12345, "loss_targets": 300, "loss_samples": 100}
    speech = {"loss": 2.31, "loss_targets": 10000, "loss_samples": 100}
    assert (
        task_line("image_to_text", text)
        == "image_to_text: accuracy 0.950 (95/100), held-out loss 0.1235 per target (100 samples, 300 targets)"
    )
    assert task_line("text_to_speech", speech) == "text_to_speech: held-out loss 2.3100 per target (100 samples, 10000 targets)"
    assert task_line("x", {"loss_targets": 0, "loss_samples": 2}) == "x: held-out loss not computed (no targets) (2 samples, 0 targets)"
