"""omnicore.testing: the fixtures, the fake-distribution helper, and the contract suites.

The built-in components run their kind's contract suite here; a deliberately broken toy encoder,
installed as a fake distribution, shows that each encoder check catches the bug it is there for.
"""

from __future__ import annotations

import sys
from importlib import metadata

import pytest
import torch
from conftest import TINY_LM

from omnicore.components import ComponentSpec
from omnicore.hookspecs import hookimpl
from omnicore.testing import (
    EncoderContract,
    FoundationContract,
    KernelContract,
    ParallelStrategyContract,
    installed_fake_distribution,
)

# ---- the built-ins, through their contract suites -------------------------------------------


class TestHFCausalLMContract(FoundationContract):
    name = "hf_causal_lm"
    options = {"config": dict(TINY_LM)}


class TestSDPAKernelContract(KernelContract):
    name = "sdpa"


class TestEagerKernelContract(KernelContract):
    name = "eager"


class TestNoParallelContract(ParallelStrategyContract):
    name = "none"


class TestFSDP2Contract(ParallelStrategyContract):
    """fsdp2 needs a process group: only its mesh dims are checked here (tests/test_train.py runs it)."""

    name = "fsdp2"


# ---- fixtures and helpers --------------------------------------------------------------------

HOOK = """
from omnicore.components import ComponentSpec
from omnicore.hookspecs import hookimpl

@hookimpl
def omnicore_encoders():
    return [
        ComponentSpec(
            name="toy", target="toy_encoder:build", processor="toy_encoder:build_processor", modalities=("image",),
            description="a toy",
        )
    ]
"""

TOY = '''
"""A toy image encoder: 8x8 grey pixels, four 4x4 patches, a linear projection. ``bug`` breaks one rule."""
import os
import numpy as np
import torch
from torch import nn
from safetensors.torch import load_file, save_file

class ToyProcessor:
    modality = "image"

    def __init__(self, bug=""):
        self.bug = bug
        if bug == "module_in_processor":
            self.layer = nn.Linear(2, 2)

    def preprocess(self, media):
        img = media.convert("L").resize((8, 8))
        return {"pixels": torch.tensor(np.asarray(img), dtype=torch.float32) / 255.0}

    def num_tokens(self, features):
        return 5 if self.bug == "num_tokens" else 4

    def collate(self, items):
        return {"pixels": torch.stack([it["pixels"] for it in items])}

def build_processor(options):
    return ToyProcessor(options.get("bug", ""))

class Toy(nn.Module):
    modality = "image"

    def __init__(self, hidden_size, bug=""):
        super().__init__()
        self.proj = nn.Linear(16, hidden_size)
        self.bug = bug
        self.processor = ToyProcessor(bug)
        if bug == "unused_param":
            self.unused = nn.Linear(2, 2)

    def forward(self, batch):
        x = batch["pixels"]
        if self.bug == "train_only" and not self.training:
            raise RuntimeError("toy: no eval mode")
        if self.bug == "reverse":
            x = x.flip(0)
        patches = x.unfold(1, 4, 4).unfold(2, 4, 4).reshape(x.shape[0] * 4, 16)
        return self.proj(patches)

    def dummy_batch(self):
        return {"pixels": torch.zeros(1, 8, 8)}

    def save_pretrained(self, path):
        os.makedirs(path, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.state_dict().items()}
        if self.bug == "lossy_save":
            state = {k: torch.zeros_like(v) for k, v in state.items()}
        save_file(state, os.path.join(path, "toy.safetensors"))

def build(options, *, hidden_size):
    enc = Toy(hidden_size, options.get("bug", ""))
    if options.get("checkpoint"):
        enc.load_state_dict(load_file(os.path.join(options["checkpoint"], "toy.safetensors")))
    return enc
'''


@pytest.fixture
def toy_dist(fake_distribution):
    return fake_distribution("omnicore-toy", "0.3", {"toy": "toy_hook"}, {"toy_hook": HOOK, "toy_encoder": TOY})


