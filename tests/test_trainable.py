"""What trains: ``train.freeze``, ``train.lr_multipliers`` and the trainable/frozen figures of
``omnicore plan``.

* Matching: a pattern matches at dot boundaries with fnmatch wildcards; checked against a
  hand-written list of names on a small module tree.
* Errors: a pattern or prefix matching nothing names ``train.freeze[i]`` /
  ``train.lr_multipliers.KEY`` and the close module name; freezing everything; factor 0, negative
  or NaN in the config.
* ``build_optimizer``: one group per (decay, factor); each trainable parameter sits in the group of
  its expected factor (most specific prefix wins); frozen ones in none; the LambdaLR schedule keeps
  ``lr = train.lr * factor * schedule(step)`` at every step.
* FSDP2 on 2 processes, HSDP 2x2 on 4 and Ulysses sp 2 (with FSDP2) on 2, against one process over
  5 AdamW steps, with ``lm.model.layers.0`` and the key biases frozen and ``lm.model.layers.1`` at
  factor 0.1; the distributed runs save a DCP checkpoint after step 3 and finish steps 4-5 in a
  fresh model and optimizer loaded from it: frozen parameters bit-identical to their initial values,
  trainable ones within 1e-5 of one process (Ulysses 1e-4, see its test), no optimizer state for
  frozen parameters. FSDP2 + EP 2 with frozen experts likewise (3 steps).
* The real set-up: one process (groups and frozen values after 2 steps), and 2 FSDP2 processes
  loading a foundation checkpoint shard by shard: the frozen layer equals the checkpoint after 2 steps.
* ``omnicore plan``: trainable, frozen, gradient and AdamW bytes against counts from the model;
  LoRA's adapters as the only trainable part; an unmatched prefix as one ``error:`` line.
"""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch
import yaml
from conftest import TINY_LM

from omnicore.config import Config, ConfigError, load_config
from omnicore.data.packing import MicroBatch
from omnicore.model.trainable import apply_freeze, lr_factors, match_depth
from omnicore.testing.distributed import max_rel_diff, run_distributed

FREEZE = ["lm.model.layers.0", "lm.model.layers.*.self_attn.k_proj.bias"]
"""Layer 0, and every key bias: its gradient is zero in exact arithmetic (a constant added to every
key of a query leaves the softmax unchanged), so AdamW would turn round-off into lr-sized steps that
differ between process counts."""
MULTIPLIERS = {"lm.model.layers.1": 0.1}
MICRO = 4  # micro-batches per optimizer step (global)
SEQ = 32
STEPS = 5
SAVE_AT = 3


class _Tree(torch.nn.Module):
    """A module tree shaped like an OmniModel: lm.model.layers.{0,1}.{mlp, mlp_norm}, encoders.image.{tower, projector}."""

    def __init__(self) -> None:
        super().__init__()
        layer = lambda: torch.nn.ModuleDict({"mlp": torch.nn.Linear(3, 4), "mlp_norm": torch.nn.LayerNorm(4)})  # noqa: E731
        self.lm = torch.nn.ModuleDict({"model": torch.nn.ModuleDict({"layers": torch.nn.ModuleList([layer(), layer()])})})
        image = torch.nn.ModuleDict({"tower": torch.nn.Linear(4, 5), "projector": torch.nn.Linear(5, 6)})
        self.encoders = torch.nn.ModuleDict({"image": image})


def _frozen(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if not p.requires_grad}


def test_freeze_matches_prefixes_at_dot_boundaries_with_wildcards():
    model = _Tree()
    summary = apply_freeze(model, ["lm.model.layers.*.mlp", "encoders.image.tower"])
    want = {f"lm.model.layers.{i}.mlp.{w}" for i in (0, 1) for w in ("weight", "bias")}
    want |= {"encoders.image.tower.weight", "encoders.image.tower.bias"}
    assert _frozen(model) == want  # mlp_norm shares the text prefix "mlp" but not the dot boundary
    frozen = 2 * (3 * 4 + 4) + (4 * 5 + 5)
    assert (summary.frozen, summary.frozen_tensors) == (frozen, 6)
    assert summary.trainable == sum(p.numel() for p in model.parameters()) - frozen == 2 * 8 + 5 * 6 + 6
    assert match_depth("lm.model.layers.0.mlp.weight", "lm.model.layers.*") == 4
    assert match_depth("lm.model.layers.0.mlp_norm.weight", "lm.model.layers.0.mlp") == 0


