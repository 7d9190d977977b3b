"""An encoder written as PLUGINS.md shows it (its data side held as ``.processor``, no ``collate``
on the module) works in every path the core calls: training with validation's held-out loss and
task accuracy, ``omnicore generate`` and ``omnicore eval``; and a failure in validation never loses
the steps already trained (they are saved before the run stops)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config_dict
from PIL import Image
from test_testing_kit import HOOK, TOY

from omnicore.config import Config


@pytest.fixture
def data(tmp_path) -> Path:
    """8 grey images and a JSONL of ``Which number? -> N`` about them, for training and held out."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8), "L").save(tmp_path / f"img{i}.png")
        user = [{"type": "image", "path": f"img{i}.png"}, {"type": "text", "text": "Which number?"}]
        lines.append({"task": "number", "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": str(i % 4)}]})
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path


def _cfg(data: Path, bug: str = "", **train) -> Config:
    d = tiny_config_dict(str(data / "data.jsonl"), eval=str(data / "data.jsonl"), decoders=False, output_dir=str(data / "run"), **train)
    d["model"]["encoders"] = {"image": {"name": "toy", "options": {"bug": bug} if bug else {}}}
    d["eval"] = {"every": 2, "task_samples": 4}
    d["generate"] = {"max_new_tokens": 2}
    cfg = Config.model_validate(d)
    cfg.source = str(data / "config.yaml")
    return cfg


@pytest.mark.slow
def test_an_encoder_that_holds_its_processor_works_in_validation_generate_and_eval(fake_distribution, data, tmp_path):
    from omnicore.eval.generate import generate_cli
    from omnicore.eval.scoring import evaluate
    from omnicore.train.loop import train

    fake_distribution("omnicore-toy", "0.3", {"toy": "toy_hook"}, {"toy_hook": HOOK, "toy_encoder": TOY})
    import toy_encoder

    assert not hasattr(toy_encoder.Toy, "collate")  # the module holds its processor; the processor collates
    cfg = _cfg(data, max_steps=2, save_every=2)
    train(cfg)
    val = [json.loads(x) for x in (data / "run" / "metrics.jsonl").read_text().splitlines() if '"split": "val"' in x]
    assert [r["step"] for r in val] == [2] and val[0]["val_acc_samples"] == 4 and np.isfinite(val[0]["val_loss"])
    lines = list(generate_cli(cfg, prompts=["Which number?"], image=str(data / "img0.png"), audio=None, out_dir=str(tmp_path / "gen"),
                              checkpoint=None, export=None))  # fmt: skip
    assert len(lines) == 1 and lines[0].startswith("text: ")
    result = evaluate(cfg, limit=4, progress=False)
    assert result["total"] == 4 and result["accuracy"] == val[0]["val_acc"]  # validation's accuracy is eval's


@pytest.mark.slow
def test_a_failing_validation_saves_the_steps_trained_first(fake_distribution, data):
    """The encoder fails in eval mode (validation's held-out loss) after step 2, with no save due
    before step 4: the run stops with the cause, and step 2 is saved and resumable."""
    from omnicore.train.loop import EvaluationFailed, train

    fake_distribution("omnicore-toy", "0.3", {"toy": "toy_hook"}, {"toy_hook": HOOK, "toy_encoder": TOY})
    cfg = _cfg(data, bug="train_only", max_steps=4, save_every=4)
    cfg.command = ["train", cfg.source, "--train.lr", "0.003"]
    with pytest.raises(EvaluationFailed) as info:
        train(cfg)
    msg = str(info.value)
    step2 = data / "run" / "checkpoints" / "step-00000002"
    assert isinstance(info.value.__cause__, RuntimeError) and "toy: no eval mode" in msg
    assert f"the 2 steps trained are saved in {step2}" in msg
    assert f"continue with: omnicore train {cfg.source} --train.lr 0.003 --resume" in msg
    assert (step2 / "trainer_state.json").is_file() and (data / "run" / "checkpoints" / "latest").read_text().strip() == step2.name


@pytest.mark.slow
def test_a_bad_held_out_line_stops_the_run_as_one_error_after_saving(fake_distribution, data):
    """A user's error in validation (a held-out line that is no JSON, data.on_error: raise) is still
    a SampleError (the CLI's one ``error:`` line), now after step 2 was saved."""
    from omnicore.data.jsonl import SampleError
    from omnicore.train.loop import train

    fake_distribution("omnicore-toy", "0.3", {"toy": "toy_hook"}, {"toy_hook": HOOK, "toy_encoder": TOY})
    (data / "eval.jsonl").write_text((data / "data.jsonl").read_text() + "{not json\n")
    cfg = _cfg(data, max_steps=4, save_every=4)
    cfg.data.eval = str(data / "eval.jsonl")
    with pytest.raises(SampleError, match=r"eval\.jsonl:9: not valid JSON .*; the 2 steps trained are saved in .*step-00000002"):
        train(cfg)
    assert (data / "run" / "checkpoints" / "step-00000002" / "trainer_state.json").is_file()
