"""``BlockStrategy`` (the base of per-block strategies) and ``checkpoint_module``: the phase a
subclass gets when it declares none, and the modes ``checkpoint_module`` accepts."""

from __future__ import annotations

import pytest


def test_a_block_strategy_without_a_phase_runs_before_sharding_and_after_attention():
    from omnicore.api import FSDP2, PHASES, BlockStrategy
    from omnicore.parallel.parallelize import order_strategies, phase_of

    class Wrap(BlockStrategy):  # declares no phase: the base's applies
        def apply(self, model, state):
            return model

    class Attn:
        mesh_dims = ()
        phase = "attention"

        def apply(self, model, state):
            return model

    assert phase_of(Wrap()) == "checkpointing" and "checkpointing" in PHASES
    got = [n for n, _ in order_strategies([("fsdp2", FSDP2()), ("wrap", Wrap()), ("attn", Attn())])]
    assert got == ["attn", "wrap", "fsdp2"]  # fully_shard must see the blocks as they finally run


def test_the_built_in_block_strategies_declare_their_own_phase():
    from omnicore.parallel.checkpointing import ActivationCheckpointing
    from omnicore.parallel.compile import CompileBlocks
    from omnicore.parallel.parallelize import phase_of

    assert phase_of(ActivationCheckpointing()) == "checkpointing"
    assert phase_of(CompileBlocks()) == "compile"


def test_checkpoint_module_refuses_an_unknown_mode_and_leaves_the_module_alone():
    import torch

    from omnicore.api import checkpoint_module

    block = torch.nn.Linear(3, 3)
    before = block.forward
    with pytest.raises(ValueError, match=r"mode 'bogus' is not one of 'full', 'op'"):
        checkpoint_module(block, mode="bogus")
    assert block.forward == before and not hasattr(block, "_omnicore_checkpointed")


@pytest.mark.parametrize("mode", ["full", "op"])
def test_checkpoint_module_keeps_outputs_and_gradients(mode):
    import copy

    import torch

    from omnicore.api import checkpoint_module

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    ckpt = copy.deepcopy(ref)
    checkpoint_module(ckpt, mode=mode)
    x = torch.randn(5, 4)
    ref(x).square().sum().backward()
    ckpt(x).square().sum().backward()
    assert ckpt._omnicore_checkpointed == mode
    for a, b in zip(ref.parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