def test_fake_distribution_is_discovered_and_undone(tmp_path):
    with installed_fake_distribution(
        tmp_path / "site", "omnicore-toy", "0.3", {"toy": "toy_hook"}, {"toy_hook": HOOK, "toy_encoder": TOY}
    ) as dist:
        assert str(tmp_path / "site") == sys.path[0]
        eps = [ep for ep in metadata.entry_points(group="omnicore") if ep.name == "toy"]
        assert [(ep.value, ep.dist.metadata["Name"], ep.dist.version) for ep in eps] == [("toy_hook", "omnicore-toy", "0.3")]
        assert [ep.name for ep in dist.entry_points()] == ["toy"]
        from omnicore.registry import Registry

        reg = Registry.discover(entry_points=dist.entry_points())
        row = [r for r in reg.components("encoder") if r.name == "toy"][0]
        assert (row.provider, row.version, row.status) == ("omnicore-toy", "0.3", "available")
        assert reg.build("encoder", "toy", {}, hidden_size=8).proj.out_features == 8
        assert "toy_encoder" in sys.modules
    assert str(tmp_path / "site") not in sys.path
    assert "toy_hook" not in sys.modules and "toy_encoder" not in sys.modules
    assert not [ep for ep in metadata.entry_points(group="omnicore") if ep.name == "toy"]


def test_isolated_registry_has_only_its_plugins(isolated_registry, toy_dist, monkeypatch):
    monkeypatch.setenv("OMNICORE_STRICT", "1")  # unset inside the fixture's registry: it was removed before
    import toy_hook

    reg = isolated_registry((toy_hook, "toy-provider"))
    assert [(r.kind, r.name, r.provider) for r in reg.rows] == [("encoder", "toy", "toy-provider")]
    with_builtins = isolated_registry(toy_hook, builtins=True)
    keys = sorted(r.spec.key for r in with_builtins.components())
    kernels = ["chunked_cross_entropy", "eager", "sdpa", "sdpa_varlen", "torch_cross_entropy", "torch_rms_norm"]
    parallel = ["activation_checkpointing", "compile", "ep", "fsdp2", "none"]
    builtin = [f"kernel/{k}" for k in kernels] + ["logger/jsonl"] + [f"parallel/{p}" for p in parallel]
    assert keys == ["encoder/toy", "foundation/hf_causal_lm"] + builtin
    # discovery would also find siglip, whisper and movqgan: the isolated one does not
    assert "siglip" not in {r.name for r in with_builtins.rows}


def test_omnicore_registry_fixture_discovers_installed(omnicore_registry):
    names = {r.name for r in omnicore_registry.components("encoder")}
    assert {"siglip", "whisper"} <= names


# ---- the encoder suite catches what it is meant to catch -------------------------------------


def _suite(bug: str) -> EncoderContract:
    class ToySuite(EncoderContract):
        name = "toy"
        options = {"bug": bug} if bug else {}
        hidden_size = 8
        plugin = "toy_hook"

    return ToySuite()


def _call(method, tmp_path):
    """A suite's test method, given the fixtures it names (``tmp_path``, ``monkeypatch``)."""
    names = method.__code__.co_varnames[: method.__code__.co_argcount]
    with pytest.MonkeyPatch.context() as mp:
        tmp_path.mkdir(parents=True, exist_ok=True)
        method(**{n: v for n, v in (("tmp_path", tmp_path), ("monkeypatch", mp)) if n in names})


def test_toy_encoder_passes_the_whole_suite(toy_dist, tmp_path):
    suite = _suite("")
    for name in dir(suite):
        if name.startswith("test_"):
            _call(getattr(suite, name), tmp_path / name)


