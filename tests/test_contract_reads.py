"""The real contracts: what the core reads from a component is what ``omnicore.components``
declares, and PLUGINS.md documents (``tests/test_docs.py`` checks the page against the protocols;
this test checks the protocols against the core).

Every strategy, kernel and foundation the registry builds is wrapped in a recorder that notes each
attribute the core reads; one plan, one training run with every kind of optional strategy member
(phase, validate, plan, data_split through a sequence-parallel strategy) and
a cross_entropy kernel, and one export must read nothing outside the contract, and must read
the members the contract says they read.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from omnicore.components import CONTRACTS, contract_members

RECORDED = ("parallel", "kernel", "foundation")


class Recorder:
    """Delegates every attribute to ``obj`` and records its name in ``seen``."""

    def __init__(self, obj: Any, seen: set[str]):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name: str) -> Any:
        self._seen.add(name)
        return getattr(self._obj, name)


class SplitEverything:
    """A sequence-parallel strategy that implements every optional member (and the data split)."""

    mesh_dims: tuple[str, ...] = ()
    phase = "attention"

    def __init__(self, options: dict | None = None):
        self.calls: list[str] = []

    def apply(self, model, state):
        assert hasattr(state, "mesh") and hasattr(state, "world_size"), "apply is given the parallel state"
        self.calls.append("apply")
        return model

    def validate(self, model_or_config, state):
        return []

    def plan(self, model, state, prior):
        from omnicore.components import StrategyPlan

        return StrategyPlan([], {}, "nothing")

    def data_split(self, state):
        return state.dp_rank, state.dp_size


@pytest.fixture()
def recording(monkeypatch):
    from omnicore.registry import Registry

    seen: dict[str, set[str]] = {k: set() for k in RECORDED}
    build = Registry.build

    def recording_build(self, kind, name, options=None, **kwargs):
        obj = SplitEverything(options) if (kind, name) == ("parallel", "split_everything") else build(self, kind, name, options, **kwargs)
        return Recorder(obj, seen[kind]) if kind in seen else obj

    def resolve(self, kind, name, _orig=Registry.resolve):
        if (kind, name) == ("parallel", "split_everything"):
            return _orig(self, "parallel", "none")
        return _orig(self, kind, name)

    monkeypatch.setattr(Registry, "build", recording_build)
    monkeypatch.setattr(Registry, "resolve", resolve)
    return seen


def test_contract_lists_are_the_protocols():
    assert set(CONTRACTS) == {"encoder", "decoder", "processor", "foundation", "parallel", "kernel", "logger"}
    assert contract_members("logger") == {"start", "log_metrics", "log_images", "close"}
    assert contract_members("processor") == {"modality", "preprocess", "num_tokens", "collate"}
    assert contract_members("encoder") == {"modality", "processor", "forward", "dummy_batch", "save_pretrained"}
    assert contract_members("decoder") == {
        "modality",
        "codebook_size",
        "processor",
        "encode",
        "embed",
        "head",
        "decode",
        "dummy_codes",
        "save_pretrained",
    }
    assert contract_members("parallel") == {"mesh_dims", "apply", "phase", "validate", "plan", "plan_encoder_costs", "data_split"}
    assert contract_members("kernel") == {"op", "available", "activate", "linear_cross_entropy_sum"}


@pytest.mark.slow
def test_the_core_reads_only_contract_members(recording, digits_jsonl, tmp_path):
    from conftest import tiny_config_dict

    from omnicore.config import Config
    from omnicore.parallel.plan import make_plan
    from omnicore.train.loop import train

    d = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(tmp_path / "run"), max_steps=1, export=True)
    d["model"]["kernels"] = {"attention": "sdpa_varlen", "cross_entropy": "chunked_cross_entropy", "rmsnorm": "torch_rms_norm"}
    d["parallel"] = {"strategies": ["split_everything", {"name": "activation_checkpointing", "options": {"mode": "full"}}, "none"]}
    cfg = Config.model_validate(copy.deepcopy(d))
    cfg.source = str(tmp_path / "config.yaml")
    report = make_plan(cfg, 1)
    assert report.ok, report.violations
    history = train(cfg)
    assert history[-1]["step"] == 1 and (tmp_path / "run" / "export" / "foundation" / "config.json").is_file()
    for kind in RECORDED:
        extra = recording[kind] - contract_members(kind)
        assert not extra, f"the core reads {sorted(extra)} from {kind} components, outside omnicore.components' contract"
    # and it reads what the contract says it reads
    assert {"mesh_dims", "phase", "apply", "validate", "plan", "data_split"} <= recording["parallel"]
    assert {"op", "available", "activate", "linear_cross_entropy_sum"} <= recording["kernel"]
    assert {"build_tokenizer", "build_model"} <= recording["foundation"]
