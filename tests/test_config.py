"""load_config: strict keys with closest-key hints, dotted overrides with YAML typing, clear file errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from omnicore.config import Config, ConfigError, load_config, parse_overrides

BASE = """\
run:
  output_dir: runs/x
  seed: 1
model:
  foundation:
    name: hf_causal_lm
    options:
      config: {model_type: qwen2, hidden_size: 32}
  encoders:
    audio:
      name: whisper
      options: {pool: 5}
data:
  train: data/train.jsonl
train:
  max_steps: 10
  lr: 0.01
"""


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def error_of(path: Path, overrides=None) -> str:
    with pytest.raises(ConfigError) as ei:
        load_config(path, overrides)
    return str(ei.value)


def test_valid_config_loads_with_defaults(tmp_path):
    p = write(tmp_path, BASE)
    cfg = load_config(p)
    assert isinstance(cfg, Config)
    assert cfg.source == str(p)
    assert (cfg.run.output_dir, cfg.run.seed, cfg.run.device, cfg.run.dtype) == ("runs/x", 1, "auto", "float32")
    assert cfg.model.foundation.name == "hf_causal_lm"
    assert cfg.model.foundation.options == {"config": {"model_type": "qwen2", "hidden_size": 32}}
    assert cfg.model.encoders["audio"].name == "whisper"
    assert cfg.model.encoders["audio"].options == {"pool": 5}
    assert cfg.model.decoders == {}
    assert cfg.model.kernel_choices()["attention"].name == "sdpa"
    assert (cfg.train.max_steps, cfg.train.lr, cfg.train.warmup_steps, cfg.train.betas) == (10, 0.01, 10, (0.9, 0.95))
    assert cfg.data.train == "data/train.jsonl" and cfg.data.eval is None and cfg.data.max_tokens == 1024
    assert cfg.parallel.strategies is None and cfg.generate.max_new_tokens == 8
    assert [c.name for c in cfg.parallel.strategy_list(True)] == ["fsdp2"] and [c.name for c in cfg.parallel.strategy_list(False)] == [
        "none"
    ]
    # data paths resolve relative to the config file's folder
    assert cfg.resolve_path(cfg.data.train) == tmp_path / "data" / "train.jsonl"
    assert cfg.resolve_path("/abs/x.jsonl") == Path("/abs/x.jsonl")


def test_empty_sections_get_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "data: {train: t.jsonl}\n"))
    assert cfg.train.max_steps == 100 and cfg.model.foundation.name == "hf_causal_lm" and cfg.run.seed == 0


# ---- misspelt keys at several depths -------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("train:\n  max_steps: 10", "trian:\n  max_steps: 10", "trian: unknown key; did you mean 'train'?"),
        ("  max_steps: 10", "  max_step: 10", "train.max_step: unknown key; did you mean 'max_steps'?"),
        ("      options: {pool: 5}", "      optoins: {pool: 5}", "model.encoders.audio.optoins: unknown key; did you mean 'options'?"),
        ("  seed: 1", "  sed: 1", "run.sed: unknown key; did you mean 'seed'?"),
        (
            "  train: data/train.jsonl",
            "  train: data/train.jsonl\n  max_token: 5",
            "data.max_token: unknown key; did you mean 'max_tokens'?",
        ),
    ],
    ids=["section", "train.max_step", "encoder-options", "run.sed", "data.max_token"],
)
def test_misspelt_key_names_file_dotted_key_and_closest(tmp_path, old, new, expected):
    assert old in BASE
    p = write(tmp_path, BASE.replace(old, new, 1))
    msg = error_of(p)
    assert msg == f"{p}: {expected}"


def test_misspelt_required_key_reports_both_problems(tmp_path):
    p = write(tmp_path, BASE.replace("    name: hf_causal_lm", "    nmae: hf_causal_lm"))
    assert error_of(p).splitlines() == [
        f"{p}: model.foundation.name: required key is missing",
        f"{p}: model.foundation.nmae: unknown key; did you mean 'name'?",
    ]


def test_unknown_key_without_close_match_lists_valid_keys(tmp_path):
    p = write(tmp_path, BASE + "generate:\n  qqqqqqq: 3\n")
    assert error_of(p) == f"{p}: generate.qqqqqqq: unknown key; valid keys: max_new_tokens, temperature, top_k, top_p, batch_size"


def test_several_errors_each_on_its_own_line(tmp_path):
    p = write(tmp_path, BASE.replace("  max_steps: 10", "  max_step: 10").replace("  lr: 0.01", "  lr: -1"))
    lines = error_of(p).splitlines()
    assert f"{p}: train.max_step: unknown key; did you mean 'max_steps'?" in lines
    assert f"{p}: train.lr: Input should be greater than 0" in lines
    assert len(lines) == 2


def test_invalid_value_names_key(tmp_path):
    p = write(tmp_path, BASE.replace("  seed: 1", "  seed: 1\n  device: tpu"))
    msg = error_of(p)
    assert msg.startswith(f"{p}: run.device: Input should be 'auto', 'cpu' or 'cuda'")


# ---- overrides --------------------------------------------------------------------------------


def test_dotted_overrides_applied_with_yaml_typing(tmp_path):
    p = write(tmp_path, BASE)
    cfg = load_config(
        p,
        [
            "--train.max_steps",
            "50",
            "--run.seed=3",
            "--train.betas",
            "[0.8, 0.99]",
            "--train.export",
            "false",
            "--train.lr=2e-4",
            "--model.encoders.audio.options.layers",
            "[1, 2, 3]",
            "--model.encoders.image.name",
            "siglip",
            "--data.eval",
            "data/eval.jsonl",
        ],
    )
    assert cfg.train.max_steps == 50 and isinstance(cfg.train.max_steps, int)
    assert cfg.run.seed == 3
    assert cfg.train.betas == (0.8, 0.99)
    assert cfg.train.export is False
    assert cfg.train.lr == pytest.approx(2e-4)
    # merged into, not replacing, the YAML's nested mappings
    assert cfg.model.encoders["audio"].options == {"pool": 5, "layers": [1, 2, 3]}
    assert cfg.model.encoders["audio"].name == "whisper"
    assert cfg.model.encoders["image"].name == "siglip"
    assert cfg.data.eval == "data/eval.jsonl" and cfg.data.train == "data/train.jsonl"
    assert cfg.run.output_dir == "runs/x" and cfg.train.lr != 0.01


def test_parse_overrides_shapes():
    assert parse_overrides(["--train.max_steps", "50", "--run.seed=3", "--a.b.c", "[1, x]", "--t.flag=true"]) == {
        "train": {"max_steps": 50},
        "run": {"seed": 3},
        "a": {"b": {"c": [1, "x"]}},
        "t": {"flag": True},
    }
    with pytest.raises(ConfigError, match="override 'train.max_steps': expected --section.key VALUE"):
        parse_overrides(["train.max_steps", "5"])
    with pytest.raises(ConfigError, match="override --train.max_steps has no value"):
        parse_overrides(["--train.max_steps"])
    with pytest.raises(ConfigError, match="override --train.lr.x conflicts with another override"):
        parse_overrides(["--train.lr", "1", "--train.lr.x", "2"])


def test_override_with_unknown_key_errors_like_the_file(tmp_path):
    p = write(tmp_path, BASE)
    assert (
        error_of(p, ["--train.max_step", "5"]) == "command line (--train.max_step): train.max_step: unknown key; did you mean 'max_steps'?"
    )
    assert error_of(p, ["--trian.max_steps=5"]) == "command line (--trian): trian: unknown key; did you mean 'train'?"
    assert error_of(p, ["--model.encoders.audio.optoins.pool", "2"]) == (
        "command line (--model.encoders.audio.optoins): model.encoders.audio.optoins: unknown key; did you mean 'options'?"
    )


def test_override_with_bad_value(tmp_path):
    p = write(tmp_path, BASE)
    msg = error_of(p, ["--train.max_steps", "0"])
    assert msg == "command line (--train.max_steps): train.max_steps: Input should be greater than 0"


# ---- file-level errors ------------------------------------------------------------------------


def test_invalid_yaml_reports_file_and_line(tmp_path):
    p = write(tmp_path, "data:\n  train: t.jsonl\ntrain:\n\tmax_steps: 3\n")
    assert error_of(p) == f"{p}:4: not valid YAML: while scanning for the next token, found character '\\t' that cannot start any token"
    p = write(tmp_path, "data:\n  train: t.jsonl\ntrain:\n  max_steps: [1, 2\n  lr: 3\n", name="b.yaml")
    msg = error_of(p)
    assert msg == f"{p}:5: not valid YAML: while parsing a flow sequence, expected ',' or ']', but got ':'"
    assert "\n" not in msg and "<unicode string>" not in msg  # one clean line for the CLI


def test_top_level_must_be_mapping(tmp_path):
    p = write(tmp_path, "- a\n- b\n")
    assert error_of(p).startswith(f"{p}: the top level must be a mapping of sections")


def test_missing_data_train_is_required(tmp_path):
    p = write(tmp_path, "data:\n  max_tokens: 64\n")
    assert error_of(p) == f"{p}: data: give data.train (one JSONL file) or data.sources (a list of sources), exactly one of them"
    p = write(tmp_path, "train:\n  max_steps: 3\n", name="nodata.yaml")
    assert error_of(p) == f"{p}: data: required key is missing"
    p = write(tmp_path, "", name="empty.yaml")
    assert error_of(p) == f"{p}: data: required key is missing"


def test_missing_data_train_satisfied_by_override(tmp_path):
    p = write(tmp_path, "train:\n  max_steps: 3\n")
    cfg = load_config(p, ["--data.train", "x.jsonl"])
    assert cfg.data.train == "x.jsonl" and cfg.train.max_steps == 3


def test_missing_config_file_is_named(tmp_path):
    missing = tmp_path / "nope" / "config.yaml"
    assert error_of(missing) == f"config file not found: {missing}"
    # a directory is not a config file either
    assert error_of(tmp_path) == f"config file not found: {tmp_path}"


@pytest.mark.parametrize(
    "key, value, new",
    [
        ("model.attention", "eager", "model.kernels.attention"),
        ("parallel.strategy", "fsdp2", "parallel.strategies"),
        ("train.activation_checkpointing", "full", "parallel.strategies"),
        ("train.ac_every", "2", "parallel.strategies"),
        ("train.compile", "true", "parallel.strategies"),
        ("train.compile_backend", "aot_eager", "parallel.strategies"),
    ],
)
def test_removed_alias_names_the_one_spelling(tmp_path, key, value, new):
    """Each config concept is said once: the old spelling of an alias pair is an error that names the
    key to use, from the file and from the command line alike."""
    from omnicore.config import REMOVED_KEYS

    section, name = key.split(".")
    path = write(tmp_path, yaml.safe_dump({"data": {"train": "t.jsonl"}, section: {name: yaml.safe_load(value)}}))
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert str(ei.value) == f"{path}: {key}: was removed; use {REMOVED_KEYS[key]}"
    assert REMOVED_KEYS[key].startswith(new)
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, "data: {train: t.jsonl}\n"), [f"--{key}", value])
    assert str(ei.value) == f"command line (--{key}): {key}: was removed; use {REMOVED_KEYS[key]}"


MOVED = [
    ("train.eval_every", "5", "eval.every"),
    ("train.eval_max_samples", "8", "eval.max_samples"),
    ("train.eval_task_samples", "4", "eval.task_samples"),
    ("train.sample_every", "10", "samples.every"),
    ("train.sample_prompts", "['Draw the digit 1.']", "samples.prompts"),
]
"""Every key that moved to the ``eval`` / ``samples`` sections, with a value it may take."""


def test_every_moved_key_is_tested():
    from omnicore.config import MOVED_KEYS

    assert sorted(old for old, _, _ in MOVED) == sorted(f"{s}.{k}" for s, keys in MOVED_KEYS.items() for k in keys)
    assert {old: new for old, _, new in MOVED} == {f"{s}.{k}": new for s, keys in MOVED_KEYS.items() for k, new in keys.items()}


@pytest.mark.parametrize("old, value, new", MOVED)
def test_moved_key_in_its_old_place_names_the_new_spelling(tmp_path, old, value, new):
    """The old key is an error naming it and its new spelling, from the file and from the command
    line alike, and from ``Config.model_validate`` itself; the value loads in its new place."""
    from pydantic import ValidationError

    section, name = old.split(".")
    raw = {"data": {"train": "t.jsonl", "eval": "e.jsonl"}, section: {name: yaml.safe_load(value)}}
    assert error_of(write(tmp_path, yaml.safe_dump(raw))) == f"{tmp_path / 'config.yaml'}: {old}: moved to {new}"
    override = write(tmp_path, "data: {train: t.jsonl, eval: e.jsonl}\n", "plain.yaml")
    assert error_of(override, [f"--{old}", value]) == f"command line (--{old}): {old}: moved to {new}"
    with pytest.raises(ValidationError, match=f"{old} moved to {new}"):
        Config.model_validate(raw)
    # the new place: with what the eval and samples sections need beside it (every, prompts, decoders)
    full = {
        "data": {"train": "t.jsonl", "eval": "e.jsonl"},
        "model": {"decoders": {"image": {"name": "movqgan"}}},
        "eval": {"every": 1, "task_samples": 1},
        "samples": {"every": 1, "prompts": ["Draw."]},
    }
    new_section, new_name = new.split(".")
    full[new_section][new_name] = yaml.safe_load(value)
    got = getattr(getattr(load_config(write(tmp_path, yaml.safe_dump(full), "new.yaml")), new_section), new_name)
    assert got == yaml.safe_load(value)


def test_several_moved_keys_give_one_line_each_and_other_keys_still_validate(tmp_path):
    path = write(tmp_path, "data: {train: t.jsonl}\ntrain: {eval_every: 5, sample_every: 10, max_steps: 3}\n")
    assert error_of(path).splitlines() == [
        f"{path}: train.eval_every: moved to eval.every",
        f"{path}: train.sample_every: moved to samples.every",
    ]
    typo = write(tmp_path, "data: {train: t.jsonl}\neval: {evry: 2}\nsamples: {prompt: [a]}\n", "typo.yaml")
    assert error_of(typo).splitlines() == [
        f"{typo}: eval.evry: unknown key; did you mean 'every'?",
        f"{typo}: samples.prompt: unknown key; did you mean 'prompts'?",
    ]
