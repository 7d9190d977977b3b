"""Smaller things a new user met (issue 27, item 9), each fed the input that failed: repeated media
flags of ``omnicore generate``, the byte tokenizer's export without a chat template, the ``datasets``
progress bar, ``error:`` lines under torchrun, a mistyped local folder, and a component's options.
All in-process, on tiny objects."""

from __future__ import annotations

import pytest

from omnicore.config import ConfigError

# ---- omnicore generate: repeated --image / --audio / --video pair with the prompts -------------------


class _Recorder:
    """A stand-in ChatProcessor: records the parts of each prompt it encodes."""

    end_of_turn_id = 0

    def __init__(self) -> None:
        self.parts: list[list[tuple[str, str]]] = []

    def encode(self, sample, prompt_only=False):
        assert prompt_only
        self.parts.append([(p.type, p.value) for p in sample.messages[0].parts])
        return len(self.parts) - 1


def _generate(monkeypatch, tmp_path, prompts, **media):
    """``generate_cli`` with the model stubbed out: returns the parts each prompt was encoded with."""
    from conftest import tiny_config_dict

    import omnicore.eval.generate as gen
    from omnicore.config import Config

    recorder = _Recorder()
    monkeypatch.setattr(gen, "load_on_device", lambda *a: (None, None, recorder))
    monkeypatch.setattr(gen, "generate_answers", lambda cfg, m, t, p, encoded: ({"text": f"#{e}", "images": {}} for e in encoded))
    cfg = Config.model_validate(tiny_config_dict("unused.jsonl", decoders=False))
    media = {"image": None, "audio": None, **media}
    lines = list(gen.generate_cli(cfg, prompts=prompts, out_dir=str(tmp_path), checkpoint=None, export=None, **media))
    return recorder.parts, lines


def test_repeated_media_flags_pair_with_the_prompts_in_order(monkeypatch, tmp_path):
    """Two ``--image`` for two prompts: the k-th image goes with the k-th prompt (before the fix
    the last image went with both). One ``--audio`` still goes with every prompt."""
    parts, lines = _generate(monkeypatch, tmp_path, ["first", "second"], image=["a.png", "b.png"], audio=["x.wav"], video=["v1", "v2"])
    assert parts == [
        [("image", "a.png"), ("audio", "x.wav"), ("video", "v1"), ("text", "first")],
        [("image", "b.png"), ("audio", "x.wav"), ("video", "v2"), ("text", "second")],
    ]
    assert lines == ["prompt 1, sample 1: text: '#0'", "prompt 2, sample 1: text: '#1'"]
    parts, _ = _generate(monkeypatch, tmp_path, ["only"], image="c.png")  # one path, as before
    assert parts == [[("image", "c.png"), ("text", "only")]]


@pytest.mark.parametrize(
    ("media", "words"),
    [
        ({"image": ["a.png", "b.png", "c.png"]}, "--image given 3 times for 2 prompt(s)"),
        ({"audio": ["a.wav", "b.wav", "c.wav"]}, "--audio given 3 times for 2 prompt(s)"),
        ({"video": ["a.mp4", "b.mp4", "c.mp4"]}, "--video given 3 times for 2 prompt(s)"),
    ],
)
def test_media_flags_of_another_count_are_refused(monkeypatch, tmp_path, media, words):
    with pytest.raises(ConfigError) as info:
        _generate(monkeypatch, tmp_path, ["first", "second"], **media)
    flag = words.split()[0]
    assert str(info.value) == (
        f"{words}: give it once (the same {flag[2:]} with every prompt) or once per --prompt (the k-th {flag} goes with the k-th --prompt)"
    )


def test_generate_parser_collects_every_media_flag():
    from omnicore.cli import build_parser

    args, _ = build_parser().parse_known_args(
        ["generate", "c.yaml", "--prompt", "p", "--prompt", "q", "--image", "a.png", "--image", "b.png", "--video", "v.mp4"]
    )
    assert (args.image, args.audio, args.video) == (["a.png", "b.png"], None, ["v.mp4"])


# ---- an export of the byte tokenizer carries the chat template it was trained with -------------------


def _byte_tokenizer():
    from conftest import TINY_LM

    from omnicore.model.build import prepare_tokenizer
    from omnicore.model.foundation import HFCausalLM

    return prepare_tokenizer(HFCausalLM({"config": dict(TINY_LM), "tokenizer": "byte"}).build_tokenizer(), ["image"], ["image"])


