"""logger/mlflow: omnicore's LoggerContract suite, with the values read back by ``MlflowClient`` from
the SQLite store in the run folder; the params hold the config, the config and the images are
artifacts (pixels read back), and a resumed start continues the same MLflow run.

The training run through the CLI with ``run.loggers: [jsonl, wandb, mlflow]`` is in the W&B
plugin's tests (``plugins/omnicore-logger-wandb/tests``), which check both stores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from omnicore.testing import LoggerContract

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _local_store(monkeypatch):
    """The default store under test, whatever this machine's MLflow variables say."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)


def client_and_run(output_dir: Path):
    """An ``MlflowClient`` on the default store of ``output_dir`` and the one run of experiment ``omnicore``."""
    from mlflow import MlflowClient

    client = MlflowClient("sqlite:///" + str(Path(output_dir) / "mlflow" / "mlflow.db"))
    (run,) = client.search_runs([client.get_experiment_by_name("omnicore").experiment_id])
    return client, run


def read_store(output_dir: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """Every metric of the run as ``{(split, key): [(step, value), ...]}`` (names ``split/key``), by
    ``MlflowClient.get_metric_history``."""
    client, run = client_and_run(output_dir)
    out = {}
    for name in run.data.metrics:
        split, _, key = name.partition("/")
        out[(split, key)] = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
    return out


class TestMlflowContract(LoggerContract):
    name = "mlflow"
    rtol = 0.0  # SQLite keeps a float64 exactly

    def read_back(self, output_dir):
        return read_store(Path(output_dir))


def test_params_config_and_images_are_stored(tmp_path):
    from PIL import Image

    contract = TestMlflowContract()
    out = tmp_path / "run"
    contract._log_all(out, contract.rows)
    client, run = client_and_run(out)
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params == {"run.output_dir": str(out), "run.seed": "0", "train.max_steps": "3", "train.lr": "0.0003"}
    nan = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in nan] == [1, 2, 3] and np.isnan(nan[2].value) and "train/skip_reason" not in run.data.metrics
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/skipped")] == [(1, 0.0), (2, 0.0), (3, 1.0)]
    folder = Path(run.info.artifact_uri)  # a local folder: out/mlflow/artifacts/<run id>/artifacts
    assert folder == (out / "mlflow" / "artifacts" / run.info.run_id / "artifacts").resolve()
    assert json.loads((folder / "config.json").read_text()) == contract.run_info(out)["config"]
    for i, want in enumerate(contract.images()):
        (png,) = (folder / "images").glob(f"samples~image~{i}+step+2+*.png")
        assert np.array_equal(np.asarray(Image.open(png).convert("RGB")), want)  # lossless: the pixels come back


def test_resume_continues_the_run_and_keeps_its_params(tmp_path):
    contract = TestMlflowContract()
    out = tmp_path / "run"
    contract._log_all(out, contract.rows[:2])
    logger = contract.build()
    info = contract.run_info(out, resume=True, start_step=2)
    info["config"]["train"]["max_steps"] = 6  # continued for longer: MLflow forbids changing the param
    info["config"]["train"]["grad_accum"] = 2
    logger.start(info)
    logger.log_metrics(3, {"step": 3, "loss": 2.0}, "train")
    logger.close()
    client, run = client_and_run(out)
    assert run.data.params["train.max_steps"] == "3" and run.data.params["train.grad_accum"] == "2"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")] == [(1, 2.5), (2, 2.25), (3, 2.0)]
    names = sorted(a.path for a in client.list_artifacts(run.info.run_id))
    assert names == ["config-resume-step-2.json", "config.json", "images"]


def test_options_and_bad_images(tmp_path):
    from mlflow import MlflowClient

    from omnicore.api import Registry

    uri = "sqlite:///" + str(tmp_path / "shared.db")
    options = {"tracking_uri": uri, "artifact_location": "art", "experiment": "exp1", "run_name": "r1", "tags": {"team": "a"}}
    logger = Registry.discover().build("logger", "mlflow", options)
    logger.start(TestMlflowContract().run_info(tmp_path / "run"))
    logger.log_metrics(7, {"step": 7, "loss": 0.5, "a{b}": 1}, "val")
    with pytest.raises(ValueError, match=r"expected uint8 arrays \[H, W, 3\]"):
        logger.log_images(7, "x", [np.zeros((4, 4, 3), np.float32)])
    logger.close()
    logger.close()
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("exp1")
    assert experiment.artifact_location == str((tmp_path / "run" / "art").resolve())
    (run,) = client.search_runs([experiment.experiment_id])
    assert (run.info.run_name, run.data.tags["team"]) == ("r1", "a")
    assert run.data.metrics == {"val/loss": 0.5, "val/a_b_": 1.0}
    assert not (tmp_path / "run" / "mlflow" / "mlflow.db").exists()


def test_flatten_config():
    from omnicore_logger_mlflow.logger import MAX_PARAM_VALUE, flatten_config

    got = flatten_config({"a": {"b": 1, "c": [1, "x"], "d": {}, "e": None, "f": True}, "g": "text", "h@i": "y" * 7000})
    assert got == {"a.b": "1", "a.c": '[1, "x"]', "a.d": "{}", "a.e": "null", "a.f": "true", "g": "text", "h_i": "y" * MAX_PARAM_VALUE}
