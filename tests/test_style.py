"""Lint and format: ``ruff check`` and ``ruff format --check`` over the repository (configuration in
the root ``pyproject.toml``), so style drift fails the test command like any other regression."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: run bash scripts/setup.sh (it installs the pinned ruff), or pip install 'ruff==0.14.14'")
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint_passes():
    r = _ruff("check", "--no-cache", ".")
    assert r.returncode == 0, f"ruff check found problems (fix them, or `ruff check --fix .`):\n{r.stdout}{r.stderr}"


def test_ruff_format_is_applied():
    r = _ruff("format", "--no-cache", "--check", ".")
    assert r.returncode == 0, f"files not formatted (run `ruff format .`):\n{r.stdout}{r.stderr}"
