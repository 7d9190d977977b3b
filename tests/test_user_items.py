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
