"""Components whose ``requires`` are unmet are ``unavailable`` (decided torch-free), and choosing one
in config fails before training with the reason (the GPU-only kernel plugins on this CPU machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import tiny_config_dict

from omnicore.api import ComponentSpec, hookimpl
from omnicore.registry import Registry, RegistryError, cuda_present, missing_requirements
from omnicore.testing import write_fake_distribution

NO_CUDA = not cuda_present()
FA_REASON = "needs CUDA (no NVIDIA driver found) and the flash_attn package (pip install flash-attn on a CUDA machine)"
LIGER_REASON = "needs CUDA (no NVIDIA driver found) and the liger_kernel package (pip install liger-kernel on a CUDA machine)"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OMNICORE_")}


# ---- the requirement check --------------------------------------------------------------------


def test_module_requirement_present_and_absent(tmp_path, monkeypatch):
    write_fake_distribution(
        tmp_path, "omnicore-fake-req", "0.1", {}, {"omnicore_fake_req_mod": "RAISED = 1\nraise RuntimeError('imported!')\n"}
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert missing_requirements(["omnicore_fake_req_mod"]) == ""  # found, and never imported (it raises)
    assert "omnicore_fake_req_mod" not in sys.modules
    assert (
        missing_requirements(["omnicore_fake_absent_mod"])
        == "needs the omnicore_fake_absent_mod package (pip install omnicore-fake-absent-mod)"
    )
    assert missing_requirements(["omnicore_fake_absent_mod.sub"]).startswith("needs the omnicore_fake_absent_mod.sub package")
    assert missing_requirements(["a_b"], {"a_b": "see the docs"}) == "needs the a_b package (see the docs)"


def test_cuda_requirement_heuristic(monkeypatch):
    from omnicore.registry import resolve  # missing_requirements looks cuda_present up there

    monkeypatch.setattr(resolve, "cuda_present", lambda: False)
    assert missing_requirements(["cuda", "omnicore_fake_absent_mod"]) == (
        "needs CUDA (no NVIDIA driver found) and the omnicore_fake_absent_mod package (pip install omnicore-fake-absent-mod on a CUDA machine)"
    )
    assert missing_requirements(["cuda", "json"]) == "needs CUDA (no NVIDIA driver found)"
    monkeypatch.setattr(resolve, "cuda_present", lambda: True)
    assert missing_requirements(["cuda", "json"]) == ""


def test_unavailable_status_and_resolve_error(monkeypatch):
    class Plugin:
        @hookimpl
        def omnicore_kernels(self):
            return [
                ComponentSpec(name="needs_absent", target="a:b", requires=("omnicore_fake_absent_mod",)),
                ComponentSpec(name="needs_json", target="json:dumps", requires=("json",)),
            ]

    reg = Registry.from_plugins([(Plugin(), "omnicore-fake-kernels")])
    rows = {r.name: r for r in reg.rows}
    assert (rows["needs_absent"].status, rows["needs_absent"].reason) == (
        "unavailable",
        "needs the omnicore_fake_absent_mod package (pip install omnicore-fake-absent-mod)",
    )
    assert (rows["needs_json"].status, rows["needs_json"].reason) == ("available", "")
    with pytest.raises(RegistryError) as ei:
        reg.build("kernel", "needs_absent")
    assert str(ei.value) == (
        "kernel/needs_absent from omnicore-fake-kernels is unavailable: "
        "needs the omnicore_fake_absent_mod package (pip install omnicore-fake-absent-mod)"
    )
    assert reg.resolve("kernel", "needs_json").name == "needs_json"


# ---- the installed GPU-only kernel plugins ------------------------------------------------------


@pytest.mark.cli
def test_plugins_json_lists_gpu_kernels_with_reasons(tmp_path):
    code = "import sys, omnicore.cli; sys.argv = ['omnicore', 'plugins', '--kind', 'kernel', '--json']; rc = omnicore.cli.main(); print('TORCH', 'torch' in sys.modules, file=sys.stderr); sys.exit(rc)"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "TORCH False" in r.stderr  # availability is decided without importing torch
    rows = {d["name"]: d for d in json.loads(r.stdout)}
    expected = {
        "flash_attn": ("omnicore-kernels-flash-attn", "omnicore_kernels_flash_attn.kernel:FlashAttnVarlen", FA_REASON),
        "liger_rmsnorm": ("omnicore-kernels-liger", "omnicore_kernels_liger.kernels:LigerRMSNorm", LIGER_REASON),
        "liger_swiglu": ("omnicore-kernels-liger", "omnicore_kernels_liger.kernels:LigerSwiGLU", LIGER_REASON),
        "liger_fused_linear_cross_entropy": (
            "omnicore-kernels-liger",
            "omnicore_kernels_liger.kernels:LigerFusedLinearCrossEntropy",
            LIGER_REASON,
        ),
    }
    for name, (provider, target, reason) in expected.items():
        d = rows[name]
        assert (d["kind"], d["provider"], d["target"]) == ("kernel", provider, target)
        if NO_CUDA:
            assert (d["status"], d["reason"]) == ("unavailable", reason)
    assert rows["sdpa"]["status"] == "available"


@pytest.mark.cli
@pytest.mark.skipif(not NO_CUDA, reason="on a CUDA machine the kernel may be available")
def test_train_with_unavailable_attention_exits_2_before_training(digits_jsonl, tmp_path):
    cfg = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(tmp_path / "run"), max_steps=2)
    cfg["model"]["kernels"] = {"attention": "flash_attn"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = subprocess.run(
        [sys.executable, "-m", "omnicore", "train", "config.yaml"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: model.kernels.attention: kernel/flash_attn from omnicore-kernels-flash-attn is unavailable: {FA_REASON}"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
