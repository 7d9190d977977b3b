"""``omnicore fit-tokenizer``: a byte-level BPE fitted on the run's training text (omnicore.model.text_tokenizer)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import tiny_config_dict

from omnicore.cli import main
from omnicore.config import load_config
from omnicore.model.text_tokenizer import fit_bpe, save_tokenizer, training_texts


def _write_config(tmp_path, digits_jsonl, **over):
    cfg = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(tmp_path / "run"))
    for k, v in over.items():
        cfg["model"]["foundation"]["options"][k] = v
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_training_texts_are_every_text_part_of_the_data(tmp_path, digits_jsonl):
    cfg = load_config(_write_config(tmp_path, digits_jsonl))
    texts = list(training_texts(cfg))
    expected = []
    for line in (digits_jsonl / "train.jsonl").read_text().splitlines():
        for m in json.loads(line)["messages"]:
            expected += [p["text"] for p in m["content"] if p["type"] == "text"]
    assert texts == expected + ["system", "user", "assistant"]
    first3 = [json.loads(line) for line in (digits_jsonl / "train.jsonl").read_text().splitlines()[:3]]
    parts = [p["text"] for s in first3 for m in s["messages"] for p in m["content"] if p["type"] == "text"]
    assert list(training_texts(cfg, limit=3)) == parts + ["system", "user", "assistant"]


def test_frequent_words_become_single_tokens_and_any_text_still_round_trips():
    texts = ["Which digit is this?", "Which digit is spoken?", "Draw the digit 7."] * 200 + ["user", "assistant"]
    tok = fit_bpe(texts, 320)
    assert tok.get_vocab_size() <= 320
    assert len(tok.encode("Which digit is this?").ids) <= 5  # 20 bytes
    for text in ["Which digit is this?", "zebra ünïcødé 😀 \t\n  spaces", "<|im_start|> not special here"]:
        enc = tok.encode(text)
        assert tok.decode(enc.ids) == text  # every byte is in the vocabulary
    assert fit_bpe(texts, 320).get_vocab() == tok.get_vocab()  # deterministic
    with pytest.raises(ValueError, match="below 256"):
        fit_bpe(texts, 200)


def test_saved_folder_loads_with_auto_tokenizer_as_the_model_type_would(tmp_path):
    from transformers import AutoTokenizer

    tok = fit_bpe(["Which digit is this?"] * 50, 300)
    folder = save_tokenizer(tok, tmp_path / "tok", model_type="qwen2")
    loaded = AutoTokenizer.from_pretrained(folder)
    assert loaded("Which digit is this?")["input_ids"] == tok.encode("Which digit is this?").ids
    assert not (folder / "config.json").exists()


def test_cli_fits_and_training_uses_it_through_a_relative_path(tmp_path, digits_jsonl, capsys):
    from omnicore.model.build import build_omni_model

    cfg_path = _write_config(tmp_path, digits_jsonl)
    assert main(["fit-tokenizer", str(cfg_path), "--vocab-size", "300", "--out", str(tmp_path / "tok")]) == 0
    out = capsys.readouterr().out
    assert "bytes per token" in out and (tmp_path / "tok" / "tokenizer.json").is_file()
    cfg = load_config(_write_config(tmp_path, digits_jsonl, tokenizer="tok"))  # relative to the config file
    _, tok = build_omni_model(cfg)
    ids = tok("Which digit is this?")["input_ids"]
    assert len(ids) <= 6 and tok.decode(ids) == "Which digit is this?"
