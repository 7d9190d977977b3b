"""examples/digits/fit_tokenizer.sh fits the text BPE on every run and keeps the fitted MoVQGAN
tokenizer only while its inputs (the fit command with MOVQ_STEPS, the training images, the fit code)
are those it was fit from, and says why it fits again; with the five-task config it keeps the shipped
EnCodec codec by the same rule, except that a change of the fit code alone keeps it (and says so). The fits themselves are replaced by a fake interpreter that records
its calls; the folders come from the real digits configs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "digits" / "fit_tokenizer.sh"
FIT_CODE = "plugins/omnicore-image-movqgan/omnicore_image_movqgan/fit.py"
CODEC_CODE = "plugins/omnicore-audio-codec/omnicore_audio_codec/losses.py"
MEL_CODE = "plugins/omnicore-audio-mel/omnicore_audio_mel/fit.py"

FAKE_PY = """#!/usr/bin/env bash
# stands in for `python -m omnicore_image_movqgan.fit ... --out DIR ...`: records the call, writes DIR/config.json
echo "$*" >> "$CALLS"
if [ -n "${FAIL_FIT:-}" ] && [[ "$*" == *"$FAIL_FIT"* ]]; then mkdir -p examples/digits/movq && echo partial > examples/digits/movq/config.json; exit 3; fi
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
    (tmp_path / CODEC_CODE).parent.mkdir(parents=True)
    for name in ("fit", "losses", "processor"):
        (tmp_path / CODEC_CODE).with_name(f"{name}.py").write_text(f"# {name} v1\n")
    (tmp_path / MEL_CODE).parent.mkdir(parents=True)
    for name in ("fit", "tokenizer", "config"):
        (tmp_path / MEL_CODE).with_name(f"{name}.py").write_text(f"# {name} v1\n")
    recordings = tmp_path / "examples/digits/raw/fsdd/recordings"
    recordings.mkdir(parents=True)
    for name in ("3_jackson_0", "3_jackson_5", "3_jackson_17", "3_theo_24", "3_theo_25"):  # fit inputs: takes 5-24
        (recordings / f"{name}.wav").write_bytes(name.encode())
    for name in ("config.yaml", "five.yaml"):
        shutil.copy(SCRIPT.with_name(name), tmp_path / "examples/digits" / name)
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    return tmp_path


