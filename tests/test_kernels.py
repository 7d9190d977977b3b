"""Kernels chosen per op (``model.kernels``): the cross-entropy kernels against the plain loss, the
``torch_rms_norm`` kernel against transformers' Qwen2 RMSNorm, the config errors, a short training
run with both built-in kernels equal to the default one, and GPU-only kernels refused before training.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import tiny_config_dict

from omnicore.config import Config, ConfigError, load_config
from omnicore.data.packing import MicroBatch
from omnicore.kernels.cross_entropy import ChunkedCrossEntropy, TorchCrossEntropy
from omnicore.kernels.rmsnorm import TorchRMSNorm, rms_norm_modules
from omnicore.model.build import build_kernels
from omnicore.registry import Registry, RegistryError, cuda_present
from omnicore.testing import KernelContract
from omnicore.testing.contracts import tiny_causal_lm

NO_CUDA = not cuda_present()
LIGER_REASON = "needs CUDA (no NVIDIA driver found) and the liger_kernel package (pip install liger-kernel on a CUDA machine)"


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max absolute difference relative to the reference's largest magnitude."""
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


def _loss_and_grads(kernel, hidden, weight, labels, bias=None, scale=1.0):
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    b = bias.clone().requires_grad_() if bias is not None else None
    loss = kernel.linear_cross_entropy_sum(h, w, labels, ignore_index=-100, bias=b)
    (loss * scale).backward()
    return loss.detach(), h.grad, w.grad, (b.grad if b is not None else None)


def _inputs(n, h, v, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, h, generator=g).to(dtype),
        (torch.randn(v, h, generator=g) * 0.3).to(dtype),
        torch.randint(0, v, (n,), generator=g),
    )


# ---- cross-entropy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, chunk, ignored, bias",
    [
        (64, 16, "some", False),  # N divisible by the chunk
        (37, 8, "some", False),  # N not divisible: a last chunk of 5 rows
        (37, 8, "first_chunk", True),  # one chunk entirely ignored, with a head bias
        (37, 1024, "some", True),  # one chunk larger than N
        (20, 6, "all", False),  # every target ignored: loss 0, zero gradients
    ],
)
def test_chunked_equals_torch_loss_and_grads(n, chunk, ignored, bias):
    hidden, weight, labels = _inputs(n, 24, 97, seed=n + chunk)
    if ignored == "some":
        labels[::3] = -100
    elif ignored == "first_chunk":
        labels[:chunk] = -100
    else:
        labels[:] = -100
    b = torch.randn(97, generator=torch.Generator().manual_seed(1)) * 0.1 if bias else None
    want = _loss_and_grads(TorchCrossEntropy(), hidden, weight, labels, b, scale=0.37)
    got = _loss_and_grads(ChunkedCrossEntropy({"chunk_size": chunk}), hidden, weight, labels, b, scale=0.37)
    assert got[0].dtype == torch.float32 and got[0].dim() == 0
    for what, g, w in zip(("loss", "grad hidden", "grad weight", "grad bias"), got, want):
        if w is None:
            assert g is None
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, what
        if ignored == "all":
            assert torch.count_nonzero(g) == 0 and torch.count_nonzero(w) == 0, what
        else:
            assert _rel(g, w) <= 1e-5, f"{what}: {_rel(g, w):.3g}"
    if ignored != "all":  # a real loss: about log(V) per target for these random logits
        assert 1.0 < got[0].item() / int((labels != -100).sum()) < 10.0


