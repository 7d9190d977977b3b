"""logger/tensorboard: omnicore's LoggerContract suite, with the values read back from the event
files by tensorboard's own reader, and a short training run whose event files hold exactly the
losses of metrics.jsonl (as float32, TensorBoard's scalar type)."""

from __future__ import annotations

import json
from pathlib import Path

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


def read_events(log_dir: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """Every scalar in the event files under ``log_dir`` as ``{(split, key): [(step, value), ...]}``,
    read with tensorboard's ``EventAccumulator`` (tags ``split/key``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for tag in acc.Tags()["scalars"]:
        split, _, key = tag.partition("/")
        out[(split, key)] = [(e.step, e.value) for e in acc.Scalars(tag)]
    return out


class TestTensorBoardContract(LoggerContract):
    name = "tensorboard"
    rtol = 1e-6  # float32 storage: 2.25 and 1e-4 round-trip within this

    def read_back(self, output_dir):
        return read_events(Path(output_dir) / "tensorboard")


def test_config_text_and_images_are_written(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    contract = TestTensorBoardContract()
    contract._log_all(tmp_path / "run", contract.rows)
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    (img,) = acc.Images("samples/image")
    assert img.step == 2 and (img.width, img.height) == (24, 8)  # one grid of the two 8x12 images, side by side
    (text,) = acc.Tensors("config/text_summary")
    assert '"max_steps": 3' in text.tensor_proto.string_val[0].decode()


def test_log_dir_option_and_bad_images(tmp_path):
    from omnicore.api import Registry

    logger = Registry.discover().build("logger", "tensorboard", {"log_dir": str(tmp_path / "elsewhere"), "flush_secs": 5})
    logger.start(TestTensorBoardContract().run_info(tmp_path / "run"))
    logger.log_metrics(7, {"step": 7, "loss": 0.5}, "val")
    with pytest.raises(ValueError, match=r"expected uint8 arrays \[H, W, 3\] of one size"):
        logger.log_images(7, "x", [np.zeros((4, 4, 3), np.uint8), np.zeros((4, 5, 3), np.uint8)])
    logger.close()
    logger.close()
    assert read_events(tmp_path / "elsewhere") == {("val", "loss"): [(7, 0.5)]}
    assert not (tmp_path / "run" / "tensorboard").exists()


@pytest.mark.slow
def test_training_run_event_files_hold_the_losses_of_metrics_jsonl(tmp_path):
    from omnicore.api import Registry
    from omnicore.testing import Config, train

    lines = []
    for i in range(16):
        q = "Say the number " + " ".join(str((i * 7 + k) % 10) for k in range(1 + i % 9))
        lines.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 5)}]})
    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = Config.model_validate(
        {
            "run": {"output_dir": str(tmp_path / "run"), "seed": 0, "loggers": ["jsonl", "tensorboard"]},
            "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": TINY_LM}}},
            "data": {"train": str(data), "max_tokens": 512},
            "train": {"max_steps": 4, "lr": 3e-3, "warmup_steps": 1, "progress": False, "export": False},
        }
    )
    history = train(cfg, registry=Registry.discover())
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    events = read_events(tmp_path / "run" / "tensorboard")
    assert [s for s, _ in events[("train", "loss")]] == [r["step"] for r in rows] == [1, 2, 3, 4]
    want = np.array([r["loss"] for r in rows], dtype=np.float32)  # what a float32 scalar holds
    assert np.array_equal(np.array([v for _, v in events[("train", "loss")]], dtype=np.float32), want)
    assert [r["loss"] for r in rows] == [r["loss"] for r in history]
    np.testing.assert_allclose([v for _, v in events[("train", "lr")]], [r["lr"] for r in rows], rtol=1e-6)
