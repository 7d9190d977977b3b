"""logger/wandb: omnicore's LoggerContract suite, with the values read back from the offline run's
``.wandb`` transaction log (decoded with wandb's own protobuf ``Record``), the images read back from
the run's media files, and a short training run whose W&B history holds exactly the losses of
metrics.jsonl."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omnicore.testing import LoggerContract

TINY_LM = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}

_BLOCK, _HEADER = 32768, 7  # the LevelDB log layout wandb's transaction log uses (32 KiB blocks, 7-byte record headers)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """Every record of a ``run-<id>.wandb`` file, decoded as ``wandb.proto.wandb_internal_pb2.Record``.

    The file is a 7-byte header (``:W&B``, magic ``0xBEE1`` little-endian, version 0) followed by the
    LevelDB log format (github.com/google/leveldb ``doc/log_format.md``): 32 KiB blocks of records
    ``crc32 (4) | length (2) | type (1) | data``, a record split across blocks as FIRST..LAST; wandb's
    checksum is zlib's crc32 of the type byte then the data. Each checksum is verified.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), f"{path}: not a W&B transaction log"
    out, pos, parts = [], _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER]) if left >= _HEADER else (0, 0, 0)
        if kind == 0:  # the zero padding at a block's end
            pos += left
            continue
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"{path}: bad checksum at byte {pos}"
        pos += _HEADER + length
        parts = chunk if kind in (_FULL, _FIRST) else parts + chunk
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def history_rows(output_dir: Path) -> list[dict[str, Any]]:
    """The history rows of every run folder under ``<output_dir>/wandb`` (oldest first), each as
    ``{key: value}`` with the JSON values decoded."""
    rows = []
    for path in sorted(Path(output_dir).glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                row: dict[str, Any] = {}
                for item in record.history.item:  # a media value comes as one item per field: nested_key [name, field]
                    *parents, last = [item.key] if item.key else list(item.nested_key)
                    node = row
                    for key in parents:
                        node = node.setdefault(key, {})
                    node[last] = json.loads(item.value_json)
                rows.append(row)
    return rows


def read_history(output_dir: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """Every logged number as ``{(split, key): [(step, value), ...]}`` (keys ``split/key``, x-axis ``step``)."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in history_rows(output_dir):
        for name, value in row.items():
            if name != "step" and not name.startswith("_") and isinstance(value, (int, float)):
                split, _, key = name.partition("/")
                out.setdefault((split, key), []).append((row["step"], value))
    return out


def run_config(output_dir: Path) -> dict[str, Any]:
    """The config of the (first) run record under ``<output_dir>/wandb``."""
    (path, *_) = sorted(Path(output_dir).glob("wandb/offline-run-*/run-*.wandb"))
    (run,) = [r.run for r in wandb_records(path) if r.WhichOneof("record_type") == "run"]
    return {u.key: json.loads(u.value_json) for u in run.config.update if u.key != "_wandb"}


@pytest.mark.slow
class TestWandbContract(LoggerContract):
    name = "wandb"
    options = {"mode": "offline"}  # whatever WANDB_API_KEY / WANDB_MODE this machine has
    rtol = 0.0  # JSON keeps a float exactly
    keeps_rows_after_resume = (
        "a W&B run cannot be rewound offline (wandb.init's resume_from needs the server): the interrupted run's rows after the "
        "checkpoint's step stay in its history; metrics.jsonl, TensorBoard and MLflow drop them"
    )

    def read_back(self, output_dir):
        return read_history(Path(output_dir))


@pytest.mark.slow
def test_config_images_and_nan_are_in_the_run_folder(tmp_path):
    from PIL import Image

    contract = TestWandbContract()
    contract._log_all(tmp_path / "run", contract.rows)
    assert run_config(tmp_path / "run") == contract.run_info(tmp_path / "run")["config"]
    rows = history_rows(tmp_path / "run")
    (nan_row,) = [r for r in rows if r["step"] == 3 and "train/loss" in r]
    assert np.isnan(nan_row["train/loss"]) and nan_row["train/skipped"] == 1.0 and "train/skip_reason" not in nan_row
    (val_row,) = [r for r in rows if "val/loss" in r]
    assert (val_row["step"], val_row["val/loss"], val_row["val/loss/text"]) == (2, 2.75, 2.5)
    (img_row,) = [r for r in rows if "samples/image" in r]
    meta = img_row["samples/image"]
    assert img_row["step"] == 2 and meta["count"] == 2 and (meta["width"], meta["height"]) == (12, 8)
    (run_dir,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    files = [run_dir / "files" / p for p in meta["filenames"]]
    got = [np.asarray(Image.open(f).convert("RGB")) for f in files]
    for want, img in zip(contract.images(), got):
        assert np.array_equal(img, want)  # PNG is lossless: the pixels come back unchanged


def test_resolve_mode():
    from omnicore_logger_wandb.options import resolve_mode

    assert resolve_mode(None, {}) == "offline"
    assert resolve_mode(None, {"WANDB_API_KEY": "x" * 40}) == "online"
    assert resolve_mode(None, {"WANDB_API_KEY": "x" * 40, "WANDB_MODE": "offline"}) == "offline"
    assert resolve_mode(None, {"WANDB_MODE": "dryrun"}) == "offline"
    assert resolve_mode(None, {"WANDB_MODE": "disabled"}) == "disabled"
    assert resolve_mode("online", {"WANDB_MODE": "offline"}) == "online"
    with pytest.raises(ValueError, match="WANDB_MODE='offlne' is not one of"):
        resolve_mode(None, {"WANDB_MODE": "offlne"})


@pytest.mark.cli
def test_listing_plugins_imports_neither_wandb_nor_mlflow(tmp_path):
    """``omnicore plugins`` imports the hook modules only: wandb and mlflow load in ``start``."""
    code = (
        "import sys; from omnicore.cli import main; main(['plugins', '--kind', 'logger']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('omnicore_logger_wandb', 'wandb', 'mlflow', 'torch', 'sqlalchemy')))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNICORE_")}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert {line.split()[1] for line in r.stdout.splitlines()[1:-1]} >= {"jsonl", "wandb"}
    assert r.stdout.splitlines()[-1] == "['omnicore_logger_wandb', 'omnicore_logger_wandb.plugin']"  # the hook module, nothing heavy


@pytest.mark.slow
def test_dir_option_disabled_mode_and_bad_images(tmp_path):
    from omnicore.api import Registry

    registry = Registry.discover()
    info = TestWandbContract().run_info(tmp_path / "run")
    logger = registry.build("logger", "wandb", {"mode": "offline", "dir": str(tmp_path / "elsewhere"), "tags": ["t1"], "name": "n1"})
    logger.start(info)
    logger.log_metrics(7, {"step": 7, "loss": 0.5}, "val")
    with pytest.raises(ValueError, match=r"expected uint8 arrays \[H, W, 3\]"):
        logger.log_images(7, "x", [np.zeros((4, 4), np.uint8)])
    logger.close()
    logger.close()
    assert read_history(tmp_path / "elsewhere") == {("val", "loss"): [(7, 0.5)]}
    assert not (tmp_path / "run").exists()

    off = registry.build("logger", "wandb", {"mode": "disabled"})
    off.start(info)
    off.log_metrics(1, {"step": 1, "loss": 1.0}, "train")
    off.close()
    assert list((tmp_path / "run").rglob("*.wandb")) == []


@pytest.mark.slow
def test_a_run_of_the_users_own_code_stays_open(tmp_path):
    """close() waits for wandb-core (wandb.teardown) only when no other W&B run of the process is active."""
    import wandb

    from omnicore.api import Registry

    mine = wandb.init(mode="offline", dir=str(tmp_path / "user"), project="user", reinit="create_new", settings=wandb.Settings(silent=True))
    logger = Registry.discover().build("logger", "wandb", {"mode": "offline"})
    logger.start(TestWandbContract().run_info(tmp_path / "run"))
    logger.log_metrics(1, {"step": 1, "loss": 1.5}, "train")
    logger.close()
    mine.log({"step": 5, "user/x": 2.0})  # still open: the logger's close left it alone
    mine.finish()
    wandb.teardown()
    assert read_history(tmp_path / "run") == {("train", "loss"): [(1, 1.5)]}
    assert read_history(tmp_path / "user") == {("user", "x"): [(5, 2.0)]}


@pytest.mark.slow
def test_cli_training_run_history_holds_the_losses_of_metrics_jsonl(tmp_path, capfd):
    """``omnicore train`` with ``run.loggers: [jsonl, wandb, mlflow]`` (mlflow when its plugin is
    installed): W&B's history and MLflow's metric history hold exactly the losses of metrics.jsonl,
    and wandb printed nothing."""
    from omnicore.api import Registry
    from omnicore.testing import cli_main as main

    lines = []
    for i in range(16):
        q = "Say the number " + " ".join(str((i * 7 + k) % 10) for k in range(1 + i % 9))
        lines.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 5)}]})
    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with_mlflow = any(row.name == "mlflow" and row.status == "available" for row in Registry.discover().components("logger"))
    loggers = ["jsonl", {"name": "wandb", "options": {"mode": "offline"}}] + (["mlflow"] if with_mlflow else [])
    cfg = {
        "run": {"output_dir": str(tmp_path / "run"), "seed": 0, "loggers": loggers},
        "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": TINY_LM}}},
        "data": {"train": str(data), "max_tokens": 512},
        "train": {"max_steps": 4, "lr": 3e-3, "warmup_steps": 1, "progress": False, "export": False},
    }
    (tmp_path / "cfg.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    assert main(["train", str(tmp_path / "cfg.yaml")]) == 0
    printed = capfd.readouterr()
    assert [
        line for line in (printed.out + printed.err).splitlines() if "wandb:" in line
    ] == []  # wandb's own prefix: no banner, no warnings
    assert "LoggerWarning" not in printed.out + printed.err  # no logger failed, closing included
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    history = read_history(tmp_path / "run")
    assert [s for s, _ in history[("train", "loss")]] == [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [v for _, v in history[("train", "loss")]] == [r["loss"] for r in rows]  # exactly: JSON both ways
    assert [v for _, v in history[("train", "lr")]] == [r["lr"] for r in rows]
    config = run_config(tmp_path / "run")
    assert config["train"]["max_steps"] == 4 and config["run"]["loggers"][1]["name"] == "wandb"
    if with_mlflow:
        from mlflow import MlflowClient

        client = MlflowClient("sqlite:///" + str(tmp_path / "run" / "mlflow" / "mlflow.db"))
        (run,) = client.search_runs([client.get_experiment_by_name("omnicore").experiment_id])
        losses = client.get_metric_history(run.info.run_id, "train/loss")
        assert [(m.step, m.value) for m in losses] == [(r["step"], r["loss"]) for r in rows]  # float64 in SQLite: exact
        assert run.data.params["train.max_steps"] == "4" and run.info.status == "FINISHED"