@pytest.mark.parametrize(
    ("bug", "check", "message"),
    [
        ("reverse", "test_collate_keeps_item_order", "item 0"),
        ("num_tokens", "test_output_shape_and_dtype", r"\(15, 8\)"),
        ("num_tokens", "test_num_tokens_matches_forward_per_item", "item 0"),
        ("unused_param", "test_dummy_batch_reaches_every_parameter", "unused.weight"),
        ("lossy_save", "test_save_pretrained_round_trip", "not close|not equal"),
        ("num_tokens", "test_processor_agrees_with_module", r"num_tokens \[5, 5, 5\]"),
        ("module_in_processor", "test_processor_builds_from_options_alone", r"constructed nn.Modules: \['Linear'\]"),
    ],
)
def test_encoder_suite_catches_bugs(toy_dist, tmp_path, bug, check, message):
    with pytest.raises(AssertionError, match=message):
        _call(getattr(_suite(bug), check), tmp_path)


def test_encoder_suite_runs_the_paths_the_core_calls(toy_dist, tmp_path):
    """An encoder that trains but fails in eval mode passes the module checks of training, and the
    suite's core paths (validation, eval, generate, export) catch it."""
    _call(_suite("train_only").test_dummy_batch_reaches_every_parameter, tmp_path / "a")
    with pytest.raises(RuntimeError, match="toy: no eval mode"):
        _call(_suite("train_only").test_core_paths, tmp_path / "b")


@pytest.mark.slow
def test_hook_module_check_catches_torch_import(fake_distribution):
    fake_distribution("omnicore-heavy", "1.0", {"heavy": "heavy_hook"}, {"heavy_hook": "import torch\n" + HOOK, "toy_encoder": TOY})
    suite = _suite("")
    type(suite).plugin = "heavy_hook"
    with pytest.raises(AssertionError, match="imported torch"):
        suite.test_hook_module_imports_without_torch()


@pytest.mark.cli
def test_importing_omnicore_testing_stays_torch_free():
    import subprocess

    code = "import sys, omnicore.testing, omnicore.testing.pytest_plugin; assert 'torch' not in sys.modules; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "ok"


def test_meta_build_allocates_nothing(toy_dist):
    with torch.device("meta"):
        enc = _suite("").build()
    assert enc.proj.weight.is_meta and enc.proj.weight.shape == (8, 16)


# ---- the parallel-strategy suite checks the optional members on planned layouts --------------


class _Strategy:
    mesh_dims: tuple[str, ...] = ("dp_shard",)
    phase = "sharding"

    def __init__(self, options=None):
        self.bug = (options or {}).get("bug", "")

    def apply(self, model, mesh):
        return model

    def plan(self, model, state, prior):
        from omnicore.components import StrategyPlan

        ways = state.size("dp_shard") + (1 if self.bug == "plan" else 0)
        return StrategyPlan(["(root)"], {n: ("dp_shard", ways) for n, _ in model.named_parameters()}, "toy")

    def data_split(self, state):
        if self.bug == "split":  # rank 0 alone in group 0, everyone else in group 1
            return (0 if state.rank == 0 else 1), min(2, state.world_size)
        return state.rank // 2, max(state.world_size // 2, 1)


class _StrategyPlugin:
    @hookimpl
    def omnicore_parallel_strategies(self):
        return [ComponentSpec(name="toy_paired", target="test_testing_kit:_Strategy")]


def _strategy_suite(bug: str) -> ParallelStrategyContract:
    class Suite(ParallelStrategyContract):
        name = "toy_paired"
        options = {"bug": bug} if bug else {}
        plugin = _StrategyPlugin()
        planned_world_sizes = (2, 4)

    return Suite()


@pytest.mark.parametrize(("bug", "message"), [("", None), ("split", "unequal size"), ("plan", "split 3 ways over 'dp_shard' of size 2")])
def test_strategy_suite_checks_plan_and_data_split(bug, message):
    suite = _strategy_suite(bug)
    if message is None:
        suite.test_optional_members_on_planned_layouts()
        return
    with pytest.raises(AssertionError, match=message):
        suite.test_optional_members_on_planned_layouts()
