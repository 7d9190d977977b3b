"""The import graph of omnicore: no cycles, no lower layer importing a higher one
(``scripts/check_imports.py`` holds the layers and the checker)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


@pytest.mark.slow
def test_omnicore_has_no_cycles_and_no_upward_imports():
    g = check.graph()
    assert len(g) > 40 and sum(len(d) for d in g.values()) > 60  # the real package, parsed
    assert check.cycles(g) == []
    assert check.upward(g) == []


@pytest.mark.slow
def test_eval_and_train_depend_one_way():
    """``train`` asks ``eval`` (validator, sampler); nothing under ``eval`` imports ``train``, and the
    layers say so (eval below train), so an import back is reported as upward."""
    g = check.graph()
    evals = [m for m in g if m == "omnicore.eval" or m.startswith("omnicore.eval.")]
    assert len(evals) >= 5
    assert [(a, b) for a in evals for b in g[a] if b.startswith("omnicore.train")] == []
    assert {"omnicore.eval.validate", "omnicore.eval.samples"} <= g["omnicore.train.loop"]
    assert check.layer_of("omnicore.eval.heldout") < check.layer_of("omnicore.train.loop")


@pytest.mark.slow
def test_every_module_is_in_a_layer():
    for module in check.graph():
        check.layer_of(module)  # raises KeyError naming the module otherwise


@pytest.mark.cli
def test_command_exits_0_and_reports_the_figures():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_imports.py")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 cycles, 0 upward imports" in r.stdout


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / "omnicore" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_checker_finds_an_upward_import_a_lazy_one_and_a_cycle(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "components.py": "",
            "data/__init__.py": "",
            "data/chat.py": "def f():\n    from omnicore.model.omni import OmniModel\n",  # lazy, still upward
            "model/__init__.py": "",
            "model/omni.py": "from omnicore.data.chat import f\nfrom omnicore.model import build\n",
            "model/build.py": "from . import omni\n",  # relative import, a cycle with omni
            "config.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from omnicore.train.loop import train\n",
            "train/__init__.py": "",
            "train/loop.py": "import omnicore.config\n",
        },
    )
    g = check.graph(root)
    assert g["omnicore.data.chat"] == {"omnicore.model.omni"}
    assert g["omnicore.model.build"] == {"omnicore.model.omni"}
    assert g["omnicore.config"] == set()  # under TYPE_CHECKING: not a dependency at run time
    assert g["omnicore.train.loop"] == {"omnicore.config"}
    assert check.upward(g) == [("omnicore.data.chat", "omnicore.model.omni")]
    assert ["omnicore.data.chat", "omnicore.model.build", "omnicore.model.omni"] in check.cycles(g) or [
        "omnicore.model.build",
        "omnicore.model.omni",
    ] in check.cycles(g)
