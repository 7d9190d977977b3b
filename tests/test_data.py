"""Data side: chat template and pre-shifted labels, placeholder counts, packing, bad input."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import soundfile as sf
import torch

from omnicore.data.chat import IGNORE_INDEX, ChatProcessor, Encoded, module_processors
from omnicore.data.jsonl import SampleError, parse_line, read_jsonl
from omnicore.data.packing import PackingError, collate, pack_first_fit, pack_rows, pack_window

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


from conftest import first_fit_by_scan, tiny_config_dict  # noqa: E402  (tests/ is on pytest's pythonpath)


@pytest.fixture(scope="module")
def env(digits_jsonl):
    """The tiny omni model (built once) with its tokenizer and chat processor."""
    from omnicore.config import Config
    from omnicore.model.build import build_omni_model

    cfg = Config.model_validate(tiny_config_dict(str(digits_jsonl / "train.jsonl")))
    model, tok = build_omni_model(cfg)
    proc = ChatProcessor(tok, module_processors(model.encoders, "encoder"), module_processors(model.decoders, "decoder"))
    return model, tok, proc


@pytest.fixture(scope="module")
def digit_lines(digits_jsonl):
    """The parsed train.jsonl lines by task: {task: [raw dict, ...]} with media paths made absolute."""
    out: dict[str, list[dict]] = {}
    for text in (digits_jsonl / "train.jsonl").read_text().splitlines():
        obj = json.loads(text)
        for msg in obj["messages"]:
            for part in msg["content"] if isinstance(msg["content"], list) else []:
                if "path" in part:
                    part["path"] = str((digits_jsonl / part["path"]).resolve())
        out.setdefault(obj["task"], []).append(obj)
    return out


def _encode_line(proc, obj, file="mem.jsonl", line=1):
    return proc.encode(parse_line(json.dumps(obj), file, line))


def _token_strings(tok, ids):
    return [tok.decode([i]) for i in ids]


# ---- template and labels ---------------------------------------------------------------------


def test_text_only_template_and_shifted_labels(env):
    _, tok, proc = env
    obj = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Sum 2+2?"}]},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+4?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Seven"}, {"type": "text", "text": " (7)"}]},
        ]
    }
    enc = _encode_line(proc, obj)
    expected = (
        f"{IM_START}system\nBe brief.{IM_END}\n"
        f"{IM_START}user\nSum 2+2?{IM_END}\n"
        f"{IM_START}assistant\n4{IM_END}\n"
        f"{IM_START}user\nAnd 3+4?{IM_END}\n"
        f"{IM_START}assistant\nSeven (7){IM_END}\n"
    )
    assert tok.decode(enc.input_ids, skip_special_tokens=False) == expected
    assert len(enc.labels) == len(enc.input_ids)
    assert enc.media == []

    # Independent expectation: char offsets of each token, and the assistant spans (text + <|im_end|>).
    pieces = _token_strings(tok, enc.input_ids)
    assert "".join(pieces) == expected
    starts, pos = [], 0
    for p in pieces:
        starts.append(pos)
        pos += len(p)
    spans = [
        (m.start(1), m.end(1)) for m in re.finditer(re.escape(f"{IM_START}assistant\n") + r"(.*?" + re.escape(IM_END) + ")", expected, re.S)
    ]
    assert len(spans) == 2
    trained = [any(a <= s < b for a, b in spans) for s in starts]
    want = [enc.input_ids[i + 1] if trained[i + 1] else IGNORE_INDEX for i in range(len(enc.input_ids) - 1)] + [IGNORE_INDEX]
    assert enc.labels == want
    # "4" + <|im_end|> and "Seven (7)" + <|im_end|>
    assert sum(trained) == 2 + 10
    assert enc.n_targets == sum(1 for x in enc.labels if x != IGNORE_INDEX) == 12
    # the trained targets, read back, are exactly the assistant answers with their closing token
    assert tok.decode([x for x in enc.labels if x != IGNORE_INDEX], skip_special_tokens=False) == f"4{IM_END}Seven (7){IM_END}"


def test_prompt_only_drops_answer_and_opens_assistant(env):
    _, tok, proc = env
    obj = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    enc = proc.encode(parse_line(json.dumps(obj), "mem.jsonl", 1), prompt_only=True)
    assert tok.decode(enc.input_ids, skip_special_tokens=False) == f"{IM_START}user\nHi{IM_END}\n{IM_START}assistant\n"
    assert enc.n_targets == 0 and set(enc.labels) == {IGNORE_INDEX}


# ---- placeholders ----------------------------------------------------------------------------


def test_image_sample_placeholders(env, digit_lines):
    model, tok, proc = env
    enc = _encode_line(proc, digit_lines["image_to_text"][0])
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    [(side, modality, feats)] = enc.media
    assert (side, modality) == ("encoder", "image")
    n = model.encoders["image"].processor.num_tokens(feats)
    assert n == (28 // 7) ** 2 == 16
    assert enc.input_ids.count(pad) == n
    # the placeholders form one contiguous run right after the user header
    first = enc.input_ids.index(pad)
    assert enc.input_ids[first : first + n] == [pad] * n
    assert tok.decode(enc.input_ids[:first], skip_special_tokens=False) == f"{IM_START}user\n"
    assert all(enc.labels[i] == IGNORE_INDEX for i in range(first - 1, first + n))
    answer = digit_lines["image_to_text"][0]["messages"][1]["content"][0]["text"]
    assert enc.n_targets == len(answer) + 1


def test_audio_sample_placeholders_follow_whisper_formula(env, digit_lines):
    model, tok, proc = env
    obj = digit_lines["audio_to_text"][0]
    path = obj["messages"][0]["content"][0]["path"]
    enc = _encode_line(proc, obj)
    pad = tok.convert_tokens_to_ids("<|audio_pad|>")
    # independent count from the file's duration: 100 mel frames per second at 16 kHz (hop 160),
    # capped at chunk_seconds=2.5 (250 frames), conv stride 2, pooling 5
    info = sf.info(path)
    samples_16k = round(info.frames * 16000 / info.samplerate)
    frames = min(math.ceil(samples_16k / 160), 250)
    want = max(1, math.ceil(math.ceil(frames / 2) / 5))
    assert 0.2 < info.duration < 2.5  # a short FSDD clip: the count depends on its length
    assert enc.input_ids.count(pad) == want
    [(side, modality, feats)] = enc.media
    assert (side, modality) == ("encoder", "audio")
    assert model.encoders["audio"].processor.num_tokens(feats) == want


def test_text_to_image_sample_has_start_and_codes(env, digit_lines):
    model, tok, proc = env
    enc = _encode_line(proc, digit_lines["text_to_image"][0])
    start = tok.convert_tokens_to_ids("<|image_start|>")
    out = tok.convert_tokens_to_ids("<|image_out|>")
    im_end = tok.convert_tokens_to_ids(IM_END)
    [(side, modality, feats)] = enc.media
    assert (side, modality) == ("decoder", "image")
    n = model.decoders["image"].processor.num_tokens(feats)
    assert n == (32 // 4) ** 2 == 64
    i = enc.input_ids.index(start)
    assert enc.input_ids.count(start) == 1 and enc.input_ids.count(out) == n
    assert enc.input_ids[i + 1 : i + 1 + n] == [out] * n
    assert enc.input_ids[i + 1 + n] == im_end
    # text targets: <|image_start|> (predicted from the assistant header) and the closing <|im_end|>;
    # the codes are scored by the decoder head, so they are -100 in labels but counted in n_targets
    assert enc.labels[i - 1] == start
    assert all(enc.labels[j] == IGNORE_INDEX for j in range(i, i + n))
    assert enc.labels[i + n] == im_end
    assert sum(1 for x in enc.labels if x != IGNORE_INDEX) == 2
    assert enc.n_targets == 2 + n


# ---- packing ---------------------------------------------------------------------------------


def test_pack_first_fit_hand_example_and_budget():
    assert pack_first_fit([5, 7, 3, 6, 2], 10) == [[0, 2, 4], [1], [3]]
    assert pack_first_fit([10, 1, 10], 10) == [[0], [1], [2]]
    rng = random.Random(1)
    lengths = [rng.randint(1, 50) for _ in range(200)]
    bins = pack_first_fit(lengths, 64)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
    assert all(b == sorted(b) for b in bins)  # insertion order within a bin
    # first fit: a sample never opens a new bin when an earlier bin had room for it
    for k, b in enumerate(bins):
        first = b[0]
        for earlier in bins[:k]:
            used = sum(lengths[i] for i in earlier if i < first)
            assert used + lengths[first] > 64
    with pytest.raises(PackingError, match="sample 1 has 11 tokens"):
        pack_first_fit([3, 11], 10)


def _fake(n: int, tag: str, targets: int = 0) -> Encoded:
    return Encoded(list(range(100, 100 + n)), [IGNORE_INDEX] * n, [], targets, tag)


def test_collate_positions_and_cu_seqlens():
    samples = [_fake(3, "a:1", 1), _fake(5, "a:2", 2), _fake(2, "a:3", 4)]
    mb = collate(samples, {}, {})
    assert mb.input_ids.shape == (1, 10) and mb.input_ids.dtype == torch.long
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 0, 1]]
    assert mb.cu_seqlens.dtype == torch.int32
    assert mb.cu_seqlens.tolist() == [0, 3, 8, 10]
    assert mb.input_ids[0, 3:8].tolist() == samples[1].input_ids
    assert mb.n_targets == 7 and mb.wheres == ["a:1", "a:2", "a:3"] and mb.num_tokens == 10
    assert mb.encoder_inputs == {} and mb.decoder_inputs == {}


def test_collate_real_media_in_order(env, digit_lines):
    model, _, proc = env
    objs = [
        digit_lines["image_to_text"][0],
        digit_lines["audio_to_text"][0],
        digit_lines["image_to_text"][1],
        digit_lines["text_to_image"][0],
    ]
    encs = [_encode_line(proc, o, line=i + 1) for i, o in enumerate(objs)]
    mb = collate(encs, proc.encoders, proc.decoders)
    assert mb.cu_seqlens.tolist() == [0] + list(torch.tensor([len(e) for e in encs]).cumsum(0).tolist())
    assert mb.encoder_inputs["image"]["pixel_values"].shape == (2, 3, 28, 28)
    assert torch.equal(mb.encoder_inputs["image"]["pixel_values"][1], encs[2].media[0][2]["pixel_values"])
    assert mb.encoder_inputs["audio"]["input_features"].shape[0] == 1
    assert mb.decoder_inputs["image"]["pixel_values"].shape == (1, 3, 32, 32)
    for k, e in enumerate(encs):
        a, b = mb.cu_seqlens[k].item(), mb.cu_seqlens[k + 1].item()
        assert mb.position_ids[0, a:b].tolist() == list(range(len(e)))


@pytest.fixture
def fake_samples():
    rng = random.Random(7)
    return [_fake(rng.randint(1, 12), f"f:{i + 1}") for i in range(40)]


def test_pack_rows_packs_window_by_window_as_training_does(fake_samples):
    """pack_rows (training's packer over a finite stream): every sample once, each row within the
    budget and inside one window of 16 samples, each window's rows those of the textbook first-fit
    scan in stream order; a one-pass iterator gives the same rows."""
    rows = list(pack_rows(fake_samples, 16, window=16))
    index = {s.where: i for i, s in enumerate(fake_samples)}
    assert sorted(index[s.where] for r in rows for s in r) == list(range(40))
    assert all(sum(len(s) for s in r) <= 16 for r in rows)
    assert all(len({index[s.where] // 16 for s in r}) == 1 for r in rows)
    want = [
        [fake_samples[w + j] for j in b]
        for w in range(0, 40, 16)
        for b in first_fit_by_scan([len(s) for s in fake_samples[w : w + 16]], 16)
    ]
    assert rows == want
    assert list(pack_rows(iter(fake_samples), 16, window=16)) == rows
    # one window holding every sample: pack_window's rows, in order
    assert list(pack_rows(fake_samples, 16, window=40)) == [[fake_samples[j] for j in b] for b in pack_window(fake_samples, 16)]


def test_first_fit_decreasing_fills_rows_first_fit_leaves_open():
    from omnicore.data.packing import pack_first_fit_decreasing

    lengths = [4, 4, 4, 6, 6, 6]
    assert pack_first_fit(lengths, 10) == [[0, 1], [2, 3], [4], [5]]  # in order: 4 rows, 2 part-empty
    assert pack_first_fit_decreasing(lengths, 10) == [[3, 0], [4, 1], [5, 2]]  # longest first: 3 full rows
    samples = [_fake(n, f"f:{i + 1}") for i, n in enumerate(lengths)]
    assert [[s.where for s in r] for r in pack_rows(samples, 10, window=6, method="ffd")] == [
        ["f:4", "f:1"],
        ["f:5", "f:2"],
        ["f:6", "f:3"],
    ]
    # windows are packed apart: with a window of 3 the 4s and the 6s cannot pair
    assert [len(r) for r in pack_rows(samples, 10, window=3, method="ffd")] == [2, 1, 1, 1, 1]
    with pytest.raises(PackingError, match="sample 1 has 11 tokens"):
        pack_first_fit_decreasing([3, 11], 10)


def test_ffd_rows_cover_every_sample_and_shuffle_deterministically(fake_samples):
    """ffd (data.packing: ffd): every sample once within the budget, fuller rows than first_fit; the
    training packer shuffles a window's ffd rows with its seeded rng (the same rows, reordered the
    same way by the same seed); an unknown method names data.packing."""
    rows = list(pack_rows(fake_samples, 16, window=40, method="ffd"))
    assert sorted(s.where for r in rows for s in r) == sorted(s.where for s in fake_samples)
    assert all(sum(len(s) for s in r) <= 16 for r in rows)
    assert len(rows) <= len(list(pack_rows(fake_samples, 16, window=40)))
    plain = pack_window(fake_samples, 16, "ffd")
    a, b, c = (pack_window(fake_samples, 16, "ffd", random.Random(seed)) for seed in (3, 3, 4))
    assert a == b and a != c and sorted(a) == sorted(plain) and a != plain
    assert pack_window(fake_samples, 16, "first_fit", random.Random(3)) == pack_window(fake_samples, 16)  # never shuffled
    with pytest.raises(PackingError, match="data.packing: unknown method 'best'"):
        pack_window(fake_samples, 16, "best")
    with pytest.raises(PackingError, match="data.packing: unknown method 'best'"):
        next(pack_rows(fake_samples, 16, method="best"))


# ---- bad input -------------------------------------------------------------------------------


def train_samples(path: Path, proc: ChatProcessor, on_error: str = "raise") -> tuple[list[Encoded], list[str]]:
    """What training reads from the JSONL file ``path``: its samples decoded as the data workers
    decode them (the JSONL source, one shard in file order, :class:`ShardChunks`) and the messages
    of the bad ones; with ``on_error="raise"`` the first bad one raises, as the packer does
    (:meth:`ShardPacker.fill` under ``data.on_error: raise``)."""
    import itertools

    from omnicore.config import SourceConfig
    from omnicore.data.loader import ShardChunks
    from omnicore.data.sources import open_source
    from omnicore.data.state import ShardPacker

    src = open_source(SourceConfig(path=str(path), on_exhausted="stop"), path.parent)
    chunks = ShardChunks([src], proc, [0], 1, chunk=16, opts={"seed": 0, "shuffle": False, "buffer": 1, "limit": None})
    entries = []
    for j in itertools.count():
        chunk = chunks[(0, j)]
        entries += chunk.entries
        if chunk.end:
            break
    packer = ShardPacker(1, 0, window=len(entries), max_tokens=10**9, method="first_fit", seed=0, shuffle=False, on_error=on_error)
    packer.fill(entries, ended=True)
    return [e.sample for e in entries if e.sample is not None], [e.error for e in entries if e.error is not None]


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _text_line(q="Hi", a="Hello"):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def _media_line(kind, path):
    return {
        "messages": [
            {"role": "user", "content": [{"type": kind, "path": str(path)}, {"type": "text", "text": "?"}]},
            {"role": "assistant", "content": "1"},
        ]
    }


@pytest.fixture(scope="module")
def garbage(tmp_path_factory):
    d = tmp_path_factory.mktemp("garbage")
    (d / "x.png").write_bytes(b"this is not a png at all" * 10)
    (d / "x.wav").write_bytes(b"RIFF....garbage, not a wave file" * 10)
    return d


def _bad_cases(digit_lines, garbage):
    img = digit_lines["image_to_text"][0]["messages"][0]["content"][0]["path"]
    return {
        "malformed_json": ('{"messages": [', "not valid JSON"),
        "no_messages": ({"task": "x"}, "non-empty 'messages'"),
        "unknown_part": (
            {"messages": [{"role": "user", "content": [{"type": "pointcloud", "path": "v.ply"}]}]},
            "unknown type 'pointcloud'",
        ),
        "missing_image": (_media_line("image", garbage / "nope.png"), "image file not found"),
        "missing_audio": (_media_line("audio", garbage / "nope.wav"), "audio file not found"),
        "unreadable_image": (_media_line("image", garbage / "x.png"), "cannot read image"),
        "unreadable_audio": (_media_line("audio", garbage / "x.wav"), "cannot read audio"),
        "literal_placeholder": (_text_line("look: <|image_pad|> here"), "reserved placeholder"),
        "_img": (_media_line("image", img), None),
    }


@pytest.mark.parametrize(
    "case",
    [
        "malformed_json",
        "no_messages",
        "unknown_part",
        "missing_image",
        "missing_audio",
        "unreadable_image",
        "unreadable_audio",
        "literal_placeholder",
    ],
)
def test_bad_line_names_file_and_line(env, digit_lines, garbage, tmp_path, case):
    _, _, proc = env
    line, why = _bad_cases(digit_lines, garbage)[case]
    path = _write(tmp_path / "train.jsonl", [_text_line(), "", line, _text_line()])  # blank line 2 still counts
    with pytest.raises(SampleError) as info:
        train_samples(path, proc, "raise")
    msg = str(info.value)
    assert msg.startswith(f"{path}:3: "), msg
    assert why in msg
    if "missing" in case or "unreadable" in case:
        assert str(line["messages"][0]["content"][0]["path"]) in msg


def test_image_part_without_image_encoder(env, digit_lines, garbage, tmp_path):
    _, tok, proc = env
    audio_only = ChatProcessor(tok, {"audio": proc.encoders["audio"]}, {})
    img_line = _bad_cases(digit_lines, garbage)["_img"][0]
    path = _write(tmp_path / "train.jsonl", [_text_line(), _text_line(), img_line])
    with pytest.raises(
        SampleError, match=re.escape(f"{path}:3: ") + r"a image part on the encoder side needs a image encoder .*configured: audio"
    ):
        train_samples(path, audio_only, "raise")
    # an image in an assistant message needs an image decoder
    gen = {"messages": [{"role": "user", "content": "Draw"}, {"role": "assistant", "content": img_line["messages"][0]["content"][:1]}]}
    path2 = _write(tmp_path / "gen.jsonl", [gen])
    with pytest.raises(SampleError, match=re.escape(f"{path2}:1: ") + r".*image decoder.*configured: none"):
        train_samples(path2, audio_only, "raise")


def test_too_long_sample_packing_error_names_line(env, tmp_path):
    _, _, proc = env
    path = _write(tmp_path / "train.jsonl", [_text_line(), _text_line("x" * 600), _text_line()])
    samples, errors = train_samples(path, proc, "raise")
    assert errors == [] and [len(s) for s in samples][1] > 512
    with pytest.raises(PackingError, match=re.escape(f"{path}:2: sample has {len(samples[1])} tokens") + r".*max_tokens=512"):
        pack_window(samples, 512)
    assert pack_window(samples[:1] + samples[2:], 512) == [[0, 1]]  # the others fit, in one row


def test_on_error_skip_counts_bad_lines(env, digit_lines, garbage, tmp_path):
    _, _, proc = env
    cases = _bad_cases(digit_lines, garbage)
    lines = [
        _text_line(),  # 1 ok
        cases["malformed_json"][0],  # 2 parse error
        cases["_img"][0],  # 3 ok
        cases["missing_image"][0],  # 4 encode error
        "",  # 5 blank: ignored, not an error
        cases["unreadable_audio"][0],  # 6 encode error
        cases["no_messages"][0],  # 7 parse error
        cases["literal_placeholder"][0],  # 8 encode error
        _text_line("a", "b"),  # 9 ok
    ]
    path = _write(tmp_path / "train.jsonl", lines)
    samples, errors = train_samples(path, proc, "skip")
    assert [s.where for s in samples] == [f"{path}:1", f"{path}:3", f"{path}:9"]
    assert len(errors) == 5
    assert sorted(int(re.match(re.escape(str(path)) + r":(\d+): ", e).group(1)) for e in errors) == [2, 4, 6, 7, 8]
    # read_jsonl alone skips only the parse errors
    errs: list[str] = []
    assert len(read_jsonl(path, on_error="skip", errors=errs)) == 6 and len(errs) == 2
    with pytest.raises(SampleError, match=re.escape(f"{path}:2: ")):
        train_samples(path, proc, "raise")


def test_first_fit_with_the_free_space_index_equals_the_scan():
    """The O(n log B) first-fit gives exactly the bins of the scan, on 300 random cases (budgets
    from 1 to 1024, lengths up to the budget, up to 400 samples, growing past several tree sizes)."""
    import random

    from omnicore.data.packing import FreeSpaceIndex, pack_first_fit

    rng = random.Random(0)
    for _ in range(300):
        budget = rng.choice([1, 7, 64, 512, 1024])
        lengths = [rng.randint(1, budget) for _ in range(rng.randint(0, 400))]
        assert pack_first_fit(lengths, budget) == first_fit_by_scan(lengths, budget)
    index = FreeSpaceIndex()
    for free in (5, 0, 9, 3, 9):
        index.append(free)
    assert [index.first_fit(n) for n in (1, 4, 6, 9, 10)] == [0, 0, 2, 2, None]
    index.set(2, 1)
    assert (index.first_fit(6), index.first_fit(2), index.free(2)) == (4, 0, 1)