def test_freeze_leaves_frozen_parameters_frozen_and_covers_tied_names():
    model = _Tree()
    model.encoders.image.tower.weight.requires_grad_(False)  # e.g. frozen by LoRA before
    model.encoders.image.projector.weight = model.lm.model.layers[0].mlp.weight  # one tensor under two names
    apply_freeze(model, ["encoders.image.projector"])  # a tied name matches the shared tensor
    assert not model.lm.model.layers[0].mlp.weight.requires_grad
    assert not model.encoders.image.tower.weight.requires_grad
    assert model.encoders.image.tower.bias.requires_grad


def test_unmatched_pattern_and_freezing_everything_are_config_errors():
    with pytest.raises(ConfigError, match=r"train\.freeze\[1\]: 'encoders\.imag' matches no module.*did you mean 'encoders\.image'"):
        apply_freeze(_Tree(), ["lm", "encoders.imag"])
    with pytest.raises(ConfigError, match=r"train\.freeze\[0\]: 'vision' matches no module.*the model's parts: lm, .*encoders\.image"):
        apply_freeze(_Tree(), ["vision"])
    with pytest.raises(ConfigError, match="every parameter of the model is frozen"):
        apply_freeze(_Tree(), ["lm", "encoders"])
    with pytest.raises(ConfigError, match=r"train\.lr_multipliers\.lm\.model\.layer: .*did you mean 'lm\.model\.layers'"):
        lr_factors(_Tree(), {"lm.model.layer": 0.5})


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"lr_multipliers": {"lm": 0}}, "train.lr_multipliers.lm: factor 0 would keep gradients.*list lm in train.freeze instead"),
        ({"lr_multipliers": {"lm": -0.5}}, r"train.lr_multipliers.lm: factor -0.5 must be a finite number > 0"),
        ({"lr_multipliers": {"lm": ".nan"}}, r"train.lr_multipliers.lm: nan is not a finite number; give a finite value"),
        ({"freeze": ["lm", "encoders..image"]}, r"train.freeze\[1\]: 'encoders..image' is not a dotted module prefix"),
        ({"lr_multipliers": {"lm.": 2.0}}, r"train.lr_multipliers.lm.: 'lm.' is not a dotted module prefix"),
    ],
)
def test_config_refuses_bad_factors_and_prefixes(tmp_path, train, message):
    text = yaml.safe_dump({"model": {"foundation": {"name": "hf_causal_lm"}}, "data": {"train": "x.jsonl"}, "train": train})
    path = tmp_path / "cfg.yaml"
    path.write_text(text.replace("'.nan'", ".nan"))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def _cfg(parallel: dict | None = None, **train) -> Config:
    return Config.model_validate(
        {
            "run": {"seed": 0, "device": "cpu"},
            "model": {"foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM)}}},
            "data": {"train": "unused.jsonl"},
            "parallel": parallel or {},
            "train": {"lr": 1e-2, "warmup_steps": 2, "max_steps": STEPS, "min_lr_ratio": 0.1, "weight_decay": 0.1, **train},
        }
    )


def test_adamw_on_plain_tensors_is_fused_and_takes_the_textbook_step():
    """Plain CPU parameters get PyTorch's fused AdamW; 3 steps of it equal AdamW written out in
    float64 (Loshchilov & Hutter 2019, Algorithm 2, with bias correction), within 1e-6."""
    from omnicore.train.optim import build_optimizer

    model = _Tree()
    cfg = _cfg(lr_multipliers={"lm.model.layers.1": 0.1})
    opt = build_optimizer(model, cfg)
    assert all(g["fused"] for g in opt.param_groups) and not any(g["foreach"] for g in opt.param_groups)
    (b1, b2), eps = cfg.train.betas, 1e-8
    gen = torch.Generator().manual_seed(0)
    grads = {n: [torch.randn(p.shape, generator=gen) for _ in range(3)] for n, p in model.named_parameters()}
    ref = {}
    for g in opt.param_groups:
        for p in g["params"]:
            name = next(n for n, q in model.named_parameters() if q is p)
            x, m, v = p.detach().double().clone(), torch.zeros(p.shape, dtype=torch.float64), torch.zeros(p.shape, dtype=torch.float64)
            for t, grad in enumerate(grads[name], start=1):
                m, v = b1 * m + (1 - b1) * grad.double(), b2 * v + (1 - b2) * grad.double() ** 2
                x = x * (1 - g["lr"] * g["weight_decay"]) - g["lr"] * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
            ref[name] = x
    for t in range(3):
        for n, p in model.named_parameters():
            p.grad = grads[n][t].clone()
        opt.step()
    for n, p in model.named_parameters():
        assert torch.allclose(p.detach().double(), ref[n], atol=1e-6, rtol=0), n


def test_a_loaded_looped_adamw_state_is_fused_again_and_continues_alike():
    """Optimizer.load_state_dict keeps the saved groups' fused/foreach (an older omnicore's loop, or
    a DTensor run's): use_implementation sets them for the parameters at hand, and the next step
    equals the loop's within 1e-6."""
    from omnicore.train.optim import build_optimizer, use_implementation

    cfg = _cfg()
    model = _Tree()
    opt = build_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    saved = opt.state_dict()
    for g in saved["param_groups"]:  # as a run with the per-tensor loop saved it
        g.update(fused=False, foreach=False)
    twin = _Tree()
    twin.load_state_dict(model.state_dict())
    fused, looped = build_optimizer(model, cfg), build_optimizer(twin, cfg)
    fused.load_state_dict(copy.deepcopy(saved))  # copies: load_state_dict keeps the given moment tensors
    looped.load_state_dict(copy.deepcopy(saved))
    assert not any(g["fused"] for g in fused.param_groups)  # what torch restores
    use_implementation(fused)
    assert all(g["fused"] and g["foreach"] is None for g in fused.param_groups)
    for p, q in zip(model.parameters(), twin.parameters()):
        p.grad = torch.randn(p.shape, generator=gen)
        q.grad = p.grad.clone()
    fused.step()
    looped.step()
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0), n


