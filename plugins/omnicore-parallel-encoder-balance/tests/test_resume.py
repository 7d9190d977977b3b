"""``encoder_balance`` in the real training loop (``omnicore.testing.train``) on 2 gloo processes:
the digits example's questions about images and spoken digits (built from the shipped files), the
tiny model's SigLIP and Whisper encoders.

In one 2-process run: 4 steps with ``[fsdp2]``; 4 steps with ``[encoder_balance, fsdp2]``; and the
balanced run again, stopped after 2 steps (``train.stop_after``) and resumed for 2 more. The
balanced losses equal the plain ones (relative 1e-5), the resumed run's equal the straight
balanced run's (relative 1e-6: resume is exact), and items were moved in the balanced runs. The
images are augmented while training (SigLIP's ``augment``): the draws follow each item's seed
(``omnicore.api.ITEM_SEEDS``), which moves with the item, so a moved image is shifted and turned
as it would have been on its own rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import balance_cases as cases  # noqa: E402

from omnicore.testing.distributed import max_rel_diff, run_distributed  # noqa: E402

pytestmark = pytest.mark.multiprocess

BUILD_DATA = HERE.parents[2] / "examples" / "digits" / "build_data.py"
STEPS = 4


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """Questions only (no drawing targets, so no decoder): 24 images, 16 spoken digits."""
    out = tmp_path_factory.mktemp("digits")
    args = ["--train-images", "24", "--train-audio", "16", "--gen", "0", "--eval-images", "2", "--eval-audio", "2", "--seed", "0"]
    subprocess.run([sys.executable, str(BUILD_DATA), "--out", str(out), *args], check=True, capture_output=True)
    return out


def _cfg(data: Path, out: Path, strategies: list, **train) -> dict:
    t = {"max_steps": STEPS, "lr": 3e-3, "warmup_steps": 1, "progress": False, "export": False, "save_every": 2, **train}
    model = cases.model_dict()
    # random shifts and turns while training, drawn per item from its seed: the same on whichever rank encodes it
    model["encoders"]["image"]["options"]["augment"] = {"shift": 0.1, "rotate": 15.0}
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": model,
        "data": {"train": str(data / "train.jsonl"), "max_tokens": 256, "shuffle": True},
        "train": t,
        "samples": {"every": 0},
        "parallel": {"strategies": strategies, "backend": "gloo"},
    }


def runs(data: str, root: str) -> dict:
    """The three runs on this rank; counts the balanced runs' exchanges."""
    from omnicore.testing import Config, train
    from omnicore_parallel_encoder_balance import exchange

    moved = []
    original = exchange.BalanceHook._exchange

    def counted(self, call, items, metas, plan):
        moved.append(plan.moved)
        return original(self, call, items, metas, plan)

    exchange.BalanceHook._exchange = counted

    def losses(name: str, strategies: list, resume: bool = False, **kw) -> list[float]:
        cfg = Config.model_validate(_cfg(Path(data), Path(root) / name, strategies, **kw))
        cfg.source = str(Path(root) / f"{name}.yaml")
        train(cfg, resume=resume)
        rows = (Path(root) / name / "metrics.jsonl").read_text().splitlines()
        return [json.loads(r)["loss"] for r in rows if json.loads(r).get("split", "train") == "train" and "loss" in json.loads(r)]

    balance = [{"name": "encoder_balance", "options": {"min_spread": 1.0}}, "fsdp2"]
    out = {"plain": losses("plain", ["fsdp2"])}
    out["balanced"] = losses("balanced", balance)
    out["moved"] = sum(moved)
    losses("resumed", balance, stop_after=STEPS // 2)
    out["resumed"] = losses("resumed", balance, resume=True, stop_after=None)
    return out


def test_balanced_training_equals_plain_and_resumes_exactly(digits, tmp_path):
    ranks = run_distributed(runs, 2, args=(str(digits), str(tmp_path)), timeout=900)
    got = ranks[0]
    print({k: got[k] for k in ("plain", "balanced", "resumed", "moved")})
    assert len(got["plain"]) == len(got["balanced"]) == len(got["resumed"]) == STEPS
    assert got["moved"] > 0  # the balanced runs did move items
    assert max_rel_diff(got["balanced"], got["plain"]) <= 1e-5
    assert max_rel_diff(got["resumed"], got["balanced"]) <= 1e-6
