"""CPU checks of the flash_attn kernel: cu_seqlens from restarting position_ids, and the attention
function's layout against SDPA with a fake ``flash_attn`` module (the real one needs CUDA)."""

from __future__ import annotations

import sys
import types

import torch

from omnicore_kernels_flash_attn.kernel import FlashAttnVarlen, cu_seqlens_from_position_ids, varlen_attention_forward


def test_cu_seqlens_from_restarting_position_ids():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    cu, max_len = cu_seqlens_from_position_ids(pos)
    assert cu.tolist() == [0, 3, 5, 6, 12] and cu.dtype == torch.int32
    assert max_len == 6


def test_cu_seqlens_is_the_core_function_and_forward_is_marked_varlen():
    import omnicore.api as api

    assert cu_seqlens_from_position_ids is api.cu_seqlens_from_position_ids  # one implementation, in core
    assert api.is_varlen(varlen_attention_forward)  # Ulysses hands it the global position_ids and cu_seqlens


def test_varlen_forward_matches_per_sample_sdpa(monkeypatch):
    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=True):
        out = torch.empty_like(q)
        for s, e in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            out[s:e] = torch.nn.functional.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1), is_causal=causal, scale=softmax_scale
            ).transpose(0, 1)
        return out

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_varlen_func=fake_varlen))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    out, _ = varlen_attention_forward(types.SimpleNamespace(is_causal=True, training=False), q, k, v, None, scaling=0.5, position_ids=pos)
    assert out.shape == (1, 5, 2, 4)
    first = torch.nn.functional.scaled_dot_product_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], is_causal=True, scale=0.5)
    torch.testing.assert_close(out[:, :3], first.transpose(1, 2))
    # cu_seqlens passed by OmniModel (transformers' varlen keyword arguments) win over position_ids
    whole = torch.tensor([0, 5], dtype=torch.int32)
    kw = dict(zip(api_kwargs(), (whole, whole, 5, 5)))
    out2, _ = varlen_attention_forward(
        types.SimpleNamespace(is_causal=True, training=False), q, k, v, None, scaling=0.5, position_ids=pos, **kw
    )
    all5 = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    torch.testing.assert_close(out2, all5.transpose(1, 2))
    assert not torch.allclose(out2[:, 3:], out[:, 3:])


def api_kwargs():
    from omnicore.api import CU_SEQLENS_KWARGS

    return CU_SEQLENS_KWARGS


def test_available_says_why_without_cuda():
    ok, why = FlashAttnVarlen().available()
    if not torch.cuda.is_available():
        assert not ok and "CUDA" in why
