"""bench/gpu_check.py's CPU smoke: the GPU check script keeps working where CI runs (no GPU figures)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_cpu_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "gpu_check.json"
    assert mod.main(["--cpu-smoke", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert "sdpa" in res["backends"] and res["equality"]["reference"] == res["backends"][-1]
    for name, d in res["equality"]["vs_reference"].items():
        assert d["max_abs"] < 1e-5, name  # every CPU backend gives the reference's logits on a packed row
    assert res["equality"]["packed_vs_alone"]["max_abs"] < 1e-5
    runs = {t["attention"]: t for t in res["throughput"]}
    assert "sdpa" in runs and runs["sdpa"]["steps"] == 3
    assert runs["sdpa"]["median_tflops"] > 0 and runs["sdpa"]["median_mfu"] is None  # no known CPU peak
    omni = res["omni"]  # the MFU of every part (issue #26): a SigLIP tower before the foundation
    assert set(omni["median_flops_share"]) == {"foundation", "encoder.image"} and omni["median_mfu"] is None
    assert sum(omni["median_flops_share"].values()) == pytest.approx(1.0) and omni["median_flops_share"]["encoder.image"] > 0
    assert omni["median_flops_spread"] == 1.0