def test_param_groups_follow_the_most_specific_prefix_and_the_schedule_keeps_each_factor():
    from omnicore.train.optim import build_optimizer, warmup_cosine

    model = _Tree()
    cfg = _cfg(freeze=["encoders.image.tower"], lr_multipliers={"lm": 0.5, "lm.model.layers.1": 0.1, "encoders.*": 2.0})
    apply_freeze(model, cfg.train.freeze)
    opt = build_optimizer(model, cfg)
    want = {"lm.model.layers.0": 0.5, "lm.model.layers.1": 0.1, "encoders.image.projector": 2.0}  # written out by hand
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            assert id(p) not in group_of, name
            continue
        factor = next(f for prefix, f in want.items() if name.startswith(prefix + "."))
        g = group_of[id(p)]
        assert (g["lr"], g["factor"]) == (1e-2 * factor, factor), name
        assert g["weight_decay"] == (0.1 if p.ndim >= 2 else 0.0), name
    assert sorted((g["factor"], g["weight_decay"]) for g in opt.param_groups) == [
        (0.1, 0.0),
        (0.1, 0.1),
        (0.5, 0.0),
        (0.5, 0.1),
        (2.0, 0.0),
        (2.0, 0.1),
    ]
    fn = warmup_cosine(2, STEPS, 0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, fn)
    for step in range(STEPS + 1):
        for g in opt.param_groups:
            assert math.isclose(g["lr"], 1e-2 * g["factor"] * fn(step), rel_tol=1e-12), (step, g["factor"])
        base = next(g["lr"] for g in opt.param_groups if g["factor"] == 0.5)
        tenth = next(g["lr"] for g in opt.param_groups if g["factor"] == 0.1)
        assert math.isclose(tenth, base / 5, rel_tol=1e-12)  # 0.1 is one fifth of 0.5: one tenth of train.lr x schedule
        opt.step()
        sched.step()


def _batches(vocab: int, n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (1, SEQ), generator=g)
        labels = torch.full_like(ids, -100)
        labels[:, :-1] = ids[:, 1:]
        out.append({"input_ids": ids, "labels": labels, "position_ids": torch.arange(SEQ).unsqueeze(0)})
    return out


def _build(cfg: Config, state):
    """Model (frozen parts applied, strategies applied), optimizer and schedule, as the set-up does."""
    from omnicore.model.build import build_omni_model
    from omnicore.parallel.parallelize import build_strategies, parallelize
    from omnicore.registry import Registry
    from omnicore.train.optim import build_optimizer, warmup_cosine

    # ulysses is a plugin (omnicore-parallel-ulysses): the installed plugins then
    registry = Registry.discover() if "ulysses" in (cfg.parallel.strategies or []) else Registry.from_plugins([], builtins=True)
    torch.manual_seed(0)
    model, tok = build_omni_model(cfg, registry)
    apply_freeze(model, cfg.train.freeze)
    model = parallelize(model, state, build_strategies(cfg.parallel, registry, state.distributed))
    opt = build_optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.train.warmup_steps, cfg.train.max_steps, cfg.train.min_lr_ratio))
    return model, tok, opt, sched


