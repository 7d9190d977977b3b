"""The einops head layouts of the attention functions give bit for bit the tensors of the
transpose/view/reshape expressions they replaced, written here as the reference. One process: the
sequence-parallel exchange is replaced by the identity (sp = 1), so only the layouts are compared."""

from __future__ import annotations

import torch
from torch import nn

from omnicore_parallel_ulysses import attention
from omnicore_parallel_ulysses.attention import SPState, _merge_heads, _project, ulysses_attention

B, T, HEADS, D = 2, 7, 4, 8


class _Attention(nn.Module):
    """The parts ``_project`` reads of a foundation attention module: projections, head_dim and a
    Qwen3-style per-head norm on q only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head_dim = D
        self.q_proj = nn.Linear(HEADS * D, HEADS * D)
        self.k_proj = nn.Linear(HEADS * D, 2 * D)  # two KV heads
        self.q_norm = nn.RMSNorm(D)


def _old_project(module, name, norm, hidden_states):
    shape = (*hidden_states.shape[:-1], -1, module.head_dim)
    x = getattr(module, name)(hidden_states).view(shape)
    n = getattr(module, norm, None)
    return (n(x) if n is not None else x).transpose(1, 2)


def test_project_and_merge_heads_equal_the_view_transpose_expressions():
    module = _Attention()
    hidden = torch.randn(B, T, HEADS * D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for name, norm, heads in (("q_proj", "q_norm", HEADS), ("k_proj", "k_norm", 2)):  # with and without a norm
            got, want = _project(module, name, norm, hidden), _old_project(module, name, norm, hidden)
            assert got.shape == want.shape == (B, heads, T, D) and got.stride() == want.stride() and torch.equal(got, want)
    out = torch.randn(B, HEADS, T, D, generator=torch.Generator().manual_seed(2))
    merged = _merge_heads(out)
    assert merged.is_contiguous() and torch.equal(merged, out.transpose(1, 2).reshape(B, T, -1).contiguous())


class _OneRank(SPState):
    """sp = 1 without a process group: the all-to-alls are the identity."""

    def to_heads(self, x, pending=None):
        return x

    def to_sequence(self, x):
        return x


def test_ulysses_attention_layouts_equal_the_transpose_expressions():
    """Through ulysses_attention with a varlen ``inner`` (which returns ``[B, T, H, D]``): the
    output is the inner output, transposed to heads and back, as the old expressions did."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, HEADS, T, D, generator=g) for _ in range(3))

    def inner(module, q, k, v, mask, **kw):  # any function of q, k, v; the layout is what is compared
        return (q * 2 + k - v).transpose(1, 2), None

    module = nn.Module()
    module.omnicore_ulysses = _OneRank(None, 1, 0, inner)
    pos = torch.arange(T).expand(B, T)
    got, _ = ulysses_attention(module, q, k, v, None, **{attention.POSITION_IDS_KWARG: pos})
    core = inner(module, q, k, v, None)[0].transpose(1, 2)  # the old core_attention's inner branch
    want = core.transpose(1, 2).contiguous()  # the old ulysses_attention's return
    assert got.shape == want.shape == (B, T, HEADS, D) and got.is_contiguous() and torch.equal(got, want)
