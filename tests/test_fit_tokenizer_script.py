"""examples/digits/fit_tokenizer.sh fits the text BPE on every run and keeps the fitted MoVQGAN
tokenizer only while its inputs (the fit command with MOVQ_STEPS, the training images, the fit code)
are those it was fit from, and says why it fits again. The fits themselves are replaced by a fake
interpreter that records its calls."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "digits" / "fit_tokenizer.sh"
FIT_CODE = "plugins/omnicore-image-movqgan/omnicore_image_movqgan/fit.py"

FAKE_PY = """#!/usr/bin/env bash
# stands in for `python -m omnicore_image_movqgan.fit ... --out DIR ...`: records the call, writes DIR/config.json
echo "$*" >> "$CALLS"
while [ $# -gt 0 ]; do if [ "$1" = --out ]; then mkdir -p "$2"; echo '{}' > "$2/config.json"; fi; shift; done
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if shutil.which("bash") is None or shutil.which("sha256sum") is None:
        pytest.skip("needs bash and sha256sum")
    images = tmp_path / "examples/digits/data/images"
    images.mkdir(parents=True)
    for name in ("00000.png", "00001.png", "09000.png"):  # 09000: a held-out image, not a fit input
        (images / name).write_bytes(name.encode())
    (tmp_path / FIT_CODE).parent.mkdir(parents=True)
    (tmp_path / FIT_CODE).write_text("# fit v1\n")
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    return tmp_path


def _fit(repo: Path, **env: str) -> tuple[str, int]:
    """Run the script; returns its output and how many MoVQGAN fits it ran so far in ``repo`` (and
    checks that every run fitted the text tokenizer once, with the digits config)."""
    calls = repo / "calls.txt"
    full = {k: v for k, v in os.environ.items() if k not in ("MOVQ_STEPS", "FORCE_MOVQ_FIT")}
    full.update(PY=str(repo / "fake-python"), CALLS=str(calls), **env)
    before = len(calls.read_text().splitlines()) if calls.exists() else 0
    r = subprocess.run(["bash", str(SCRIPT)], cwd=repo, env=full, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = calls.read_text().splitlines()
    text_fits = [c for c in lines[before:] if "fit-tokenizer" in c]
    assert text_fits == ["-m omnicore fit-tokenizer examples/digits/config.yaml --vocab-size 400 --out examples/digits/data/tokenizer"]
    return r.stdout.strip(), sum("omnicore_image_movqgan.fit" in c for c in lines)


def test_refits_exactly_when_an_input_changed(repo):
    movq = "examples/digits/data/movq"
    assert _fit(repo) == ("fitting the tokenizer (none yet)", 1)
    stamp = (repo / movq / "fit.stamp").read_text().splitlines()
    assert stamp[0] == "command: python -m omnicore_image_movqgan.fit --images examples/digits/data/images/0[0-8]*.png " + (
        f"--out {movq} --steps 150"
    )
    assert stamp[1].startswith("images: 2 files, sha256 ")
    kept = f"kept the fitted tokenizer in {movq}: same command, images and fit code as when it was fit ({movq}/fit.stamp)"
    assert _fit(repo) == (kept, 1)
    (repo / "examples/digits/data/images/09000.png").write_bytes(b"other held-out bytes")  # not an input
    assert _fit(repo) == (kept, 1)
    assert _fit(repo, MOVQ_STEPS="300") == (f"fitting the tokenizer again: its inputs changed (command; see {movq}/fit.stamp)", 2)
    assert _fit(repo, MOVQ_STEPS="300") == (kept, 2)
    (repo / "examples/digits/data/images/00001.png").write_bytes(b"a new digit")
    (repo / FIT_CODE).write_text("# fit v2\n")
    assert _fit(repo, MOVQ_STEPS="300") == (f"fitting the tokenizer again: its inputs changed (images, fit code; see {movq}/fit.stamp)", 3)
    (repo / movq / "fit.stamp").unlink()  # a tokenizer from before the stamp
    assert _fit(repo, MOVQ_STEPS="300") == (
        f"fitting the tokenizer again: {movq} holds no record of what it was fit from (or no config.json)",
        4,
    )
    assert _fit(repo, MOVQ_STEPS="300", FORCE_MOVQ_FIT="1") == ("fitting the tokenizer again (FORCE_MOVQ_FIT=1)", 5)
