"""contrib/omnicore-plugin-template: generate every kind, install, run their tests, list them, train with one.

The generated distributions are installed with ``pip install --no-deps --target`` into a temporary
folder that only the subprocesses see (``PYTHONPATH``); nothing is left in the virtual environment.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, tiny_config_dict

copier = pytest.importorskip("copier", reason="the template test needs copier (scripts/setup.sh installs it)")

TEMPLATE = ROOT / "contrib" / "omnicore-plugin-template"
# (answers, dist name, kind, name): every kind, and the encoder for both modalities
VARIANTS = [
    ({"kind": "encoder", "name": "patchconv"}, "omnicore-encoder-patchconv", "encoder", "patchconv"),
    ({"kind": "encoder", "name": "frames", "modality": "audio"}, "omnicore-encoder-frames", "encoder", "frames"),
    ({"kind": "decoder"}, "omnicore-decoder-tiny-decoder", "decoder", "tiny_decoder"),
    ({"kind": "foundation"}, "omnicore-foundation-tiny-foundation", "foundation", "tiny_foundation"),
    ({"kind": "parallel"}, "omnicore-parallel-tiny-parallel", "parallel", "tiny_parallel"),
    ({"kind": "kernel"}, "omnicore-kernel-tiny-kernel", "kernel", "tiny_kernel"),
    ({"kind": "logger", "name": "csvlog"}, "omnicore-logger-csvlog", "logger", "csvlog"),
]


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Generate all variants, install them into one --target folder; returns (work, env, dirs)."""
    work = tmp_path_factory.mktemp("template")
    dirs = []
    for answers, *_ in VARIANTS:
        dest = work / "src" / f"{answers['kind']}-{answers.get('name', 'default')}"
        copier.run_copy(str(TEMPLATE), str(dest), data=answers, defaults=True, quiet=True)
        dirs.append(dest)
    site = work / "site"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            *map(str, dirs),
        ],
        dict(os.environ),
        work,
    )
    env = dict(os.environ, PYTHONPATH=str(site), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return work, env, dirs


@pytest.mark.cli
def test_generated_files(generated):
    _, _, dirs = generated
    enc = dirs[0]
    pyproject = (enc / "pyproject.toml").read_text()
    assert '[project.entry-points.omnicore]\npatchconv = "omnicore_encoder_patchconv.plugin"' in pyproject
    assert 'keywords = ["omnicore-api >=2.0,<3"]' in pyproject and 'dependencies = ["omnicore>=0.1,<0.2"]' in pyproject
    names = {
        p.relative_to(enc).as_posix() for p in enc.rglob("*") if p.is_file() and "egg-info" not in p.as_posix() and "build" not in p.parts
    }
    assert {
        "README.md",
        "pyproject.toml",
        "omnicore_encoder_patchconv/plugin.py",
        "omnicore_encoder_patchconv/encoder.py",
        "omnicore_encoder_patchconv/processor.py",
        "tests/test_contract.py",
    } <= names
    # encoders and decoders register their data side apart from the module (core API 1.2)
    assert (
        'processor="omnicore_encoder_patchconv.processor:build_processor"' in (enc / "omnicore_encoder_patchconv" / "plugin.py").read_text()
    )
    # one component file per kind: the other kinds' files are not generated
    assert not (enc / "omnicore_encoder_patchconv" / "decoder.py").exists()
    assert (dirs[5] / "omnicore_kernel_tiny_kernel" / "kernel.py").is_file()
    assert (dirs[6] / "omnicore_logger_csvlog" / "logger.py").is_file()
    assert 'keywords = ["omnicore-api >=2.0,<3"]' in (dirs[6] / "pyproject.toml").read_text()  # one range for every kind
    assert "class TestPatchconvContract(EncoderContract):" in (enc / "tests" / "test_contract.py").read_text()


@pytest.mark.cli
def test_generated_plugins_pass_their_own_tests(generated):
    work, env, dirs = generated
    proc = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *[str(d / "tests") for d in dirs]], env, work)
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 40  # every kind's suite ran, not just collected


