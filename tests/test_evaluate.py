"""Generation and evaluation, checked against computations done another way."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config_dict

from omnicore.config import Config
from omnicore.data.jsonl import Message, Part, Sample
from omnicore.evaluate import generate
from omnicore.model.build import build_omni_model


@pytest.fixture(scope="module")
def built(digits_jsonl):
    from omnicore.data.chat import ChatProcessor

    cfg = Config.model_validate(tiny_config_dict(str(digits_jsonl / "train.jsonl")))
    model, tok = build_omni_model(cfg)
    model.eval()
    return model, tok, ChatProcessor(tok, dict(model.encoders), dict(model.decoders))


def _prompt(processor, parts):
    return processor.encode(Sample([Message("user", parts)], "t.jsonl", 1), prompt_only=True)


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


def test_image_generation_equals_teacher_forced_argmax(built, digits_jsonl, tmp_path):
    """Force the LM to open an image span; each generated code must be the argmax of the decoder
    head at the previous position when the whole sequence is run again without a cache."""
    model, tok, processor = built
    dec = model.decoders["image"]
    start = model.token_ids["decoder_start"]["image"]
    head = model.lm.get_output_embeddings()
    saved = head.weight.data.clone()
    try:
        head.weight.data[start] += 50.0  # make <|image_start|> the greedy first token
        enc = _prompt(processor, [Part("text", "Draw the digit 7.")])
        out = generate(model, tok, enc, max_new_tokens=1)
    finally:
        head.weight.data.copy_(saved)
    assert out["token_ids"] == [start]
    (img,) = out["images"]["image"]
    n = int(dec.dummy_codes().numel())
    assert img.size == (dec.image_size, dec.image_size)
    # replay: prompt + start + codes, as one sequence, through the plain forward path
    with torch.no_grad():
        head.weight.data[start] += 50.0
        try:
            ids = enc.input_ids + [start]
            x = model.lm.get_input_embeddings()(torch.tensor([ids]))
            codes: list[int] = []
            for _ in range(n):
                seq = x if not codes else torch.cat([x, dec.embed(torch.tensor(codes)).unsqueeze(0)], dim=1)
                h = model.lm.base_model(inputs_embeds=seq, position_ids=torch.arange(seq.shape[1])[None]).last_hidden_state
                codes.append(int(dec.head(h[0, -1:]).argmax()))
        finally:
            head.weight.data.copy_(saved)
    want = dec.decode(torch.tensor(codes))
    assert img.tobytes() == want.tobytes()


def test_eval_accuracy_counts_exact_matches(built, digits_jsonl, tmp_path, monkeypatch):
    """``evaluate`` scores generated answers by exact match per task; compare with a manual count."""
    import omnicore.evaluate as ev
    from omnicore.data.jsonl import read_jsonl

    model, tok, processor = built
    cfg = Config.model_validate(
        tiny_config_dict(str(digits_jsonl / "train.jsonl"), eval=str(digits_jsonl / "eval.jsonl"), output_dir=str(tmp_path / "run"))
    )
    monkeypatch.setattr(ev, "load_trained", lambda *a, **k: (model, tok, processor))
    result = ev.evaluate(cfg, limit=8, progress=False)
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


def test_generate_cli_labels_the_text_and_saves_images(built, tmp_path, monkeypatch):
    """``omnicore generate`` prints the text labelled and quoted (an image prompt's stray text is not
    read as an answer), then one ``saved PATH`` line per image, equal to :func:`generate`'s."""
    import omnicore.evaluate as ev

    model, tok, processor = built
    cfg = Config.model_validate(tiny_config_dict("unused.jsonl"))
    monkeypatch.setattr(ev, "load_trained", lambda *a, **k: (model, tok, processor))
    lines = list(
        ev.generate_cli(cfg, prompts=["Draw the digit 7."], image=None, audio=None, out_dir=str(tmp_path), checkpoint=None, export=None)
    )
    want = generate(model, tok, _prompt(processor, [Part("text", "Draw the digit 7.")]), max_new_tokens=cfg.generate.max_new_tokens)
    assert lines[0] == f"text: {want['text']!r}"
    saved = [x for x in lines[1:] if x.startswith("saved ")]
    assert len(saved) == sum(len(v) for v in want["images"].values())
    for line in saved:
        assert (tmp_path / line.split("/")[-1]).is_file()