def test_chunked_bf16_accumulates_in_fp32():
    """bf16 hidden and head: the loss is fp32 and the gradients keep the inputs' dtype; against an
    fp64 reference the chunked gradients are as accurate as the plain loss's."""
    hidden, weight, labels = _inputs(70, 32, 300, seed=3)
    labels[5:20] = -100
    ref = _loss_and_grads(TorchCrossEntropy(), hidden.double(), weight.double(), labels)
    plain = _loss_and_grads(TorchCrossEntropy(), hidden.bfloat16(), weight.bfloat16(), labels)
    chunked = _loss_and_grads(ChunkedCrossEntropy({"chunk_size": 16}), hidden.bfloat16(), weight.bfloat16(), labels)
    assert chunked[0].dtype == torch.float32 and chunked[1].dtype == torch.bfloat16 and chunked[2].dtype == torch.bfloat16
    assert _rel(chunked[0], plain[0]) <= 1e-6  # the same bf16 logits, the fp32 loss summed in another order
    for i in (1, 2):
        assert _rel(chunked[i], ref[i]) <= max(1.5 * _rel(plain[i], ref[i]), 1e-2)


def test_chunked_without_grad_is_loss_only():
    hidden, weight, labels = _inputs(50, 16, 64)
    with torch.no_grad():
        got = ChunkedCrossEntropy({"chunk_size": 7}).linear_cross_entropy_sum(hidden, weight, labels)
    want = TorchCrossEntropy().linear_cross_entropy_sum(hidden, weight, labels)
    assert got.grad_fn is None and _rel(got, want) <= 1e-6
    got2 = ChunkedCrossEntropy({"chunk_size": 7}).linear_cross_entropy_sum(hidden, weight, labels)  # nothing requires grad
    assert got2.grad_fn is None and torch.equal(got2, got)


def test_chunked_rejects_bad_shapes_and_options():
    hidden, weight, labels = _inputs(10, 8, 16)
    with pytest.raises(ValueError, match=r"expected hidden \[N, H\], weight \[V, H\], labels \[N\]"):
        ChunkedCrossEntropy().linear_cross_entropy_sum(hidden.unsqueeze(0), weight, labels)
    reg = Registry.discover()
    with pytest.raises(RegistryError, match="chunk_size"):
        reg.build("kernel", "chunked_cross_entropy", {"chunk_size": 0})
    assert reg.build("kernel", "chunked_cross_entropy", {"chunk_size": 3}).chunk_size == 3
    assert reg.build("kernel", "chunked_cross_entropy").chunk_size == 1024


def _omni(seed=0, **lm_overrides):
    from omnicore.model.omni import OmniModel

    lm = tiny_causal_lm(seed, **lm_overrides).train()
    return OmniModel(lm, {}, {}, {"encoder": {}, "decoder": {}, "decoder_start": {}})


def _omni_batch():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 64, (1, 23), generator=g)
    labels = torch.roll(ids, -1, 1)
    labels[0, -1] = -100
    labels[0, :4] = -100
    pos = torch.cat([torch.arange(12), torch.arange(11)]).unsqueeze(0)
    return ids, labels, pos


def test_omni_model_default_loss_is_bit_identical_to_before():
    """The default text loss equals, bit for bit, what OmniModel computed before kernels: the LM
    head's logits in fp32, then F.cross_entropy(reduction='sum')."""
    model = _omni()
    ids, labels, pos = _omni_batch()
    with torch.no_grad():
        out = model(MicroBatch(ids, labels, pos))
        hidden = model.lm.base_model(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
        logits = model.lm.get_output_embeddings()(hidden).float()
        before = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100, reduction="sum")
        with_logits = model(MicroBatch(ids, labels, pos), return_logits=True)
    assert out.logits is None and with_logits.logits is not None and with_logits.logits.shape == (1, 23, 64)
    assert torch.equal(out.text_loss_sum, before) and torch.equal(with_logits.text_loss_sum, before)


@pytest.mark.parametrize("tied", [False, True])
def test_omni_model_chunked_matches_default_with_tied_embeddings(tied):
    """Through the whole model (tied or separate LM head): loss and every parameter's gradient."""
    base = _omni(tie_word_embeddings=tied)
    assert (base.lm.get_output_embeddings().weight is base.lm.get_input_embeddings().weight) == tied
    chunked = copy.deepcopy(base)
    chunked.cross_entropy = ChunkedCrossEntropy({"chunk_size": 5})
    ids, labels, pos = _omni_batch()
    outs = []
    for m in (base, chunked):
        out = m(MicroBatch(ids, labels, pos))
        out.loss_sum.backward()
        outs.append((out.loss_sum.detach(), {n: p.grad for n, p in m.named_parameters()}))
    assert _rel(outs[1][0], outs[0][0]) <= 1e-6
    assert outs[0][1].keys() == outs[1][1].keys()
    for name, want in outs[0][1].items():
        assert _rel(outs[1][1][name], want) <= 1e-5, name