@pytest.mark.cli
def test_generated_image_options_check_that_patches_tile_the_image(generated):
    """Image encoders and decoders from the template refuse a patch size that does not divide the
    image size when the config is read, naming both fields and a size that fits."""
    work, env, _ = generated
    code = (
        "import pydantic\n"
        "for mod in ('omnicore_encoder_patchconv', 'omnicore_decoder_tiny_decoder'):\n"
        "    Options = __import__(mod + '.processor', fromlist=['Options']).Options\n"
        "    assert Options(image_size=16, patch_size=4).patch_size == 4\n"
        "    try:\n"
        "        Options(image_size=18, patch_size=4)\n"
        "    except pydantic.ValidationError as e:\n"
        "        print(mod, e.errors()[0]['msg'])\n"
    )
    out = _run([sys.executable, "-c", code], env, work).stdout.splitlines()
    want = "Value error, image_size 18 must be a multiple of patch_size 4 (e.g. image_size 20)"
    assert out == [f"omnicore_encoder_patchconv {want}", f"omnicore_decoder_tiny_decoder {want}"]


@pytest.mark.cli
def test_generated_plugins_are_listed(generated):
    work, env, _ = generated
    rows = json.loads(_run([sys.executable, "-m", "omnicore", "plugins", "--json"], env, work).stdout)
    found = {(r["kind"], r["name"]): r for r in rows}
    for _, dist, kind, name in VARIANTS:
        row = found[(kind, name)]
        assert row["status"] == "available", row
        assert row["provider"].replace("_", "-") == dist


@pytest.mark.cli
def test_training_run_with_generated_encoder(generated, digits_jsonl):
    """3 steps of the tiny digits model whose image encoder and decoder are generated ones: finite, falling loss."""
    work, env, _ = generated
    cfg = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(work / "run"), max_steps=3)
    cfg["model"]["encoders"]["image"] = {"name": "patchconv", "options": {"width": 16, "image_size": 28, "patch_size": 7}}
    cfg["model"]["decoders"]["image"] = {"name": "tiny_decoder", "options": {"image_size": 16, "patch_size": 4, "codebook_size": 64}}
    (work / "cfg.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    _run([sys.executable, "-m", "omnicore", "train", str(work / "cfg.yaml")], env, work)
    losses = [json.loads(line)["loss"] for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses
    rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("loss/decoder.image", 0) > 0 for r in rows), rows  # the generated decoder's head was trained


MYPY_CONFIG = """[mypy]
mypy_path = {root}
follow_imports = silent
[mypy-torch.*,transformers.*,numpy.*,safetensors.*,PIL.*,pydantic.*,pydantic_core.*,peft.*,accelerate.*,datasets.*,diffusers.*,soundfile.*,soxr.*,einops.*,tqdm.*,matplotlib.*,yaml.*,tokenizers.*,huggingface_hub.*,pytest.*,_pytest.*,pluggy.*]
follow_imports = skip
ignore_missing_imports = true
"""

PROBE = """from omnicore.api import CodebookDecoder, ComponentSpec, Encoder, Registry

reveal_type(ComponentSpec)
reveal_type(Registry.discover)
reveal_type(CodebookDecoder.save_pretrained)
reveal_type(Encoder.dummy_batch)
ComponentSpec(kind="encoder", name="x", target="a:b")
"""


@pytest.mark.cli
@pytest.mark.slow
def test_a_type_checker_sees_the_api_types_in_generated_plugins(generated, tmp_path):
    """mypy on the generated plugins of every kind and on a probe that uses the API: the names of
    omnicore.api have their real types (the TYPE_CHECKING block and py.typed), not Any, and a call
    that API 2.0 does not allow (``ComponentSpec(kind=...)``) is an error."""
    pytest.importorskip("mypy", reason="the type-checker test needs mypy (scripts/setup.sh installs the test extra)")
    work, env, dirs = generated
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG.format(root=ROOT))
    (tmp_path / "probe.py").write_text(PROBE)
    packages = [str(next(p for p in d.iterdir() if (p / "__init__.py").is_file() and p.name.startswith("omnicore_"))) for d in dirs]
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--no-incremental", "--cache-dir", os.devnull]
    clean = subprocess.run([*cmd, *packages], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0 and "Success" in clean.stdout, clean.stdout[-3000:] + clean.stderr[-2000:]
    probe = subprocess.run([*cmd, str(tmp_path / "probe.py")], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = probe.stdout
    assert 'Revealed type is "def (name: builtins.str, target: builtins.str,' in out, out
    assert "-> omnicore.components.ComponentSpec" in out and "-> omnicore.registry.discovery.Registry" in out, out
    assert "omnicore.model.codebook.CodebookDecoder" in out and "omnicore.components.Encoder" in out, out
    assert 'Unexpected keyword argument "kind" for "ComponentSpec"' in out, out
    assert 'Revealed type is "Any"' not in out, out


def test_nothing_left_in_the_venv():
    from importlib import metadata

    installed = {d.metadata["Name"] for d in metadata.distributions()}
    assert not any(d in installed for _, d, _, _ in VARIANTS)
