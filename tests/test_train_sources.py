"""`omnicore train` on the new data sources, end to end through the command line: a Parquet table
through a column mapping, a streaming source resumed exactly with workers, layouts that cannot
continue a run, and a bad line found by a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import tiny_config_dict

pytestmark = pytest.mark.cli

PROMPT = "Which digit is this?"


def _omnicore(*args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "omnicore", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _config(tmp: Path, data: dict, *, image_only: bool = True, **train) -> Path:
    cfg = tiny_config_dict("unused", output_dir=str(tmp / "run"), decoders=not image_only, **train)
    if image_only:
        cfg["model"]["encoders"].pop("audio")
    cfg["data"] = dict(data, max_tokens=256, packing_window=16, shuffle_buffer=8)
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def image_table(digits_jsonl, tmp_path_factory):
    """The image -> digit samples of the digits set twice: as chat JSONL with image files, and as a
    Parquet table with the PNG bytes in an ``image`` column and the answer in a ``label`` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("table")
    rows = [json.loads(x) for x in (digits_jsonl / "train.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["task"] == "image_to_text"]
    images, labels, lines = [], [], []
    for r in rows:
        path = digits_jsonl / r["messages"][0]["content"][0]["path"]
        images.append(path.read_bytes())
        labels.append(r["messages"][1]["content"][0]["text"])
        r["messages"][0]["content"][0]["path"] = str(path)
        lines.append(json.dumps({"messages": r["messages"]}))
    pq.write_table(pa.table({"image": images, "label": labels}), out / "digits.parquet")
    (out / "digits.jsonl").write_text("\n".join(lines) + "\n")
    return out, len(rows)


def test_parquet_through_column_mapping_trains_like_jsonl(image_table, tmp_path):
    """A Parquet table (image bytes + text column) read through `columns` gives the samples of the
    same data written as chat JSONL: the same losses, step by step, and every row counted."""
    folder, n = image_table
    table = {"sources": [{"name": "digits", "dataset": str(folder / "digits.parquet"), "columns": {"image": "image", "response": "label"},
                          "prompt": PROMPT}]}  # fmt: skip
    jsonl = {"sources": [{"name": "digits", "path": str(folder / "digits.jsonl")}]}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _omnicore("train", str(_config(tmp_path / "a", table, max_steps=4)), cwd=tmp_path)
    _omnicore("train", str(_config(tmp_path / "b", jsonl, max_steps=4)), cwd=tmp_path)
    a, b = _rows(tmp_path / "a" / "run"), _rows(tmp_path / "b" / "run")
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-6)
    assert [r["samples/digits"] for r in a] == [r["samples/digits"] for r in b]
    assert 4 <= a[-1]["samples/digits"] and all(r["data_wait_s"] >= 0 for r in a)


def test_streaming_source_resumes_exactly_with_workers(image_table, tmp_path):
    """10 steps, stop, --resume for 10 more equals 20 straight (losses rel 1e-6), with 2 workers and
    a streaming Parquet source mixed with a JSONL one; then a resume with another number of virtual
    shards (grad_accum 2) is refused with the reason."""
    folder, _ = image_table
    data = {
        "num_workers": 2,
        "sources": [
            {"name": "table", "dataset": str(folder / "digits.parquet"), "streaming": True, "columns": {"image": "image", "response": "label"},
             "prompt": PROMPT, "weight": 2},
            {"name": "chat", "path": str(folder / "digits.jsonl")},
        ],
    }  # fmt: skip
    (tmp_path / "straight").mkdir()
    (tmp_path / "split").mkdir()
    _omnicore("train", str(_config(tmp_path / "straight", data, max_steps=20)), cwd=tmp_path)
    cfg = _config(tmp_path / "split", data, max_steps=20, stop_after=10)
    _omnicore("train", str(cfg), cwd=tmp_path)
    refused = _omnicore("train", str(cfg), "--resume", "--train.grad_accum", "2", cwd=tmp_path, ok=False)
    assert refused.returncode == 2
    assert "split into 1 virtual shards" in refused.stderr and "this run into 2" in refused.stderr
    _omnicore("train", str(cfg), "--resume", "--train.stop_after", "null", cwd=tmp_path)
    straight, split = _rows(tmp_path / "straight" / "run"), _rows(tmp_path / "split" / "run")
    assert len(split) == len(straight) == 20
    assert [r["loss"] for r in split] == pytest.approx([r["loss"] for r in straight], rel=1e-6)
    for key in ("samples/table", "samples/chat"):
        assert [r[key] for r in split] == [r[key] for r in straight]
    # both sources are read, roughly 2:1 by weight
    assert straight[-1]["samples/table"] > straight[-1]["samples/chat"] > 0


def test_bad_line_in_a_worker_names_file_and_line(digits_jsonl, tmp_path):
    lines = (digits_jsonl / "train.jsonl").read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    lines.insert(6, '{"messages": [{"role": "user", "content": "x"}')  # line 7: cut short
    bad.write_text("\n".join(lines) + "\n")
    (tmp_path / "images").symlink_to(digits_jsonl / "images")
    data = {"train": str(bad), "num_workers": 2, "shuffle": False}
    proc = _omnicore("train", str(_config(tmp_path, data, image_only=False, max_steps=3)), cwd=tmp_path, ok=False)
    assert proc.returncode == 2
    assert f"error: {bad}:7: not valid JSON" in proc.stderr
