"""The family fine-tuning recipe (examples/families) end to end on a small copy of its data:
prepare (the kit's stand-in checkpoint and data), train through the CLI with
``model.foundation.name: auto``, evaluate from the export, then serve the export with transformers
(``serve.py``: ``AutoModelForImageTextToText`` and the kit's processor loader, no omnicore run).
transformers' greedy answers must equal omnicore's for the same held-out samples, and the export
must be the model type's own class: for the default model type (a family plugin's) and for one the
generic family serves."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "families"
OMNICORE = Path(sys.executable).with_name("omnicore")


def _prepare():
    """examples/families/prepare.py as a module (its ``main`` runs in this process)."""
    spec = importlib.util.spec_from_file_location("families_prepare", RECIPE / "prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str, cwd: Path) -> str:
    r = subprocess.run([*args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{args[:3]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout + r.stderr


def _class_of(model_type: str) -> str:
    """The class transformers maps ``model_type`` to for image-text-to-text (the reference for
    the export's ``architectures``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type]


def _plugin_foundations() -> dict[str, str]:
    """``model type -> foundation name`` as the family plugins name their model types in their
    foundation specs (the generic family's ``*`` left out)."""
    from omnicore.api import Registry

    rows = [r for r in Registry.discover().rows if r.kind == "foundation" and r.spec is not None]
    return {t: r.name for r in rows for t in (r.spec.extra or {}).get("model_types", ()) if t != "*"}


# (model type, steps): the default, a family plugin's; and one the generic family serves, shorter
RUNS = [("qwen2_vl", 12), ("llava_next", 6)]


@pytest.mark.cli
@pytest.mark.slow
@pytest.mark.parametrize(("family", "steps"), RUNS, ids=[f for f, _ in RUNS])
def test_recipe_trains_exports_and_transformers_serves_the_same_answers(tmp_path, family, steps):
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "config.yaml").write_text((RECIPE / "config.yaml").read_text())
    printed = _run(sys.executable, str(RECIPE / "prepare.py"), "--family", family, "--checkpoint", str(recipe / "standins" / family),
                   "--out", str(recipe / "data"), "--train", "48", "--eval", "6", cwd=tmp_path)  # fmt: skip
    foundation = _plugin_foundations().get(family, "generic")
    assert f"foundation: auto picks {foundation} ({_class_of(family)})" in printed
    out = tmp_path / "run"
    model = ["--model.foundation.options.checkpoint", f"standins/{family}"]  # as run.sh gives it; the name stays auto
    every = str(steps)
    overrides = ["--run.output_dir", str(out), "--train.max_steps", every, "--train.save_every", every, "--eval.every", every, *model]
    if steps < 20:
        overrides += ["--train.warmup_steps", "2"]
    _run(str(OMNICORE), "train", str(recipe / "config.yaml"), *overrides, cwd=tmp_path)
    config = json.loads((out / "export" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (family, [_class_of(family)])
    _run(str(OMNICORE), "eval", str(recipe / "config.yaml"), "--run.output_dir", str(out), *model, "--export", str(out / "export"),
         cwd=tmp_path)  # fmt: skip
    ours = [s for s in json.loads((out / "eval.json").read_text())["samples"] if s["task"] == "colour"]
    served = tmp_path / "served.json"
    printed = _run(sys.executable, str(RECIPE / "serve.py"), str(out / "export"), "--data", str(recipe / "data" / "eval.jsonl"),
                   "--limit", "6", "--max-new-tokens", "8", "--json", str(served), cwd=tmp_path)  # fmt: skip
    assert f"loaded {_class_of(family)} from" in printed
    theirs = json.loads(served.read_text())
    assert len(ours) == len(theirs) == 6
    assert [t["expected"] for t in theirs] == [o["expected"] for o in ours]
    assert [t["answer"] for t in theirs] == [o["answer"] for o in ours]


def test_prepare_refuses_a_checkpoint_folder_of_another_model_type(tmp_path, capsys):
    folder = tmp_path / "standin"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    argv = ["--checkpoint", str(folder), "--out", str(tmp_path / "data"), "--train", "2", "--eval", "1"]
    assert _prepare().main(["--family", "llava_next", *argv]) == 2
    err = capsys.readouterr().err
    assert f"{folder} already holds a 'qwen2_vl' checkpoint, not 'llava_next' (--family)" in err
    assert "give another --checkpoint folder, or delete" in err
    assert not (tmp_path / "data").exists()  # stopped before writing anything


def test_prepare_names_the_model_types_it_takes(tmp_path, capsys):
    argv = ["--family", "nonesuch", "--checkpoint", str(tmp_path / "standin"), "--out", str(tmp_path / "data")]
    assert _prepare().main(argv) == 2
    err = capsys.readouterr().err
    from omnicore_family_kit.standins import STANDINS

    assert "--family 'nonesuch' has no stand-in; choose one of " in err
    for model_type, standin in STANDINS.items():
        assert (f" {model_type}," in err or err.rstrip().endswith(f" {model_type}")) == (standin.modality == "image"), model_type
    assert not (tmp_path / "standin").exists() and not (tmp_path / "data").exists()


@pytest.mark.slow
def test_prepare_writes_a_generic_family_standin_and_keeps_it(tmp_path, capsys):
    folder = tmp_path / "standin"
    argv = ["--family", "idefics3", "--checkpoint", str(folder), "--out", str(tmp_path / "data"), "--train", "2", "--eval", "1"]
    assert _prepare().main(argv) == 0
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("idefics3", [_class_of("idefics3")])
    printed = capsys.readouterr().out
    assert "idefics3" not in _plugin_foundations()
    assert f"foundation: auto picks generic ({_class_of('idefics3')})" in printed
    # the generic family's part names are the class's own attributes under its model
    from transformers import AutoConfig, Idefics3ForConditionalGeneration

    with __import__("torch").device("meta"):
        hf = Idefics3ForConditionalGeneration(AutoConfig.from_pretrained(folder))
    parts = re.search(r"part names for train.freeze: (.*)", printed).group(1).split(", ")
    assert sorted(parts) == sorted(["language_model", *(n for n, _ in hf.model.named_children() if n != "text_model")])
    assert len((tmp_path / "data" / "train.jsonl").read_text().splitlines()) == 2
    assert _prepare().main(argv) == 0  # the same type again: kept
    assert "already holds a idefics3 config.json, kept" in capsys.readouterr().out


@pytest.mark.slow
def test_prepare_refuses_a_model_type_no_family_serves_exactly(tmp_path, capsys):
    folder = tmp_path / "standin"
    argv = ["--family", "aya_vision", "--checkpoint", str(folder), "--out", str(tmp_path / "data")]
    assert _prepare().main(argv) == 2
    err = capsys.readouterr().err
    assert "prepare.py: aya_vision: " in err and "cannot serve it exactly" in err and "logit_scale" in err
    assert not folder.exists() and not (tmp_path / "data").exists()  # the stand-in it wrote is gone; no data


def test_run_sh_lets_the_model_type_pick_the_foundation():
    script = (RECIPE / "run.sh").read_text()
    assert "case " not in script  # no table of families: auto reads the checkpoint's model type
    assert 'MODEL=(--model.foundation.name auto --model.foundation.options.checkpoint "$CHECKPOINT")' in script
    assert "CHECKPOINT=standins/$FAMILY" in script and "OUT=${OUT:-runs/$FAMILY}" in script
    config = (RECIPE / "config.yaml").read_text()
    assert re.search(r"^    name: auto\b", config, re.M) and re.search(r"^      checkpoint: standins/qwen2_vl\b", config, re.M)


def test_readme_names_a_hub_id_for_each_image_model_type_of_the_matrix():
    """Every model type of docs/families.md's matrix that takes images and has a stand-in has a row
    in the README's Hub table, and no other type does."""
    from omnicore_family_kit.standins import STANDINS

    matrix = (ROOT / "docs" / "families.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \|[^|]*\|[^|]*\|([^|]*)\|", matrix, re.M)
    image_types = {t for t, takes in rows if "images" in takes and t in STANDINS}
    assert {"llava", "llava_next", "idefics3", "qwen2_vl", "qwen3_vl"} <= image_types
    readme = (RECIPE / "README.md").read_text()
    table = dict(re.findall(r"^\| `(\w+)` \| `([\w.-]+/[\w.-]+)` \|", readme, re.M))
    assert set(table) == image_types