def test_chunked_gathers_a_dtensor_weight(tmp_path):
    """A head weight that is still a DTensor (sharded, outside FSDP2's unshard) is gathered with
    ``full_tensor()``; its gradient comes back as a DTensor of the same placement."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        hidden, weight, labels = _inputs(19, 8, 30)
        w = distribute_tensor(weight.clone(), mesh, [Shard(0)]).requires_grad_()
        h = hidden.clone().requires_grad_()
        loss = ChunkedCrossEntropy({"chunk_size": 4}).linear_cross_entropy_sum(h, w, labels)
        loss.backward()
        want = _loss_and_grads(TorchCrossEntropy(), hidden, weight, labels)
        assert isinstance(w.grad, DTensor)
        assert _rel(loss, want[0]) <= 1e-6 and _rel(h.grad, want[1]) <= 1e-5 and _rel(w.grad.full_tensor(), want[2]) <= 1e-5
    finally:
        if started:
            dist.destroy_process_group()


# ---- RMSNorm -------------------------------------------------------------------------------------


def test_torch_rms_norm_equals_qwen2_rmsnorm():
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    g = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        norm = Qwen2RMSNorm(48, eps=1e-6).to(dtype)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(48, generator=g) * 0.5 + 1)
        x = (torch.randn(4, 7, 48, generator=g) * 3).to(dtype)
        want = norm(x)
        patched = copy.deepcopy(norm)
        TorchRMSNorm().activate(patched)
        assert type(patched).__name__ == "TorchQwen2RMSNorm" and isinstance(patched, Qwen2RMSNorm)
        got = patched(x)
        assert got.dtype == want.dtype == dtype and _rel(got, want) <= tol, (dtype, _rel(got, want))
        assert patched.state_dict().keys() == norm.state_dict().keys()


def test_torch_rms_norm_on_a_model_keeps_logits_and_grads():
    model = tiny_causal_lm(0)
    with torch.no_grad():
        for m in rms_norm_modules(model):
            m.weight.mul_(torch.rand(m.weight.shape, generator=torch.Generator().manual_seed(1)) + 0.5)
    patched = copy.deepcopy(model)
    TorchRMSNorm().activate(patched)
    assert [type(m).__name__ for m in rms_norm_modules(patched)] == ["TorchQwen2RMSNorm"] * 5  # 2 layers x 2 + final
    ids = torch.tensor([[5, 9, 3, 7, 1, 2, 8, 4, 6, 11]])
    want = model(input_ids=ids).logits
    got = patched(input_ids=ids).logits
    assert _rel(got, want) <= 1e-5
    want.sum().backward()
    got.sum().backward()
    for (n, p), (_, q) in zip(model.named_parameters(), patched.named_parameters()):
        assert _rel(q.grad, p.grad) <= 1e-4, n
    TorchRMSNorm().activate(patched)  # activating twice changes nothing
    assert _rel(patched(input_ids=ids).logits, want) <= 1e-5


def test_torch_rms_norm_refuses_a_different_norm():
    """A Gemma-style ``(1 + weight)`` RMSNorm is not what F.rms_norm computes: refused by name."""

    class FakeGemmaRMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(8))
            self.eps = 1e-6

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    with pytest.raises(ValueError, match="FakeGemmaRMSNorm.forward differs"):
        TorchRMSNorm().activate(torch.nn.Sequential(FakeGemmaRMSNorm()))
    with pytest.raises(ValueError, match="has no RMSNorm modules"):
        TorchRMSNorm().activate(torch.nn.Linear(2, 2))


# ---- contract suites -----------------------------------------------------------------------------


class TestTorchCrossEntropyContract(KernelContract):
    name = "torch_cross_entropy"


class TestChunkedCrossEntropyContract(KernelContract):
    name = "chunked_cross_entropy"
    options = {"chunk_size": 8}


class TestTorchRMSNormContract(KernelContract):
    name = "torch_rms_norm"


# ---- config --------------------------------------------------------------------------------------


def _cfg(**model):
    return Config.model_validate({"data": {"train": "x.jsonl"}, "model": model})


def _load_error(tmp_path, model: dict, overrides=None) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"data": {"train": "x.jsonl"}, "model": model}))
    with pytest.raises(ConfigError) as ei:
        load_config(path, overrides)
    return str(ei.value)


def test_config_kernels_per_op(tmp_path):
    m = _cfg().model
    assert m.kernels == {}
    assert {k: v.name for k, v in m.kernel_choices().items()} == {"attention": "sdpa"}
    m = _cfg(
        kernels={
            "attention": "eager",
            "cross_entropy": {"name": "chunked_cross_entropy", "options": {"chunk_size": 64}},
            "rmsnorm": "torch_rms_norm",
        }
    ).model
    choices = m.kernel_choices()
    assert {k: v.name for k, v in choices.items()} == {
        "attention": "eager",
        "cross_entropy": "chunked_cross_entropy",
        "rmsnorm": "torch_rms_norm",
    }
    assert choices["cross_entropy"].options == {"chunk_size": 64}


def test_config_unknown_op_and_removed_attention_shorthand(tmp_path):
    msg = _load_error(tmp_path, {"kernels": {"rms_norm": "torch_rms_norm"}})
    assert msg == (
        f"{tmp_path / 'c.yaml'}: model.kernels: model.kernels.rms_norm: unknown op; did you mean 'rmsnorm'? "
        "valid ops: attention, rmsnorm, swiglu, cross_entropy"
    )
    msg = _load_error(tmp_path, {}, ["--model.kernels.flux", "x"])
    assert (
        msg
        == "command line (--model.kernels): model.kernels: model.kernels.flux: unknown op; valid ops: attention, rmsnorm, swiglu, cross_entropy"
    )
    # the old shorthand says what model.kernels.attention says: one spelling, and the error names it
    msg = _load_error(tmp_path, {"attention": "eager"})
    assert msg == f"{tmp_path / 'c.yaml'}: model.attention: was removed; use model.kernels.attention"


def test_build_kernels_op_mismatch_and_unknown_name():
    reg = Registry.discover()
    with pytest.raises(RegistryError) as ei:
        build_kernels(_cfg(kernels={"rmsnorm": "chunked_cross_entropy"}).model, reg)
    assert str(ei.value) == "model.kernels.rmsnorm: kernel 'chunked_cross_entropy' implements op 'cross_entropy', not 'rmsnorm'"
    with pytest.raises(RegistryError) as ei:
        build_kernels(_cfg(kernels={"attention": "torch_rms_norm"}).model, reg)
    assert str(ei.value) == "model.kernels.attention: kernel 'torch_rms_norm' implements op 'rmsnorm', not 'attention'"
    with pytest.raises(RegistryError, match=r"^model\.kernels\.swiglu: .*no_such_kernel"):
        build_kernels(_cfg(kernels={"swiglu": "no_such_kernel"}).model, reg)
    built = build_kernels(_cfg(kernels={"cross_entropy": "chunked_cross_entropy", "rmsnorm": "torch_rms_norm"}).model, reg)
    assert {op: type(k).__name__ for op, k in built.items()} == {
        "attention": "SDPAAttention",
        "cross_entropy": "ChunkedCrossEntropy",
        "rmsnorm": "TorchRMSNorm",
    }


def test_build_omni_model_installs_the_kernels(digits_jsonl):
    from omnicore.model.build import build_omni_model

    cfg = tiny_config_dict(str(digits_jsonl / "train.jsonl"), decoders=False)
    cfg["model"]["encoders"] = {}
    cfg["model"]["kernels"] = {
        "cross_entropy": {"name": "chunked_cross_entropy", "options": {"chunk_size": 5}},
        "rmsnorm": "torch_rms_norm",
        "attention": "eager",
    }
    model, _ = build_omni_model(Config.model_validate(cfg))
    assert isinstance(model.cross_entropy, ChunkedCrossEntropy) and model.cross_entropy.chunk_size == 5
    assert {type(m).__name__ for m in rms_norm_modules(model.lm)} == {"TorchQwen2RMSNorm"}
    assert model.lm.config._attn_implementation == "eager"
    default, _ = build_omni_model(Config.model_validate(dict(cfg, model=dict(cfg["model"], kernels={}))))
    assert default.cross_entropy is None and {type(m).__name__ for m in rms_norm_modules(default.lm)} == {"Qwen2RMSNorm"}


@pytest.mark.skipif(not NO_CUDA, reason="on a CUDA machine the liger kernels may be available")
@pytest.mark.parametrize(
    "op, name", [("rmsnorm", "liger_rmsnorm"), ("swiglu", "liger_swiglu"), ("cross_entropy", "liger_fused_linear_cross_entropy")]
)
def test_liger_kernels_unavailable_here_name_the_field(op, name):
    with pytest.raises(RegistryError) as ei:
        build_kernels(_cfg(kernels={op: name}).model, Registry.discover())
    assert str(ei.value) == f"model.kernels.{op}: kernel/{name} from omnicore-kernels-liger is unavailable: {LIGER_REASON}"


# ---- through the command line --------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNICORE_")}
    return dict(env, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def _train(cfg: dict, work: Path) -> subprocess.CompletedProcess:
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return subprocess.run(
        [sys.executable, "-m", "omnicore", "train", "config.yaml"], cwd=work, env=_env(), capture_output=True, text=True, timeout=600
    )


@pytest.mark.cli
def test_training_with_builtin_kernels_matches_default(digits_jsonl, tmp_path):
    """3 steps on one process: chunked cross-entropy (a chunk smaller than every micro-batch) and
    torch_rms_norm give the default run's per-step losses within 1e-5 (relative)."""
    losses, norms = [], []
    for tag, kernels in (
        ("default", None),
        ("kernels", {"cross_entropy": {"name": "chunked_cross_entropy", "options": {"chunk_size": 64}}, "rmsnorm": "torch_rms_norm"}),
    ):
        cfg = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(tmp_path / tag), max_steps=3)
        if kernels:
            cfg["model"]["kernels"] = kernels
        r = _train(cfg, tmp_path / f"w-{tag}")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        rows = [json.loads(line) for line in (tmp_path / tag / "metrics.jsonl").read_text().splitlines()]
        losses.append([r["loss"] for r in rows])
        norms.append([r["grad_norm"] for r in rows])
    want, got = losses
    for a, b in zip(*norms):  # the gradients agree too (they are computed differently)
        assert abs(a - b) <= 1e-5 * abs(a), (a, b)
    assert len(want) == len(got) == 3 and all(x > 0 for x in want)
    for step, (a, b) in enumerate(zip(want, got), 1):
        assert abs(a - b) <= 1e-5 * abs(a), (step, a, b)
    assert want[-1] < want[0]  # it trains


@pytest.mark.cli
@pytest.mark.skipif(not NO_CUDA, reason="on a CUDA machine the kernel may be available")
def test_train_with_liger_cross_entropy_exits_2_before_training(digits_jsonl, tmp_path):
    cfg = tiny_config_dict(str(digits_jsonl / "train.jsonl"), output_dir=str(tmp_path / "run"), max_steps=2)
    cfg["model"]["kernels"] = {"cross_entropy": "liger_fused_linear_cross_entropy"}
    r = _train(cfg, tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: model.kernels.cross_entropy: kernel/liger_fused_linear_cross_entropy from omnicore-kernels-liger is unavailable: {LIGER_REASON}"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