def _full(model) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in model.named_parameters()}


def _step(model, opt, sched, state, batches: list[dict[str, torch.Tensor]]) -> float:
    mine = [batches[k * state.dp_size + state.dp_rank] for k in range(MICRO // state.dp_size)]
    n_global = state.all_reduce_sum(sum(int((b["labels"] != -100).sum()) for b in mine), dim="dp")
    loss_sum = 0.0
    for b in mine:
        out = model(MicroBatch(**b))
        (out.loss_sum * state.world_size / n_global).backward()
        loss_sum += float(out.loss_sum.detach())
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return state.all_reduce_sum(loss_sum) / n_global


def freeze_run(parallel: dict, ckpt: str | None) -> dict:
    """STEPS optimizer steps with FREEZE and MULTIPLIERS; with ``ckpt`` (a folder), save a DCP
    checkpoint after SAVE_AT steps and run the rest in a fresh model and optimizer loaded from it."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from omnicore.checkpoint.dcp import load_checkpoint, save_checkpoint
    from omnicore.parallel.state import ParallelState, init_parallel_state

    cfg = _cfg(parallel, freeze=FREEZE, lr_multipliers=MULTIPLIERS)
    distributed = torch.distributed.is_initialized()
    state = init_parallel_state("cpu", "gloo", cfg.parallel) if distributed else ParallelState(0, 1, 0, torch.device("cpu"))
    model, tok, opt, sched = _build(cfg, state)
    initial = _full(model)
    batches = _batches(len(tok), MICRO)  # the same micro-batches every step: the loss must fall
    losses = []
    for step in range(STEPS):
        if ckpt and step == SAVE_AT:
            folder = save_checkpoint(ckpt, step, model, opt, sched, {"step": step}, state)
            model, _, opt, sched = _build(cfg, state)
            load_checkpoint(folder, model, opt, sched, state)
        losses.append(_step(model, opt, sched, state, batches))
    _, optim_sd = get_state_dict(model, opt)
    return {
        "initial": initial,
        "final": _full(model),
        "losses": losses,
        "with_state": sorted(optim_sd["state"]),
        "lrs": sorted((g["factor"], g["lr"]) for g in opt.param_groups),
    }


def _is_frozen(name: str) -> bool:
    """FREEZE, written out another way."""
    return name.startswith("lm.model.layers.0.") or (name.startswith("lm.model.layers.") and name.endswith(".self_attn.k_proj.bias"))


def _off_elements(got: dict, want: dict, names: list[str], tol: float) -> list[tuple[str, float]]:
    """``(name, absolute difference)`` of each element further than ``tol`` x max |want| of its tensor."""
    out = []
    for n in names:
        d = (got[n].double() - want[n].double()).abs()
        scale = max(float(want[n].abs().max()), 1e-12)
        out += [(n, float(v)) for v in d[d > tol * scale].tolist()]
    return out


def _check(ranks: list[dict], ref: dict, tol: float = 1e-5, roundoff_elements: int = 0) -> None:
    frozen = [n for n in ref["final"] if _is_frozen(n)]
    trained = [n for n in ref["final"] if n not in frozen]
    assert frozen and ref["with_state"] == sorted(trained)  # frozen: no AdamW state
    for name in frozen:
        assert torch.equal(ref["final"][name], ref["initial"][name]), name
    moved = [n for n in trained if not torch.equal(ref["final"][n], ref["initial"][n])]
    assert len(moved) == len(trained)  # everything else trained
    assert ref["losses"][-1] < ref["losses"][0]
    assert {f for f, _ in ref["lrs"]} == {1.0, 0.1}  # MULTIPLIERS gave layer 1 its own groups
    for r, got in enumerate(ranks):
        for name in frozen:
            assert torch.equal(got["final"][name], ref["initial"][name]), (r, name)  # bit-identical
        off = _off_elements(got["final"], ref["final"], trained, tol)
        print(f"rank {r}: trainable elements beyond rel {tol:.0e}: {off}, losses {got['losses']}")
        assert len(off) <= roundoff_elements, (r, off)
        # AdamW moves an element by at most about lr per step, however round-off tilts its gradient
        assert all(d <= 2 * 1e-2 * STEPS for _, d in off), (r, off)
        assert max_rel_diff(got["losses"], ref["losses"]) <= 1e-5
        assert got["with_state"] == ref["with_state"]
        assert got["lrs"] == ref["lrs"]


@pytest.fixture(scope="module")
def reference() -> dict:
    return freeze_run({}, None)


@pytest.mark.multiprocess
def test_fsdp2_two_processes_with_frozen_layer_and_resume_match_one_process(reference, tmp_path):
    ranks = run_distributed(freeze_run, 2, args=({"dp_shard": -1, "strategies": ["fsdp2"]}, str(tmp_path / "ckpt")))
    _check(ranks, reference)


@pytest.mark.multiprocess
def test_hsdp_2x2_with_frozen_layer_and_resume_matches_one_process(reference, tmp_path):
    ranks = run_distributed(freeze_run, 4, args=({"dp_replicate": 2, "dp_shard": -1}, str(tmp_path / "ckpt")))
    _check(ranks, reference)


@pytest.mark.multiprocess
def test_ulysses_sp2_with_frozen_layer_and_resume_matches_one_process(reference, tmp_path):
    """Ulysses (sp 2, both ranks read the same micro-batches, each its half of the sequence) with
    FSDP2 over the (dp, sp) ranks. Losses within 1e-5; parameters within 1e-4: one lm_head element
    has a first-step gradient of -4.3e-8 (median 0.08, measured), at round-off level, and AdamW's
    g / (sqrt(v) + eps) turns the other summation order of the split sequence into a step of a
    different size there (5.8e-6 apart after 5 steps with transformers 5.20, 1.1e-4 of the tensor's
    largest value with 5.24); every other element is within 1e-5. So: every element within 1e-5,
    except at most 2, and those no further apart than AdamW's steps can take them."""
    ranks = run_distributed(freeze_run, 2, args=({"sp": 2, "strategies": ["ulysses", "fsdp2"]}, str(tmp_path / "ckpt")))
    _check(ranks, reference, roundoff_elements=2)


def test_plan_counts_trainable_and_frozen_memory(tmp_path):
    from omnicore.model.build import build_omni_model
    from omnicore.parallel.plan import make_plan
    from omnicore.registry import Registry

    model, _ = build_omni_model(_cfg(), Registry.from_plugins([], builtins=True))
    layer0 = sum(p.numel() for n, p in model.named_parameters() if _is_frozen(n))
    total = sum(p.numel() for p in model.parameters())
    one = make_plan(_cfg(freeze=FREEZE), 1)
    assert (one.params, one.trainable_params) == (total, total - layer0)
    assert one.frozen_param_bytes_per_rank == 4 * layer0  # fp32
    assert one.grad_bytes_per_rank == 4 * (total - layer0)
    assert one.optimizer_bytes_per_rank == 8 * (total - layer0)
    assert one.as_dict()["frozen_params"] == layer0
    assert f"trainable {total - layer0:,}" in one.render() and f"frozen {layer0:,}" in one.render()
    two = make_plan(_cfg({"dp_shard": -1, "strategies": ["fsdp2"]}, freeze=FREEZE), 2)
    assert two.optimizer_bytes_per_rank == 2 * two.grad_bytes_per_rank
    assert one.grad_bytes_per_rank / 2 <= two.grad_bytes_per_rank < one.grad_bytes_per_rank / 2 * 1.05
    assert two.param_bytes_per_rank - two.frozen_param_bytes_per_rank == two.grad_bytes_per_rank


def test_plan_cli_reports_an_unmatched_freeze_as_one_error_line(tmp_path, capsys):
    from omnicore.cli import main

    cfg = {"model": {"foundation": {"name": "hf_causal_lm", "options": {"config": dict(TINY_LM)}}}, "data": {"train": "x.jsonl"}}
    cfg["train"] = {"freeze": ["lm.model.layer.0"]}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["plan", str(path), "--world-size", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # status lines (omnicore.logs), then one error line
    err = [x for x in lines if x.startswith("error:")]
    assert err == lines[-1:] and err[0].startswith("error: train.freeze[0]: 'lm.model.layer.0' matches no module"), lines
    assert "did you mean 'lm.model.layers.0'" in err[0]


@pytest.mark.slow
def test_training_setup_freezes_and_groups_by_factor(tmp_path, caplog):
    """The real set-up (config -> model -> freeze -> strategies -> optimizer) and two training steps:
    the frozen layer keeps its values, the optimizer holds only the trainable parameters, and the
    metrics' lr is train.lr x schedule even when every group has a factor."""
    import json

    from omnicore.train.loop import setup, train_step
    from omnicore.train.optim import warmup_cosine

    rows = [
        {"messages": [{"role": "user", "content": f"count to {i}"}, {"role": "assistant", "content": "1 2 3"[: 1 + i % 5]}]}
        for i in range(16)
    ]
    (tmp_path / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg(freeze=["lm.model.layers.0"], lr_multipliers={"lm.model": 0.5, "lm.lm_head": 0.1}, progress=False, export=False)
    cfg = Config.model_validate(
        {
            **cfg.model_dump(),
            "run": {"seed": 0, "output_dir": str(tmp_path / "run")},
            "data": {"train": str(tmp_path / "text.jsonl"), "max_tokens": 128},
        }
    )
    caplog.set_level(logging.INFO, logger="omnicore")
    run = setup(cfg)
    try:
        names = {id(p): n for n, p in run.model.named_parameters()}
        before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
        in_groups = {names[id(p)]: g["factor"] for g in run.optimizer.param_groups for p in g["params"]}
        assert set(in_groups) == {n for n in before if not n.startswith("lm.model.layers.0.")}
        assert {n for n, f in in_groups.items() if f == 0.1} == {"lm.lm_head.weight"}
        assert set(in_groups.values()) == {0.1, 0.5}
        schedule = warmup_cosine(2, STEPS, 0.1)
        for step in range(2):
            row = train_step(run, step)
            assert row is not None and math.isclose(row["lr"], 1e-2 * schedule(step), rel_tol=1e-12), (step, row)
    finally:
        run.data.close()
    after = dict(run.model.named_parameters())
    assert all(torch.equal(after[n], before[n]) for n in before if n.startswith("lm.model.layers.0."))
    assert not torch.equal(after["lm.model.layers.1.mlp.up_proj.weight"], before["lm.model.layers.1.mlp.up_proj.weight"])
    assert any(r.name == "omnicore.train.loop" and r.getMessage().startswith("trainable parameters: ") for r in caplog.records)


EP_FREEZE = ["lm.model.layers.0", "lm.model.layers.2.mlp.experts"]
"""Layer 0, and the experts of layer 2: expert weights that EP splits over the ep ranks."""
EP_STEPS = 3


def ep_freeze_run(distributed: bool) -> dict:
    """EP_STEPS AdamW steps on the tiny Qwen3-MoE of ``test_expert_parallel`` with EP_FREEZE; with
    ``distributed``, as ``ep 2`` + FSDP2 through ``parallelize`` (each rank reads its own rows)."""
    from test_expert_parallel import B, L, batch, build_model, omni, omni_loss

    from omnicore.parallel.state import ParallelState, init_parallel_state
    from omnicore.train.optim import build_optimizer, clip_grad_norm_

    cfg = _cfg(lr=1e-3, freeze=EP_FREEZE, lr_multipliers={"lm.model.layers.1.mlp": 0.1})
    model = omni(build_model())
    apply_freeze(model, cfg.train.freeze)
    state = ParallelState(0, 1, 0, torch.device("cpu"))
    if distributed:
        from omnicore.parallel.fsdp import FSDP2
        from omnicore.parallel.parallelize import parallelize
        from omnicore.registry import Registry

        state = init_parallel_state("cpu", "gloo", {"dp_replicate": 1, "dp_shard": 1, "ep": 2, "sp": 1})
        ep = Registry.from_plugins([], builtins=True).build("parallel", "ep", {})
        model = parallelize(model, state, [("fsdp2", FSDP2()), ("ep", ep)])
    initial = _full(model)
    opt = build_optimizer(model, cfg)
    rows = B // state.dp_size
    mine = batch()[state.dp_rank * rows : (state.dp_rank + 1) * rows]
    for _ in range(EP_STEPS):
        (omni_loss(model, mine, B * (L - 1)) * state.dp_size).backward()  # FSDP2 averages over the dp ranks
        clip_grad_norm_(model.parameters(), 1.0)  # as the loop does: per-mesh norms, frozen ones have no grad
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"initial": initial, "final": _full(model), "with_grad_state": sorted(n for n, p in model.named_parameters() if p in opt.state)}


@pytest.mark.multiprocess
def test_fsdp_ep_with_frozen_experts_matches_one_process():
    ref = ep_freeze_run(False)
    frozen = [n for n in ref["final"] if n.startswith(("lm.model.layers.0.", "lm.model.layers.2.mlp.experts."))]
    assert any(".experts." in n for n in frozen) and ref["with_grad_state"] == sorted(set(ref["final"]) - set(frozen))
    for r, got in enumerate(run_distributed(ep_freeze_run, 2, args=(True,))):
        for name in frozen:
            assert torch.equal(got["final"][name], ref["initial"][name]), (r, name)
        trained = {n: got["final"][n] for n in ref["final"] if n not in frozen}
        diff = max_rel_diff(trained, {n: ref["final"][n] for n in trained})
        print(f"rank {r}: trainable parameters rel diff {diff:.2e}")
        assert diff <= 1e-5, (r, diff)
        assert got["with_grad_state"] == ref["with_grad_state"]


def test_plan_counts_lora_adapters_as_the_only_trainable_part_of_the_foundation():
    """LoRA (model.lora) then freeze, as the set-up does: with the foundation's adapters and
    nothing frozen, the trainable elements are exactly the adapters' r x (in + out) per layer."""
    from omnicore.parallel.plan import make_plan

    cfg = _cfg()
    cfg = Config.model_validate(
        {**cfg.model_dump(), "model": {**cfg.model_dump()["model"], "lora": {"r": 2, "target_modules": ["q_proj"]}}}
    )
    report = make_plan(cfg, 1)
    hidden, heads = TINY_LM["hidden_size"], TINY_LM["num_attention_heads"]
    q_out = hidden // heads * heads
    assert report.trainable_params == TINY_LM["num_hidden_layers"] * 2 * (hidden + q_out)
    assert report.optimizer_bytes_per_rank == 8 * report.trainable_params


def sharded_load_rank(raw: dict, out: str) -> dict:
    """Set-up from a foundation checkpoint (built on meta, frozen, sharded, then filled) and 2 steps."""
    from omnicore.parallel.state import init_parallel_state
    from omnicore.train.loop import setup, train_step

    cfg = Config.model_validate({**raw, "run": {"seed": 0, "output_dir": out}})
    run = setup(cfg, state=init_parallel_state("cpu", "gloo", cfg.parallel))
    try:
        flags = {n: p.requires_grad for n, p in run.model.named_parameters()}
        for step in range(2):
            train_step(run, step)
    finally:
        run.data.close()
    return {"requires_grad": flags, "final": _full(run.model)}


@pytest.mark.multiprocess
def test_frozen_layer_of_a_sharded_loaded_checkpoint_keeps_the_checkpoint_values(tmp_path):
    """train.freeze on the meta-built foundation survives the fill from the checkpoint: on 2 FSDP2
    processes the frozen layer equals the checkpoint's tensors after 2 steps, the rest moved."""
    import json

    from safetensors.torch import load_file
    from test_loading import _save_lm

    _save_lm(tmp_path / "lm")
    rows = [
        {"messages": [{"role": "user", "content": f"add {i} {i + 1}"}, {"role": "assistant", "content": str(2 * i + 1)}]} for i in range(16)
    ]
    (tmp_path / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = {
        "model": {"foundation": {"name": "hf_causal_lm", "options": {"checkpoint": str(tmp_path / "lm")}}},
        "data": {"train": str(tmp_path / "text.jsonl"), "max_tokens": 128, "num_workers": 0},
        "parallel": {"strategies": ["fsdp2"], "backend": "gloo"},
        "train": {"freeze": ["lm.model.layers.0"], "max_steps": 2, "lr": 1e-2, "warmup_steps": 0, "progress": False, "export": False},
    }
    saved = load_file(tmp_path / "lm" / "model.safetensors")
    for r, got in enumerate(run_distributed(sharded_load_rank, 2, args=(raw, str(tmp_path / "run")))):
        frozen = {n for n, flag in got["requires_grad"].items() if not flag}
        assert frozen == {n for n in got["final"] if n.startswith("lm.model.layers.0.")}, r
        for n in got["final"]:
            same = torch.equal(got["final"][n], saved[n.removeprefix("lm.")])
            assert same == (n in frozen), (r, n, same)
