"""The command line's own rough edges: each subcommand's help ends with an example of its own use
that parses; ``train --help`` explains overrides and where keys are documented; ``null`` removes a
key; ``generate`` defaults to ``RUN_DIR/generated`` and refuses to overwrite without ``--force``;
progress in a log file is plain lines."""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import pytest

from omnicore.cli import EXAMPLES, UsageError, build_parser, generate_out_dir, main
from omnicore.config import ConfigError, TrainConfig, load_config, parse_overrides
from omnicore.progress import PlainProgress

ROOT = Path(__file__).resolve().parents[1]
DIGITS_CFG = ROOT / "examples" / "digits" / "config.yaml"
SUBCOMMANDS = ["plugins", "train", "plan", "eval", "generate", "plot", "fit-tokenizer"]


def _help(name: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices[name]  # noqa: SLF001 - argparse keeps them only there
    return sub.format_help()


def test_every_subcommand_has_an_example():
    assert sorted(EXAMPLES) == sorted(SUBCOMMANDS)
    assert sorted(build_parser()._subparsers._group_actions[0].choices) == sorted(SUBCOMMANDS)  # noqa: SLF001


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_help_ends_with_its_own_example_which_parses(name):
    text = _help(name).rstrip().splitlines()
    assert text[-2:] == ["example:", f"  {EXAMPLES[name]}"]
    argv = shlex.split(EXAMPLES[name])
    assert argv[:2] == ["omnicore", name]
    args, extra = build_parser().parse_known_args(argv[1:])
    assert args.command == name
    if name in ("train", "plan", "eval", "generate", "fit-tokenizer"):  # the overrides in it are real keys of the digits config
        load_config(args.config if Path(args.config).is_absolute() else ROOT / args.config, extra)
    else:
        assert extra == []


def test_train_help_explains_overrides_and_where_keys_are_documented():
    text = _help("train")
    for words in ("--train.max_steps 50", "null removes a key", "docs/reference/config.md", "docs/config.md"):
        assert words in text
    assert (ROOT / "docs" / "config.md").is_file()  # the pages the help points to
    assert (ROOT / "docs" / "reference" / "config.md").is_file()


def test_null_override_removes_a_key():
    base = load_config(DIGITS_CFG)
    assert base.model.decoders and base.data.eval  # the digits config has both
    assert load_config(DIGITS_CFG, ["--model.decoders", "{}"]).model.decoders.keys() == base.model.decoders.keys()  # merges
    off = ["--samples.every", "0", "--eval.every", "0"]  # they need decoders and data.eval
    gone = load_config(DIGITS_CFG, ["--model.decoders", "null", "--data.eval=null", *off])
    assert gone.model.decoders == {} and gone.data.eval is None
    one = load_config(DIGITS_CFG, ["--model.decoders.image", "null", *off])
    assert "image" not in one.model.decoders
    # a removed key that the file never had is no error, and a null inside a new mapping is dropped
    assert load_config(DIGITS_CFG, ["--train.stop_after", "null"]).train.stop_after is None
    assert parse_overrides(["--model.decoders.image", "null"]) == {"model": {"decoders": {"image": None}}}
    # a removed scalar takes the field's default, not the file's value
    assert (base.train.max_steps, base.train.lr) == (3700, 1.5e-3)
    reset = load_config(DIGITS_CFG, ["--train.max_steps", "null", "--train.lr", "null"])
    assert (reset.train.max_steps, reset.train.lr) == (
        TrainConfig.model_fields["max_steps"].default,
        TrainConfig.model_fields["lr"].default,
    )
    assert (reset.train.max_steps, reset.train.lr) == (100, 1e-3)


def test_null_inside_a_yaml_mapping_override_is_removed_too():
    cfg = load_config(DIGITS_CFG, ["--model.decoders", "{image: null}", "--samples.every", "0"])
    assert cfg.model.decoders == {}
    with pytest.raises(ConfigError, match="command line"):  # other errors in overrides still name the command line
        load_config(DIGITS_CFG, ["--train.max_steps", "-1"])


def test_generate_out_defaults_to_run_dir_and_refuses_to_overwrite(tmp_path):
    run = tmp_path / "run"
    assert generate_out_dir(None, str(run), force=False) == str(run / "generated")
    (run / "generated").mkdir(parents=True)
    (run / "generated" / "notes.txt").write_text("mine")  # not generated: no reason to refuse
    assert generate_out_dir(None, str(run), force=False) == str(run / "generated")
    for i in range(2):
        (run / "generated" / f"generated-image-{i}.png").write_bytes(b"png")
    with pytest.raises(UsageError, match=r"generated-image-0.png and 1 more\); pass --force"):
        generate_out_dir(None, str(run), force=False)
    assert generate_out_dir(None, str(run), force=True) == str(run / "generated")
    assert generate_out_dir(str(tmp_path / "elsewhere"), str(run), force=False) == str(tmp_path / "elsewhere")


def test_generate_refusal_is_one_error_line(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "generated-image-0.png").write_bytes(b"png")
    rc = main(["generate", str(DIGITS_CFG), "--prompt", "Draw the digit 7.", "--out", str(out)])
    err = capsys.readouterr().err.splitlines()  # "reading the config" (omnicore.logs), then one error line
    assert rc == 2 and [x for x in err if x.startswith("error:")] == err[-1:] == [
        f"error: {out} already holds generated media (generated-image-0.png); pass --force to overwrite them or choose another --out"
    ]


def test_plain_progress_lines():
    now = [0.0]
    stream = io.StringIO()
    bar = PlainProgress(10, 2, every_s=30.0, stream=stream, clock=lambda: now[0])
    for step in range(3, 11):  # a run resumed after step 2; 10 s per step
        now[0] += 10.0
        bar.set_postfix({"loss": f"{1 / step:.4f}"})
        bar.update(1)
    bar.close()
    # the first step, then each line once 30 s have passed since the previous one, and the last step
    assert stream.getvalue().splitlines() == [
        "train: step 3/10 (30%), loss 0.3333; 10 s elapsed, about 70 s left",
        "train: step 6/10 (60%), loss 0.1667; 40 s elapsed, about 40 s left",
        "train: step 9/10 (90%), loss 0.1111; 70 s elapsed, about 10 s left",
        "train: step 10/10 (100%), loss 0.1000; 80 s elapsed",
    ]