def test_byte_tokenizer_export_renders_the_training_text(tmp_path):
    """Before: the export had no ``chat_template`` and ``apply_chat_template`` raised. Now it renders
    what ChatProcessor trains on, system prompt included (a prompt with quotes, braces, a backslash
    and non-ASCII survives), and omnicore reading the export through that template gets the same
    ids and labels as ChatML."""
    from conftest import tiny_config_dict
    from transformers import AutoTokenizer

    from omnicore.checkpoint.export import save_tokenizer
    from omnicore.config import Config
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.jsonl import Message, Part, Sample

    system = 'Be brief. "Quoted" {{ x }} {% if %} a\\b é 😀\nEND @SYSTEM@'
    data = Config.model_validate(tiny_config_dict("unused.jsonl")).data.model_copy(update={"system_prompt": system})
    tok = _byte_tokenizer()
    assert tok.chat_template is None
    save_tokenizer(tok, data, tmp_path / "export", {"image": None}, {"image": None})
    assert tok.chat_template is None  # the run's tokenizer is left as it was
    saved = AutoTokenizer.from_pretrained(tmp_path / "export")

    turns = [("user", "What is 2+2?"), ("assistant", "4"), ("user", " <|im_end|> spaced \n")]
    sample = Sample([Message(r, [Part("text", t)]) for r, t in turns], "x.jsonl", 1)
    chatml = ChatProcessor(tok, {"image": None}, {"image": None}, system)
    assert chatml.template is None  # trained on omnicore's ChatML
    messages = [{"role": r, "content": t} for r, t in turns]
    for prompt_only in (False, True):
        want = chatml.encode(sample, prompt_only=prompt_only)
        shown = messages[:-1] if prompt_only and turns[-1][0] == "assistant" else messages
        text = saved.apply_chat_template(shown, tokenize=False, add_generation_prompt=prompt_only)
        assert text == tok.decode(want.input_ids)
        assert text.startswith(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n")
        templated = ChatProcessor(saved, {"image": None}, {"image": None}, system)
        assert templated.template is not None  # the export's own template, as `data.chat_template: auto` reads it
        got = templated.encode(sample, prompt_only=prompt_only)
        assert (got.input_ids, got.labels) == (want.input_ids, want.labels)
    media = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which?"}]}]
    assert (
        saved.apply_chat_template(media, tokenize=False)
        == f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n<|image_pad|>Which?<|im_end|>\n"
    )
    with pytest.raises(Exception, match="a video part in a user message: this model has no video encoder"):
        saved.apply_chat_template([{"role": "user", "content": [{"type": "video"}]}], tokenize=False)
    from omnicore.data.chatml import chatml_template

    tok.chat_template = chatml_template()  # no system prompt: none is added
    assert tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


# ---- reading Parquet draws no `datasets` progress bar -----------------------------------------------


def test_reading_parquet_draws_no_datasets_progress_bar(tmp_path, capfd):
    """``datasets`` alone draws "Generating train split" for a Parquet file; omnicore's reading of
    the same file draws nothing, and leaves the bars switched on for the program's own use."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.utils import is_progress_bar_enabled

    from omnicore.config import SourceConfig
    from omnicore.data.hf_tables import load_file

    file = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "answer": ["1", "2", "3"]}), file)
    capfd.readouterr()
    datasets.load_dataset("parquet", data_files={"train": [str(file)]}, split="train", cache_dir=str(tmp_path / "by-hand"))
    assert "Generating train split" in capfd.readouterr().err  # the reference: the bar omnicore used to show
    assert is_progress_bar_enabled()
    ds = load_file("parquet", file, SourceConfig(dataset=str(file)), tmp_path / "ours")
    assert capfd.readouterr().err == ""
    assert ds["prompt"] == ["a", "b", "c"] and is_progress_bar_enabled()


# ---- under torchrun an error is printed once ----------------------------------------------------------


def _stderr_of_ranks(monkeypatch, capsys, errors: list[BaseException]) -> str:
    """What ``omnicore plan`` prints on stderr, rank after rank of a 2-rank torchrun, when rank r's
    command raises ``errors[r]``; every rank exits 2."""
    import omnicore.cli as cli

    out = ""
    for rank, exc in enumerate(errors):
        monkeypatch.setenv("WORLD_SIZE", str(len(errors)))
        monkeypatch.setenv("RANK", str(rank))

        def fail(args, extra, exc=exc):
            raise exc

        monkeypatch.setattr(cli, "cmd_plan", fail)
        capsys.readouterr()
        assert cli.main(["plan", "unused.yaml", "--world-size", "2"]) == 2
        out += capsys.readouterr().err
    return out


def test_an_error_every_rank_meets_is_printed_once_by_rank_0(monkeypatch, capsys):
    """Before: each rank printed ``error: ...``, so two ranks showed the line twice, unprefixed."""
    message = "cfg.yaml: train.lr: must be a finite number"
    assert _stderr_of_ranks(monkeypatch, capsys, [ConfigError(message), ConfigError(message)]) == f"error: {message}\n"


def test_an_error_of_one_rank_is_printed_by_it_with_its_rank(monkeypatch, capsys):
    """Rank 1 reads a bad sample; rank 0 stops because rank 1 did (the echo the training loop
    raises): one line, from rank 1, prefixed."""
    from omnicore.data.jsonl import SampleError
    from omnicore.logs import echo_of_other_rank

    bad = SampleError("data.jsonl:3: invalid JSON")
    echo = echo_of_other_rank(SampleError("1 rank(s) stopped on a data error (see that rank's error); this rank 0 stops too"))
    assert _stderr_of_ranks(monkeypatch, capsys, [echo, bad]) == "[rank1] error: data.jsonl:3: invalid JSON\n"
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: as it always was
    monkeypatch.setenv("RANK", "0")
    from omnicore.logs import error_line

    assert error_line("x", alike=False) == error_line("x", alike=True) == "error: x"


# ---- a mistyped local folder says "no such folder" with the resolved path -------------------------------


@pytest.fixture
def tree(tmp_path):
    """A config file next to ``runs/digits/export`` and ``model``."""
    (tmp_path / "runs" / "digits" / "export").mkdir(parents=True)
    (tmp_path / "model").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("value", "there", "part", "meant"),
    [
        ("runs/digts/export", "runs", "digts", "runs/digits/export"),  # not a model id: a path
        ("runs/digitz", "runs", "digitz", "runs/digits"),  # shaped like org/name, but runs/ is here
        ("./modle", ".", "modle", "model"),
        ("runs/digits/export/foundation", "runs/digits/export", "foundation", None),
    ],
)
def test_a_mistyped_folder_is_named_resolved(tree, value, there, part, meant):
    """Before: ``runs/digitz`` got a Hugging Face download hint, ``runs/digts/export`` the
    component's "has no config.json"; now each is "no such folder" with the absolute path, the
    deepest folder that exists and, when one is close, the folder meant."""
    import json

    from conftest import tiny_config_dict

    from omnicore.config import load_config
    from omnicore.model.build import build_processors
    from omnicore.registry import RegistryError

    d = tiny_config_dict("unused.jsonl", decoders=False)
    d["model"]["encoders"]["image"]["options"] = {"checkpoint": value}
    (tree / "cfg.yaml").write_text(json.dumps(d))
    with pytest.raises(RegistryError) as info:
        build_processors(load_config(str(tree / "cfg.yaml"), []))
    root = tree.resolve()
    hint = f"; did you mean {root / meant}?" if meant else ""
    assert str(info.value) == (
        f"model.encoders.image: options.checkpoint: no such folder: {root / value} ({(root / there).resolve()} has no {part!r}{hint})"
    )


def test_a_model_name_not_cached_names_the_folder_it_looked_for(tree, monkeypatch):
    """``exprt/digits`` has a model id's shape and no folder ``exprt/`` is here: it may be a model, so
    the cache is asked; the refusal names the absolute folder it looked for and the one meant."""
    import huggingface_hub.constants as hub

    from omnicore.model.loading import LoadError, resolve_pretrained

    (tree / "export" / "digits").mkdir(parents=True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tree / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    with pytest.raises(LoadError) as info:
        resolve_pretrained("exprt/digits", base=tree, what="options.checkpoint")
    looked, meant = (tree / "exprt" / "digits").resolve(), (tree / "export" / "digits").resolve()
    assert str(info.value).startswith(
        f"options.checkpoint: 'exprt/digits' is neither a folder (looked for '{looked}'; did you mean '{meant}'?) nor a model in the "
        "local Hugging Face cache"
    )


# ---- omnicore plugins --options NAME ------------------------------------------------------------------


def test_plugins_options_lists_each_option_with_type_default_and_description(capsys):
    """Before: the options were only in the source. Now each field of the options model is a row:
    its name, type (with bounds), default and description."""
    import json

    from omnicore.cli import main
    from omnicore.model.foundation import HFCausalLMOptions

    assert main(["plugins", "--options", "hf_causal_lm", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["component"] == "foundation/hf_causal_lm" and got["options_model"] == "omnicore.model.foundation:HFCausalLMOptions"
    assert [o["name"] for o in got["options"]] == list(HFCausalLMOptions.model_fields)
    rows = {o["name"]: o for o in got["options"]}
    assert rows["tokenizer"] == {
        "name": "tokenizer",
        "type": "str | null",
        "default": "null",
        "description": "'byte', or a local tokenizer folder; default: the checkpoint's own, else 'byte'",
    }
    assert (rows["config"]["type"], rows["init_fresh"]["type"], rows["init_fresh"]["default"]) == (
        "dict[str, any] | null",
        "list[str]",
        "[]",
    )

    assert main(["plugins", "--options", "kernel/chunked_cross_entropy"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("kernel/chunked_cross_entropy from omnicore ")
    assert lines[0].endswith(": options (omnicore.kernels.cross_entropy:ChunkedCrossEntropyOptions; unknown keys are refused)")
    assert lines[1].split() == ["NAME", "TYPE", "DEFAULT", "DESCRIPTION"]
    assert lines[2].startswith("chunk_size  int, > 0  1024     rows (tokens) per chunk;")
    assert main(["plugins", "--options", "fsdp2"]) == 0
    assert capsys.readouterr().out.endswith("takes no options (any key under options is refused)\n")


def test_plugins_options_of_an_unknown_name_is_one_error_line(capsys):
    from omnicore.cli import main

    assert main(["plugins", "--options", "hf_causal"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no component named 'hf_causal'; did you mean 'hf_causal_lm'? Known components: ") and err.count("\n") == 1
