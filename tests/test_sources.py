"""Sources (issue 11, item 2): JSONL shards and tables through Hugging Face datasets, sharded lazily."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from omnicore.data import jsonl
from omnicore.data.jsonl import SampleError
from omnicore.data.media import MediaError, load_audio, load_image
from omnicore.data.sources import SourceConfig, open_source


def _line(text: str, answer: str = "ok") -> str:
    return json.dumps({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]}) + "\n"


def _texts(src, records) -> list[str]:
    return [src.to_sample(r).messages[0].parts[0].value for r in records]


def _all(src, **kw):
    args = {"epoch": 0, "shard": 0, "num_shards": 1, "seed": 0, "shuffle": False} | kw
    return list(src.records(**args))


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    d = tmp_path / "shards"
    d.mkdir()
    (d / "a.jsonl").write_text(_line("a1") + "\n" + _line("a3"))  # line 2 is blank
    (d / "b.jsonl").write_text(_line("b1") + _line("b2") + _line("b3"))
    (d / "notes.txt").write_text("not data\n")
    return d


@pytest.mark.parametrize("spec", ["shards", "shards/*.jsonl", "**/*.jsonl"])
def test_folder_and_glob_give_the_sorted_union_of_shards(shards: Path, spec: str) -> None:
    src = open_source(SourceConfig(path=spec), shards.parent)
    recs = _all(src)
    a, b = shards / "a.jsonl", shards / "b.jsonl"
    assert [r.where for r in recs] == [f"{a}:1", f"{a}:3", f"{b}:1", f"{b}:2", f"{b}:3"]
    assert _texts(src, recs) == ["a1", "a3", "b1", "b2", "b3"]
    assert src.num_rows is None
    assert src.name == ("shards" if spec != "**/*.jsonl" else shards.parent.name)


def test_one_jsonl_file_with_bom_and_relative_media(tmp_path: Path) -> None:
    line = json.dumps(
        {"messages": [{"role": "user", "content": [{"type": "image", "path": "img/x.png"}]}, {"role": "assistant", "content": "7"}]}
    )
    (tmp_path / "d.jsonl").write_bytes(b"\xef\xbb\xbf" + line.encode() + b"\n")
    src = open_source(SourceConfig(path="d.jsonl"), tmp_path)
    (sample,) = [src.to_sample(r) for r in _all(src)]
    assert sample.where == f"{tmp_path / 'd.jsonl'}:1"
    assert sample.messages[0].parts[0].value == str(tmp_path / "img" / "x.png")
    assert src.name == "d"


def _many_shards(tmp_path: Path, n_files: int = 6, rows: int = 5) -> Path:
    d = tmp_path / "many"
    d.mkdir()
    for f in range(n_files):
        (d / f"part-{f:02d}.jsonl").write_text("".join(_line(f"{f}.{r}") for r in range(rows - f % 3)))
    return d


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 7])
def test_jsonl_shards_partition_the_rows_exactly(tmp_path: Path, num_shards: int) -> None:
    src = open_source(SourceConfig(path="many"), _many_shards(tmp_path).parent)
    full = [r.where for r in _all(src, epoch=3, seed=11, shuffle=True)]
    assert len(full) == len(set(full)) == 6 * 5 - (0 + 1 + 2) * 2
    for s in range(num_shards):
        got = [r.where for r in _all(src, epoch=3, seed=11, shuffle=True, shard=s, num_shards=num_shards)]
        assert got == full[s::num_shards]


def test_file_order_is_seeded_per_epoch_and_rows_keep_their_order(tmp_path: Path) -> None:
    src = open_source(SourceConfig(path="many/*.jsonl"), _many_shards(tmp_path).parent)

    def files(epoch: int, seed: int, shuffle: bool = True) -> list[str]:
        recs = _all(src, epoch=epoch, seed=seed, shuffle=shuffle)
        order = list(dict.fromkeys(Path(r.file).name for r in recs))
        for name in order:  # within a file, lines ascend
            lines = [r.line for r in recs if Path(r.file).name == name]
            assert lines == sorted(lines)
        return order

    unshuffled = [f"part-{f:02d}.jsonl" for f in range(6)]
    assert files(0, 0, shuffle=False) == files(5, 9, shuffle=False) == unshuffled
    assert files(0, 1) == files(0, 1)
    orders = [tuple(files(e, 1)) for e in range(5)]
    assert all(sorted(o) == unshuffled for o in orders)
    assert len(set(orders)) > 1  # 5 epochs of 6! orders all equal would mean the epoch is ignored
    assert tuple(files(0, 2)) != orders[0] or tuple(files(1, 2)) != orders[1]


@pytest.mark.slow
def test_jsonl_records_are_lazy_on_a_million_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text("".join(f'{{"messages":[{{"role":"user","content":"{i}"}}]}}\n' for i in range(1_000_000)))
    opened = []

    def spy_open(*args, **kwargs):
        fh = open(*args, **kwargs)
        opened.append(fh)
        return fh

    monkeypatch.setattr(jsonl, "open", spy_open, raising=False)  # JSONL sources read through jsonl.jsonl_lines
    src = open_source(SourceConfig(path="big.jsonl"), tmp_path)
    gen = src.records(0, 1, 2, 0, False)  # held, so its file stays open to ask its position
    first = list(itertools.islice(gen, 5))
    assert [r.line for r in first] == [2, 4, 6, 8, 10]
    assert _texts(src, first) == ["1", "3", "5", "7", "9"]
    # the file position is just past line 10: nothing beyond was consumed
    assert opened[0].tell() == sum(len(f'{{"messages":[{{"role":"user","content":"{i}"}}]}}\n') for i in range(10))
    assert path.stat().st_size > 40_000_000


def test_jsonl_errors_name_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_bytes(_line("fine").encode() + b"\n" + b'{"messages": [\n' + b'{"x": "\xff"}\n')
    src = open_source(SourceConfig(path="bad.jsonl"), tmp_path)
    recs = _all(src)
    assert [r.line for r in recs] == [1, 3, 4]
    with pytest.raises(SampleError, match=rf"^{tmp_path / 'bad.jsonl'}:3: not valid JSON"):
        src.to_sample(recs[1])
    with pytest.raises(SampleError, match=rf"^{tmp_path / 'bad.jsonl'}:4: not valid UTF-8"):
        src.to_sample(recs[2])


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


PIXELS = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]], [[10, 20, 30], [40, 50, 60], [70, 80, 90]]], dtype=np.uint8)


def _write_table(path: Path, images: list, texts: list) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"image": pa.array(images, pa.binary()), "caption": texts}), path)


def _table_cfg(spec: str, **kw) -> SourceConfig:
    return SourceConfig(dataset=spec, columns={"image": "image", "response": "caption"}, prompt="Describe the image.", **kw)


@pytest.mark.slow
def test_parquet_image_bytes_and_text_make_chat_samples(tmp_path: Path) -> None:
    other = PIXELS[::-1].copy()
    _write_table(tmp_path / "t.parquet", [_png(PIXELS), _png(other)], ["first", "second"])
    src = open_source(_table_cfg("t.parquet"), tmp_path, cache_dir=tmp_path / "cache")
    assert src.num_rows == 2
    recs = _all(src)
    assert [r.where for r in recs] == [f"{tmp_path / 't.parquet'} row 0", f"{tmp_path / 't.parquet'} row 1"]
    s1 = src.to_sample(recs[1])
    assert s1.where == f"{tmp_path / 't.parquet'} row 1"
    assert [(m.role, [p.type for p in m.parts]) for m in s1.messages] == [("user", ["image", "text"]), ("assistant", ["text"])]
    assert s1.messages[0].parts[1].value == "Describe the image."
    assert s1.messages[1].parts[0].value == "second"
    np.testing.assert_array_equal(np.asarray(load_image(s1.messages[0].parts[0].value)), other)


@pytest.mark.slow
def test_hf_image_feature_and_relative_paths_stay_undecoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    from PIL import Image

    (tmp_path / "img").mkdir()
    Image.fromarray(PIXELS).save(tmp_path / "img" / "p.png")
    feats = datasets.Features({"image": datasets.Image(), "caption": datasets.Value("string")})
    rows = {"image": [{"bytes": _png(PIXELS), "path": None}, {"bytes": None, "path": "img/p.png"}], "caption": ["a", "b"]}
    monkeypatch.chdir(tmp_path)  # datasets sizes path-only cells from the working directory when writing
    datasets.Dataset.from_dict(rows, features=feats).to_parquet(str(tmp_path / "hf.parquet"))
    monkeypatch.chdir("/")  # and omnicore resolves them against the table's folder, not the working directory
    for streaming in (False, True):
        src = open_source(_table_cfg("hf.parquet", streaming=streaming), tmp_path, cache_dir=tmp_path / "cache")
        samples = [src.to_sample(r) for r in _all(src)]
        assert isinstance(samples[0].messages[0].parts[0].value, bytes)
        assert samples[1].messages[0].parts[0].value == str(tmp_path / "img" / "p.png")
        for s in samples:
            np.testing.assert_array_equal(np.asarray(load_image(s.messages[0].parts[0].value)), PIXELS)


def _glob_tables(tmp_path: Path) -> Path:
    d = tmp_path / "tables"
    d.mkdir()
    for f, n in enumerate([3, 1, 4, 2]):
        _write_table(d / f"part-{f}.parquet", [_png(PIXELS)] * n, [f"{f}.{r}" for r in range(n)])
    return d


@pytest.mark.parametrize("num_shards", [1, 3, 4])
def test_streaming_and_map_style_give_the_same_records(tmp_path: Path, num_shards: int) -> None:
    _glob_tables(tmp_path)
    got = {}
    for streaming in (False, True):
        src = open_source(_table_cfg("tables/*.parquet", streaming=streaming), tmp_path, cache_dir=tmp_path / "cache")
        full = _all(src, epoch=2, seed=5, shuffle=True)
        for s in range(num_shards):
            part = _all(src, epoch=2, seed=5, shuffle=True, shard=s, num_shards=num_shards)
            assert [r.where for r in part] == [r.where for r in full[s::num_shards]]
        got[streaming] = [(r.where, src.to_sample(r).messages[1].parts[0].value) for r in full]
    assert got[False] == got[True]
    assert sorted(t for _, t in got[False]) == sorted(f"{f}.{r}" for f, n in enumerate([3, 1, 4, 2]) for r in range(n))
    assert src.num_rows is None  # streaming


def test_messages_column_with_image_bytes(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    msgs = [
        {
            "role": "user",
            "content": [{"type": "image", "image": _png(PIXELS), "text": None}, {"type": "text", "image": None, "text": "What?"}],
        },
        {"role": "assistant", "content": [{"type": "text", "image": None, "text": "Pixels."}]},
    ]
    pq.write_table(pa.table({"messages": [msgs], "id": [7]}), tmp_path / "m.parquet")
    src = open_source(SourceConfig(dataset="m.parquet"), tmp_path, cache_dir=tmp_path / "cache")
    (s,) = [src.to_sample(r) for r in _all(src)]
    assert [p.type for p in s.messages[0].parts] == ["image", "text"]
    np.testing.assert_array_equal(np.asarray(load_image(s.messages[0].parts[0].value)), PIXELS)
    assert s.messages[1].parts[0].value == "Pixels."


def test_table_errors_name_the_row(tmp_path: Path) -> None:
    _write_table(tmp_path / "t.parquet", [_png(PIXELS), b"not a png", None], ["x", "y", " "])
    src = open_source(_table_cfg("t.parquet"), tmp_path, cache_dir=tmp_path / "cache")
    recs = _all(src)
    where = f"{tmp_path / 't.parquet'}"
    bad = src.to_sample(recs[1]).messages[0].parts[0].value
    with pytest.raises(MediaError, match=rf"cannot read image \(9 bytes from {where} row 1\)"):
        load_image(bad, name=recs[1].where)
    with pytest.raises(SampleError, match=rf"^{where} row 2: column 'image' \(image\) holds an empty value"):
        src.to_sample(recs[2])
    with pytest.raises(ValueError, match=r"columns maps \['text'\], which .* lacks; its columns: image, caption"):
        open_source(SourceConfig(dataset="t.parquet", columns={"image": "image", "response": "text"}), tmp_path, cache_dir=tmp_path / "c")
    with pytest.raises(
        ValueError, match=r"no 'messages' column \(its columns: image, caption\).*columns: \{image: image, response: caption\}"
    ):
        open_source(SourceConfig(dataset="t.parquet"), tmp_path, cache_dir=tmp_path / "cache")


def test_empty_response_is_a_sample_error(tmp_path: Path) -> None:
    _write_table(tmp_path / "t.parquet", [_png(PIXELS)], ["  "])
    src = open_source(_table_cfg("t.parquet", streaming=True), tmp_path, cache_dir=tmp_path / "cache")
    with pytest.raises(SampleError, match=rf"^{tmp_path / 't.parquet'} row 0: column 'caption' \(response\) is empty"):
        src.to_sample(_all(src)[0])


def test_dataset_name_from_the_local_cache(tmp_path: Path) -> None:
    from datasets.packaged_modules.parquet.parquet import Parquet

    _write_table(tmp_path / "t.parquet", [_png(PIXELS)] * 3, ["r0", "r1", "r2"])
    cache = tmp_path / "hf"
    # the layout load_dataset("me/toy") leaves: CACHE/me___toy/default/0.0.0/HASH/{dataset_info.json, toy-train.arrow}
    Parquet(
        cache_dir=str(cache), dataset_name="toy", config_name="default", data_files={"train": [str(tmp_path / "t.parquet")]}, hash="h"
    ).download_and_prepare()
    (cache / "toy").rename(cache / "me___toy")
    next((cache / "me___toy").iterdir()).rename(cache / "me___toy" / "default")
    for streaming in (False, True):
        src = open_source(_table_cfg("me/toy", streaming=streaming), tmp_path, cache_dir=cache)
        recs = _all(src, shard=1, num_shards=2)
        assert [r.where for r in recs] == ["me/toy row 1"]
        assert src.to_sample(recs[0]).messages[1].parts[0].value == "r1"
        assert src.name == "me/toy"
    with pytest.raises(ValueError, match=r"has no split 'test' in the cache; its splits: train"):
        open_source(_table_cfg("me/toy", split="test"), tmp_path, cache_dir=cache)
    with pytest.raises(ValueError, match=r"dataset 'me/other': not a local file or folder, and not in the Hugging Face datasets cache"):
        open_source(_table_cfg("me/other"), tmp_path, cache_dir=cache)


def test_bad_paths_name_what_to_do(shards: Path) -> None:
    base = shards.parent
    with pytest.raises(ValueError, match=r"path 'nope/\*.jsonl': no file matches"):
        open_source(SourceConfig(path="nope/*.jsonl"), base)
    (base / "empty").mkdir()
    with pytest.raises(
        ValueError, match=r"folder .*empty holds no \*.jsonl files; for files in subfolders use a glob such as empty/\*\*/\*.jsonl"
    ):
        open_source(SourceConfig(path="empty"), base)
    with pytest.raises(ValueError, match=r"no such file or folder: .*missing.parquet"):
        open_source(SourceConfig(dataset="missing.parquet"), base)
    with pytest.raises(ValueError, match=r"cannot tell the format of .*notes.txt by its extension; set format"):
        open_source(SourceConfig(dataset="shards/*"), base)
    with pytest.raises(ValueError, match=r"shard 2 of 2"):
        next(open_source(SourceConfig(path="shards"), base).records(0, 2, 2, 0, False))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"path": "a.jsonl", "dataset": "b.parquet"}, "exactly one of `path`"),
        ({}, "exactly one of `path`"),
        ({"path": "a.jsonl", "columns": {"response": "t"}}, "columns apply to `dataset` sources only"),
        ({"path": "a.jsonl", "split": "test"}, "split apply to `dataset` sources only"),
        ({"dataset": "t.parquet", "columns": {"image": "i", "caption": "c"}}, r"unknown key\(s\) \['caption'\]"),
        ({"dataset": "t.parquet", "columns": {"image": "i"}}, "the assistant message would be empty"),
        ({"dataset": "t.parquet", "columns": {"response": "r"}}, "the user message would be empty"),
        ({"dataset": "t.parquet", "columns": {"prompt": "p", "response": "r"}, "prompt": "x"}, "not both"),
        ({"dataset": "t.parquet", "weight": 0}, "greater than 0"),
        ({"dataset": "t.parquet", "shards": 2}, "Extra inputs are not permitted"),
    ],
)
def test_config_rejects_inconsistent_sources(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SourceConfig(**fields)


def test_generation_target_columns(tmp_path: Path) -> None:
    _write_table(tmp_path / "t.parquet", [_png(PIXELS)], ["a red pixel"])
    cfg = SourceConfig(dataset="t.parquet", columns={"image": "image", "prompt": "caption"}, media_role="assistant")
    src = open_source(cfg, tmp_path, cache_dir=tmp_path / "cache")
    (s,) = [src.to_sample(r) for r in _all(src)]
    assert [(m.role, [p.type for p in m.parts]) for m in s.messages] == [("user", ["text"]), ("assistant", ["image"])]


def test_load_audio_from_bytes_matches_the_file(tmp_path: Path) -> None:
    import soundfile as sf

    t = np.arange(800) / 8000.0
    stereo = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.25 * np.ones_like(t)], axis=1).astype(np.float32)
    sf.write(tmp_path / "a.wav", stereo, 8000, subtype="FLOAT")
    from_bytes = load_audio((tmp_path / "a.wav").read_bytes(), name="t.parquet row 3")
    assert from_bytes.sample_rate == 8000
    np.testing.assert_allclose(from_bytes.samples, stereo.mean(axis=1), atol=1e-7)
    with pytest.raises(MediaError, match=r"cannot read audio \(4 bytes from t.parquet row 3\)"):
        load_audio(b"RIFF", name="t.parquet row 3")


def test_sources_and_records_survive_pickling(tmp_path: Path, shards: Path) -> None:
    import pickle

    _write_table(tmp_path / "t.parquet", [_png(PIXELS)] * 2, ["r0", "r1"])
    for cfg in (SourceConfig(path="shards"), _table_cfg("t.parquet"), _table_cfg("t.parquet", streaming=True)):
        src = open_source(cfg, tmp_path, cache_dir=tmp_path / "cache")
        copy = pickle.loads(pickle.dumps(src))  # as DataLoader workers receive it
        recs = [pickle.loads(pickle.dumps(r)) for r in _all(src, shuffle=True, seed=3)]
        assert [r.where for r in _all(copy, shuffle=True, seed=3)] == [r.where for r in recs]
        assert [copy.to_sample(r).messages for r in recs] == [src.to_sample(r).messages for r in recs]
