"""Each published family (stand-ins of Qwen2-Audio, Qwen2-VL, Qwen3-VL with its DeepStack rows,
and LLaVA: towers, projector or merger and language model from one checkpoint; CSM: backbone and
speech decoder) trains on 2 FSDP2 processes to the losses of one
process with the same samples per step (``grad_accum: 2`` there, 1 per rank here), on samples
that hold their media."""

from __future__ import annotations

import importlib
import json
import wave

import numpy as np
import pytest
from PIL import Image

from omnicore.testing.distributed import max_rel_diff, run_distributed

MODULES = {
    "qwen2_audio": "omnicore_family_qwen2_audio",
    "qwen2_vl": "omnicore_family_qwen2_vl",
    "qwen3_vl": "omnicore_family_qwen3_vl",
    "llava": "omnicore_family_llava",
}
MEDIA = {"qwen2_audio": "audio", "qwen2_vl": "image", "qwen3_vl": "image", "llava": "image"}


def _write_media(folder, family, i):
    rng = np.random.default_rng(i)
    if MEDIA[family] == "audio":
        samples = (0.2 * rng.standard_normal(4000 + 800 * i)).clip(-1, 1)
        with wave.open(str(folder / f"m{i}.wav"), "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
            w.writeframes((samples * 32767).astype("<i2").tobytes())
        return [{"type": "text", "text": "Audio 1: "}, {"type": "audio", "path": f"m{i}.wav"}, {"type": "text", "text": "\nWhat?"}]
    Image.fromarray(rng.integers(0, 256, (48 + 8 * (i % 3), 56, 3), dtype=np.uint8)).save(folder / f"m{i}.png")
    return [{"type": "image", "path": f"m{i}.png"}, {"type": "text", "text": "What?"}]


def losses(family, folder, data, out, grad_accum, parallel=None):  # module level: each spawned rank imports it by name
    from omnicore.testing import Config, train

    cfg = Config.model_validate(
        {
            "run": {"output_dir": out, "seed": 0},
            "model": {"foundation": {"name": family, "options": {"checkpoint": folder}}},
            "data": {"train": data, "max_tokens": 256},
            "train": {"max_steps": 3, "grad_accum": grad_accum, "progress": False, "export": False, "lr": 1e-2, "warmup_steps": 0},
            "parallel": parallel or {"strategies": ["fsdp2"], "backend": "gloo"},
        }
    )
    return [row["loss"] for row in train(cfg)]


def _data(tmp_path, family):
    rows = []
    for i in range(12):
        user = _write_media(tmp_path, family, i)
        rows.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": f"answer {i % 4}"}]})
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


@pytest.mark.multiprocess
@pytest.mark.parametrize("family", sorted(MODULES))
def test_two_fsdp2_processes_equal_one(tmp_path, family):
    folder = importlib.import_module(f"{MODULES[family]}.standin").save_standin(tmp_path / "standin")
    data = _data(tmp_path, family)
    one = losses(family, str(folder), str(data), str(tmp_path / "one"), 2)
    two = run_distributed(losses, 2, args=(family, str(folder), str(data), str(tmp_path / "two"), 1), timeout=600)
    assert two[0] == two[1]
    assert max_rel_diff(two[0], one) <= 1e-5, (one, two[0])
    assert one[-1] < one[0]  # it trains: the loss falls over the 3 steps


@pytest.mark.multiprocess
def test_qwen3_vl_with_ulysses_sp2_equals_one_process(tmp_path):
    """Qwen3-VL's DeepStack rows under sequence parallelism: Ulysses (SP 2, FSDP2 over the same two
    ranks) cuts the visual mask and its rows with the packed row, so the two ranks, which read the
    same samples, train to one process's losses."""
    from omnicore_family_qwen3_vl.standin import save_standin

    folder = save_standin(tmp_path / "standin")
    data = _data(tmp_path, "qwen3_vl")
    one = losses("qwen3_vl", str(folder), str(data), str(tmp_path / "one"), 1)
    parallel = {"strategies": ["ulysses", "fsdp2"], "sp": 2, "backend": "gloo"}
    two = run_distributed(losses, 2, args=("qwen3_vl", str(folder), str(data), str(tmp_path / "two"), 1, parallel), timeout=600)
    assert two[0] == two[1]
    assert max_rel_diff(two[0], one) <= 1e-5, (one, two[0])


def csm_losses(folder, data, out, grad_accum):  # module level: each spawned rank imports it by name
    from omnicore.testing import Config, train

    decoder = {"name": "csm_audio", "options": {"checkpoint": folder, "max_seconds": 0.5}}
    cfg = Config.model_validate(
        {
            "run": {"output_dir": out, "seed": 0},
            "model": {"foundation": {"name": "csm", "options": {"checkpoint": folder}}, "decoders": {"audio": decoder}},
            "data": {"train": data, "max_tokens": 256},
            "train": {"max_steps": 3, "grad_accum": grad_accum, "progress": False, "export": False, "lr": 1e-2, "warmup_steps": 0},
            "parallel": {"strategies": ["fsdp2"], "backend": "gloo"},
        }
    )
    return [row["loss"] for row in train(cfg)]


@pytest.mark.multiprocess
def test_csm_two_fsdp2_processes_equal_one(tmp_path):
    """CSM's speech targets (foundation csm with decoder csm_audio: K = 4 codebooks a frame, the
    audio embedding tied to the depth decoder's, sharded with the root) train on 2 FSDP2 processes
    to one process's losses."""
    from omnicore_family_csm.standin import save_standin

    folder = save_standin(tmp_path / "standin")
    rows = []
    for i in range(12):
        samples = (0.1 * np.random.default_rng(i).standard_normal(2400 + 1200 * (i % 4))).clip(-1, 1)
        with wave.open(str(tmp_path / f"s{i}.wav"), "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000)
            w.writeframes((samples * 32767).astype("<i2").tobytes())
        user = {"role": "user", "content": [{"type": "text", "text": f"[{i % 2}]say {i % 4}"}]}
        rows.append({"messages": [user, {"role": "assistant", "content": [{"type": "audio", "path": f"s{i}.wav"}]}]})
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    one = csm_losses(str(folder), str(data), str(tmp_path / "one"), 2)
    two = run_distributed(csm_losses, 2, args=(str(folder), str(data), str(tmp_path / "two"), 1), timeout=600)
    assert two[0] == two[1]
    assert max_rel_diff(two[0], one) <= 1e-5, (one, two[0])
    assert one[-1] < one[0]
