"""The Qwen2-VL fine-tuning recipe (examples/qwen2_vl) end to end on a small copy of its data:
prepare (stand-in checkpoint and data), train through the CLI, evaluate from the export, then
serve the export with transformers alone (``serve.py``, no omnicore import). transformers'
greedy answers must equal omnicore's for the same held-out samples, and the export must be the
family's class."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "qwen2_vl"
OMNICORE = Path(sys.executable).with_name("omnicore")


def _prepare():
    """examples/qwen2_vl/prepare.py as a module (its ``main`` runs in this process)."""
    spec = importlib.util.spec_from_file_location("qwen2_vl_prepare", RECIPE / "prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str, cwd: Path) -> str:
    r = subprocess.run([*args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{args[:3]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


ARCHITECTURES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration"}


@pytest.mark.cli
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_recipe_trains_exports_and_transformers_serves_the_same_answers(tmp_path, family):
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "config.yaml").write_text((RECIPE / "config.yaml").read_text())
    _run(sys.executable, str(RECIPE / "prepare.py"), "--family", family, "--checkpoint", str(recipe / "standin"),
         "--out", str(recipe / "data"), "--train", "48", "--eval", "6", cwd=tmp_path)  # fmt: skip
    out = tmp_path / "run"
    model = ["--model.foundation.name", _prepare().FOUNDATIONS[family]]  # as run.sh selects it
    overrides = ["--run.output_dir", str(out), "--train.max_steps", "12", "--train.save_every", "12", "--eval.every", "12", *model]
    _run(str(OMNICORE), "train", str(recipe / "config.yaml"), *overrides, cwd=tmp_path)
    config = json.loads((out / "export" / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[family]]
    _run(str(OMNICORE), "eval", str(recipe / "config.yaml"), "--run.output_dir", str(out), *model, "--export", str(out / "export"),
         cwd=tmp_path)  # fmt: skip
    ours = [s for s in json.loads((out / "eval.json").read_text())["samples"] if s["task"] == "colour"]
    served = tmp_path / "served.json"
    printed = _run(sys.executable, str(RECIPE / "serve.py"), str(out / "export"), "--data", str(recipe / "data" / "eval.jsonl"),
                   "--limit", "6", "--max-new-tokens", "8", "--json", str(served), cwd=tmp_path)  # fmt: skip
    assert f"loaded {ARCHITECTURES[family]}" in printed
    theirs = json.loads(served.read_text())
    assert len(ours) == len(theirs) == 6
    assert [t["expected"] for t in theirs] == [o["expected"] for o in ours]
    assert [t["answer"] for t in theirs] == [o["answer"] for o in ours]


def test_prepare_refuses_a_checkpoint_folder_of_another_model_type(tmp_path, capsys):
    folder = tmp_path / "standin"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    argv = ["--checkpoint", str(folder), "--out", str(tmp_path / "data"), "--train", "2", "--eval", "1"]
    assert _prepare().main(["--family", "qwen2_5_vl", *argv]) == 2
    err = capsys.readouterr().err
    assert f"{folder} already holds a 'qwen2_vl' checkpoint, not 'qwen2_5_vl' (--family)" in err
    assert "give another --checkpoint folder, or delete" in err
    assert not (tmp_path / "data").exists()  # stopped before writing anything
    assert _prepare().main(["--family", "qwen2_vl", *argv]) == 0  # the same type: kept
    assert "already holds a qwen2_vl config.json, kept" in capsys.readouterr().out


def test_prepare_writes_a_qwen3_vl_standin(tmp_path, capsys):
    folder = tmp_path / "standin"
    argv = ["--family", "qwen3_vl", "--checkpoint", str(folder), "--out", str(tmp_path / "data"), "--train", "2", "--eval", "1"]
    assert _prepare().main(argv) == 0
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("qwen3_vl", ["Qwen3VLForConditionalGeneration"])
    assert "(foundation qwen3_vl)" in capsys.readouterr().out


def test_run_sh_selects_the_foundation_prepare_names_for_each_family():
    script = (RECIPE / "run.sh").read_text()
    for family, foundation in _prepare().FOUNDATIONS.items():
        assert re.search(rf"^  {family}\) STANDIN=\S+; FOUNDATION={foundation} ;;$", script, re.M), family
    assert "OUT=${OUT:-runs/$FAMILY}" in script
