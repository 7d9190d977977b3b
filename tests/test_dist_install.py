"""The first user story from wheels: ``pip install --find-links DIST omnicore-audio-whisper`` in a fresh venv.

``scripts/build_dist.sh`` builds every wheel and sdist (and checks their metadata) into a temporary
folder. A new virtual environment then installs the plugin by name from that folder alone
(``--no-index``): pip must take the core from there too, the plugin must be listed by
``omnicore plugins`` from that non-editable install and train a few steps, and after
``pip uninstall`` its component must be gone from the listing.

Nothing is downloaded. The fresh environment sees the development environment's third-party packages
(torch, transformers, ...) through a ``.pth`` file naming a folder of links to them, with every
omnicore distribution and editable finder left out, so pip finds those requirements already
installed and installs only ``omnicore`` and ``omnicore-audio-whisper``, from the wheels. The fresh
environment has no pip of its own (``ensurepip`` would take longer than the install); the
development environment's pip installs into it with ``--python``. Configured indexes, find-links and
constraints are switched off (``PIP_CONFIG_FILE`` set to the null device), so the wheels folder is
the only source.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, tiny_config_dict

pytestmark = [pytest.mark.slow, pytest.mark.cli]

PLUGIN, COMPONENT = "omnicore-audio-whisper", ("encoder", "whisper")
LEFT_OUT = ("omnicore", "__editable__", "__pycache__", "pip", "_distutils_hack", "distutils-precedence")
"""Entries of the development site-packages the fresh environment must not see: the omnicore
distributions (editable here) and their finders, pip (it comes from the development environment)."""


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _clean_env() -> dict[str, str]:
    """The environment without pip settings, Python paths, a venv or omnicore switches; strict plugins."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "OMNICORE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", OMNICORE_STRICT="1", OMP_NUM_THREADS="1")
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """Every wheel and sdist, built by scripts/build_dist.sh (which also checks their metadata)."""
    out = tmp_path_factory.mktemp("dist")
    env = dict(os.environ, PYTHON=sys.executable)
    _run(["bash", str(ROOT / "scripts" / "build_dist.sh"), "--out", str(out)], env, ROOT)
    assert {p.name for p in out.glob("*.whl")} >= {"omnicore-0.1.0-py3-none-any.whl", "omnicore_audio_whisper-0.1.0-py3-none-any.whl"}
    return out


def _fresh_venv(work: Path) -> tuple[Path, Path]:
    """A new venv without pip whose ``.pth`` adds a folder of links to this environment's third-party
    packages; returns (its python, its site-packages)."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], _clean_env(), work)
    python = work / "venv" / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], _clean_env(), work).stdout.strip())
    links = work / "third-party"
    links.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if not entry.name.startswith(LEFT_OUT) and entry.suffix != ".pth":
            (links / entry.name).symlink_to(entry)
    (site / "third-party.pth").write_text(f"{links}\n")
    return python, site


def _listing(omnicore: Path, env: dict[str, str], cwd: Path) -> dict[tuple[str, str], dict]:
    rows = json.loads(_run([str(omnicore), "plugins", "--json"], env, cwd).stdout)
    return {(r["kind"], r["name"]): r for r in rows}


def test_plugin_installs_by_name_from_the_wheels_lists_trains_and_uninstalls(dist, tmp_path):
    env = _clean_env()
    python, site = _fresh_venv(tmp_path)
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    probe = "import importlib.util as u; print(u.find_spec('omnicore') is None, u.find_spec('torch') is not None)"
    assert _run([str(python), "-c", probe], env, tmp_path).stdout.split() == ["True", "True"]  # torch seen, omnicore not

    out = _run(pip + ["install", "--no-index", "--find-links", str(dist), PLUGIN], env, tmp_path).stdout
    assert "Successfully installed omnicore-0.1.0 omnicore-audio-whisper-0.1.0" in out, out[-2000:]
    show = _run(pip + ["show", "omnicore", PLUGIN], env, tmp_path).stdout
    assert show.count(f"Location: {site}\n") == 2, show
    where = "import omnicore, omnicore_audio_whisper; print(omnicore.__file__); print(omnicore_audio_whisper.__file__)"
    for path in _run([str(python), "-c", where], env, tmp_path).stdout.split():
        assert Path(path).is_relative_to(site), path  # the installed wheels, not the editable tree
    assert not list(site.glob("__editable__*"))

    omnicore = python.parent / "omnicore"
    version = _run([str(omnicore), "--version"], env, tmp_path).stdout
    assert version.startswith("omnicore 0.1.0 (core API "), version
    rows = _listing(omnicore, env, tmp_path)
    row = rows[COMPONENT]
    assert (row["provider"], row["version"], row["status"]) == (PLUGIN, "0.1.0", "available"), row
    assert {r["provider"] for r in rows.values()} == {"omnicore", PLUGIN}  # none of the editable plugins

    data = tmp_path / "data"
    builder = [sys.executable, str(ROOT / "examples" / "digits" / "build_data.py"), "--out", str(data), "--train-audio", "8"]
    _run(builder + ["--train-images", "0", "--gen", "0", "--eval-images", "0", "--eval-audio", "0"], env, tmp_path)
    cfg = tiny_config_dict(str(data / "train.jsonl"), decoders=False, max_steps=3)
    del cfg["model"]["encoders"]["image"]  # audio only: whisper is the one plugin installed
    cfg["data"]["num_workers"] = 0  # no worker processes to start
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    _run([str(omnicore), "train", "cfg.yaml"], env, tmp_path)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [s["loss"] for s in steps if "loss" in s and s.get("step")]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), steps
    assert losses[-1] < losses[0], losses  # lr 3e-3 on one small batch: it learns
    assert (tmp_path / "run" / "checkpoints" / "step-00000003" / "manifest.json").is_file()

    _run(pip + ["uninstall", "-y", PLUGIN], env, tmp_path)
    rows = _listing(omnicore, env, tmp_path)
    assert COMPONENT not in rows and not [r for r in rows.values() if r["provider"] == PLUGIN]
    assert ("foundation", "hf_causal_lm") in rows  # the core still lists its built-ins