def _run(repo: Path, **env: str) -> tuple[str, list[str]]:
    """Run the script; returns its output (each line stripped) and the calls it made."""
    calls = repo / "calls.txt"
    unset = ("MOVQ_STEPS", "FORCE_MOVQ_FIT", "CODEC_STEPS", "FORCE_CODEC_FIT", "MEL_CONFIG", "FORCE_MEL_FIT", "CONFIG")
    full = {k: v for k, v in os.environ.items() if k not in unset}
    full.update(PY=str(repo / "fake-python"), CALLS=str(calls), **env)
    before = len(calls.read_text().splitlines()) if calls.exists() else 0
    r = subprocess.run(["bash", str(SCRIPT)], cwd=repo, env=full, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return "\n".join(line.strip() for line in r.stdout.splitlines()), calls.read_text().splitlines()[before:]


def _fit(repo: Path, **env: str) -> tuple[str, int]:
    """Run the script; returns its output and how many MoVQGAN fits it ran so far in ``repo`` (and
    checks that every run fitted the text tokenizer once, with the digits config)."""
    out, new = _run(repo, **env)
    assert [c for c in new if "fit-tokenizer" in c] == [
        "-m omnicore fit-tokenizer examples/digits/config.yaml --vocab-size 400 --out examples/digits/data/tokenizer"
    ]
    return out, sum("omnicore_image_movqgan.fit" in c for c in (repo / "calls.txt").read_text().splitlines())


def test_refits_exactly_when_an_input_changed(repo):
    movq = "examples/digits/movq"
    assert _fit(repo) == ("fitting the tokenizer (none yet)", 1)
    stamp = (repo / movq / "fit.stamp").read_text().splitlines()
    assert stamp[0] == "command: python -m omnicore_image_movqgan.fit --images examples/digits/data/images/0[0-8]*.png " + (
        f"--out {movq} --steps 100"
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


CODEC_YAML = """model:
  foundation:
    name: qwen2
    options:
      tokenizer: data5/tokenizer
  decoders:
    image:
      name: movqgan
      options:
        checkpoint: movq
    audio:
      name: encodec
      options:
        checkpoint: codec
"""


def test_five_task_config_fits_its_text_and_speech_tokenizers(repo):
    """CONFIG=five.yaml as shipped: the text BPE goes to data5/tokenizer, the MoVQGAN is config.yaml's
    (one fit for both), and its speech decoder's MelRVQ goes to examples/digits/mel."""
    out, calls = _run(repo, CONFIG="examples/digits/five.yaml")
    assert calls[0] == "-m omnicore fit-tokenizer examples/digits/five.yaml --vocab-size 400 --out examples/digits/data5/tokenizer"
    assert out.splitlines() == ["fitting the tokenizer (none yet)", "fitting the speech tokenizer (none yet)"]
    assert calls[-1].startswith("-m omnicore_audio_mel.fit ") and " --out examples/digits/mel " in calls[-1]


def test_an_encodec_config_keeps_the_codec_by_its_stamp(repo):
    """A config with an `encodec` decoder (five.yaml's speech before the mel RVQ): the EnCodec codec in
    examples/digits/codec is fit on takes 5-24 and kept while the command and recordings of its stamp
    hold; a change of the fit code alone keeps it too."""
    codec, movq = "examples/digits/codec", "examples/digits/movq"
    (repo / "examples/digits/codec.yaml").write_text(CODEC_YAML)
    five = {"CONFIG": "examples/digits/codec.yaml"}
    out, calls = _run(repo, **five)
    assert calls[0] == "-m omnicore fit-tokenizer examples/digits/codec.yaml --vocab-size 400 --out examples/digits/data5/tokenizer"
    assert out.splitlines() == ["fitting the tokenizer (none yet)", "fitting the codec (none yet)"]
    r = "examples/digits/raw/fsdd/recordings"
    assert calls[2] == (
        f"-m omnicore_audio_codec.fit --audio {r}/*_[5-9].wav {r}/*_1[0-9].wav {r}/*_2[0-4].wav --held-out {r}/*_[0-4].wav --out {codec} "
        '--steps 3000 --ae-steps 1500 --config {"sampling_rate": 8000, "upsampling_ratios": [5, 4, 4, 2]}'
    )
    stamp = (repo / codec / "fit.stamp").read_text().splitlines()
    assert stamp[0] == "command: python " + calls[2] and stamp[1].startswith("recordings: 3 files, sha256 ")
    kept = f"kept the fitted codec in {codec}: same command, recordings and fit code as when it was fit ({codec}/fit.stamp)"
    assert _run(repo)[0] == _kept(movq)  # config.yaml shares the MoVQGAN
    (repo / r / "3_jackson_0.wav").write_bytes(b"another held-out take")  # reported on, not fit on
    assert _run(repo, **five) == (_kept(movq) + "\n" + kept, calls[:1])
    (repo / CODEC_CODE).write_text("# losses v2\n")
    shipped = f"kept the shipped codec in {codec}: same command and recordings as when it was fit, though the fit code changed since (FORCE_CODEC_FIT=1 fits it again)"
    assert _run(repo, **five) == (_kept(movq) + "\n" + shipped, calls[:1])
    out, calls = _run(repo, CODEC_STEPS="20", **five)
    assert out.splitlines()[1] == f"fitting the codec again: its inputs changed (command, fit code; see {codec}/fit.stamp)"
    assert "--steps 20 --ae-steps 1500" in calls[-1]
    (repo / r / "3_theo_24.wav").write_bytes(b"a new take")
    assert (
        _run(repo, CODEC_STEPS="20", **five)[0].splitlines()[1]
        == f"fitting the codec again: its inputs changed (recordings; see {codec}/fit.stamp)"
    )
    assert _run(repo, CODEC_STEPS="20", FORCE_CODEC_FIT="1", **five)[0].splitlines()[1] == "fitting the codec again (FORCE_CODEC_FIT=1)"


MEL_YAML = """model:
  foundation:
    name: qwen2
    options:
      tokenizer: data/tokenizer
  decoders:
    image:
      name: movqgan
      options:
        checkpoint: movq
    audio:
      name: mel_rvq
      options:
        checkpoint: mel
"""


def test_a_mel_rvq_decoder_is_fit_into_its_checkpoint_and_kept(repo):
    """A config whose audio decoder is `mel_rvq` gets a MelRVQ fit on takes 5-24 in its checkpoint folder,
    kept while the command (MEL_CONFIG), the recordings and the fit code are those of its stamp."""
    (repo / "examples/digits/mel.yaml").write_text(MEL_YAML)
    env = {"CONFIG": "examples/digits/mel.yaml"}
    out, calls = _run(repo, **env)
    assert out.splitlines() == ["fitting the tokenizer (none yet)", "fitting the speech tokenizer (none yet)"]
    r, mel = "examples/digits/raw/fsdd/recordings", "examples/digits/mel"
    assert calls[-1] == (
        f"-m omnicore_audio_mel.fit --audio {r}/*_[5-9].wav {r}/*_1[0-9].wav {r}/*_2[0-4].wav --held-out {r}/*_[0-4].wav --out {mel} "
        '--config {"sample_rate": 8000, "n_mels": 40, "stack": 8, "num_codebooks": 8, "codebook_size": 256}'
    )
    stamp = (repo / mel / "fit.stamp").read_text().splitlines()
    assert stamp[0] == "command: python " + calls[-1] and stamp[1].startswith("recordings: 3 files, sha256 ")
    kept = f"kept the fitted speech tokenizer in {mel}: same command, recordings and fit code as when it was fit ({mel}/fit.stamp)"
    assert _run(repo, **env) == (_kept("examples/digits/movq") + "\n" + kept, calls[:1])
    (repo / MEL_CODE).with_name("tokenizer.py").write_text("# tokenizer v2\n")
    out, calls = _run(repo, **env)
    assert out.splitlines()[1] == f"fitting the speech tokenizer again: its inputs changed (fit code; see {mel}/fit.stamp)"
    out, calls = _run(repo, MEL_CONFIG='{"stack": 4}', **env)
    assert out.splitlines()[1] == f"fitting the speech tokenizer again: its inputs changed (command; see {mel}/fit.stamp)"
    assert calls[-1].endswith('--config {"stack": 4}')
    (repo / "examples/digits/bad.yaml").write_text(MEL_YAML.replace("checkpoint: mel", "max_seconds: 1.0"))
    bad = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=repo,
        env={**os.environ, "CONFIG": "examples/digits/bad.yaml", "PY": "false"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "has a mel_rvq decoder without a checkpoint: folder to fit into" in bad.stderr


def _kept(movq: str) -> str:
    return f"kept the fitted tokenizer in {movq}: same command, images and fit code as when it was fit ({movq}/fit.stamp)"


def test_a_failed_or_interrupted_refit_leaves_the_previous_fit(repo):
    """The folder being replaced (the shipped MoVQGAN is tracked by git) is set aside until the new
    fit is done: a fit that fails puts it back, and after one that was killed the next run puts it
    back before deciding."""
    movq = repo / "examples/digits/movq"
    _fit(repo)
    before = {f.name: f.read_bytes() for f in movq.iterdir()}
    env = {k: v for k, v in os.environ.items() if k not in ("MOVQ_STEPS", "FORCE_MOVQ_FIT", "CONFIG")}
    env.update(PY=str(repo / "fake-python"), CALLS=str(repo / "calls.txt"), FAIL_FIT="omnicore_image_movqgan.fit", FORCE_MOVQ_FIT="1")
    r = subprocess.run(["bash", str(SCRIPT)], cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "failed; examples/digits/movq is as it was" in r.stderr
    assert {f.name: f.read_bytes() for f in movq.iterdir()} == before and not movq.with_name("movq.previous").exists()
    movq.rename(movq.with_name("movq.previous"))  # as a fit killed after setting the folder aside leaves it
    out, _ = _fit(repo)
    assert out.splitlines()[0] == "put back examples/digits/movq from examples/digits/movq.previous (a fit of it was interrupted)"
    assert out.splitlines()[1].startswith("kept the fitted tokenizer in examples/digits/movq")
    assert {f.name: f.read_bytes() for f in movq.iterdir()} == before
