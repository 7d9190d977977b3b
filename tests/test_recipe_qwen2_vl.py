"""The Qwen2-VL fine-tuning recipe (examples/qwen2_vl) end to end on a small copy of its data:
prepare (stand-in checkpoint and data), train through the CLI, evaluate from the export, then
serve the export with transformers alone (``serve.py``, no omnicore import). transformers'
greedy answers must equal omnicore's for the same held-out samples, and the export must be the
family's class."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "qwen2_vl"
OMNICORE = Path(sys.executable).with_name("omnicore")


def _run(*args: str, cwd: Path) -> str:
    r = subprocess.run([*args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{args[:3]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.mark.cli
@pytest.mark.slow
def test_recipe_trains_exports_and_transformers_serves_the_same_answers(tmp_path):
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "config.yaml").write_text((RECIPE / "config.yaml").read_text())
    _run(sys.executable, str(RECIPE / "prepare.py"), "--checkpoint", str(recipe / "standin"), "--out", str(recipe / "data"),
         "--train", "48", "--eval", "6", cwd=tmp_path)  # fmt: skip
    out = tmp_path / "run"
    overrides = ["--run.output_dir", str(out), "--train.max_steps", "12", "--train.save_every", "12", "--eval.every", "12"]
    _run(str(OMNICORE), "train", str(recipe / "config.yaml"), *overrides, cwd=tmp_path)
    config = json.loads((out / "export" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]
    _run(str(OMNICORE), "eval", str(recipe / "config.yaml"), "--run.output_dir", str(out), "--export", str(out / "export"), cwd=tmp_path)
    ours = [s for s in json.loads((out / "eval.json").read_text())["samples"] if s["task"] == "colour"]
    served = tmp_path / "served.json"
    printed = _run(sys.executable, str(RECIPE / "serve.py"), str(out / "export"), "--data", str(recipe / "data" / "eval.jsonl"),
                   "--limit", "6", "--max-new-tokens", "8", "--json", str(served), cwd=tmp_path)  # fmt: skip
    assert "loaded Qwen2VLForConditionalGeneration" in printed
    theirs = json.loads(served.read_text())
    assert len(ours) == len(theirs) == 6
    assert [t["expected"] for t in theirs] == [o["expected"] for o in ours]
    assert [t["answer"] for t in theirs] == [o["answer"] for o in ours]
