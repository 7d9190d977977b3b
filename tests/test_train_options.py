"""Training options (activation checkpointing, torch.compile of blocks, bf16 mixed precision) and the
throughput metrics (model FLOPs, MFU, padding waste, peak memory).

Each option is compared with the plain run: checkpointing and compile must not change the numbers;
bf16 must change them a little (it really computes in bf16) and keep parameters in fp32.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import TINY_LM, tiny_config_dict

from omnicore.config import Config
from omnicore.data.packing import MicroBatch
from omnicore.parallel.checkpointing import ActivationCheckpointing
from omnicore.parallel.compile import CompileBlocks
from omnicore.train.metrics import flops_model, padding_waste


def _model():
    from transformers import AutoConfig, AutoModelForCausalLM

    from omnicore.model.omni import OmniModel

    torch.manual_seed(0)
    kw = dict(TINY_LM, num_hidden_layers=4, vocab_size=64)
    lm = AutoModelForCausalLM.from_config(AutoConfig.for_model(kw.pop("model_type"), **kw))
    return OmniModel(lm, {}, {}, {"encoder": {}, "decoder": {}, "decoder_start": {}})


def _batch(lengths=(40, 7, 25)):
    g = torch.Generator().manual_seed(1)
    t = sum(lengths)
    ids = torch.randint(0, 64, (1, t), generator=g)
    labels = torch.randint(0, 64, (1, t), generator=g)
    labels[0, ::5] = -100
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return MicroBatch(ids, labels, pos)


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(batch)
    out.loss_sum.backward()
    return float(out.loss_sum.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _saved_bytes(model, batch) -> int:
    """Bytes of the tensors autograd keeps for backward during one forward."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(batch)
    out.loss_sum.backward()
    return total


def _backward_op_counts(model, batch) -> dict[str, int]:
    """How often each aten op runs during backward (recomputation shows up here)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    out = model(batch)
    with Count():
        out.loss_sum.backward()
    return counts


def _ac(mode, every=2):
    return ActivationCheckpointing({"mode": mode, "every": every}).apply(_model(), None)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "selective", "op"])
def test_activation_checkpointing_same_numbers(mode):
    batch = _batch()
    ref_loss, ref_grads = _loss_and_grads(_model(), batch)
    loss, grads = _loss_and_grads(_ac(mode), batch)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert grads.keys() == ref_grads.keys()
    for n, g in grads.items():
        assert torch.allclose(g, ref_grads[n], rtol=1e-5, atol=1e-7), n


@pytest.mark.slow
def test_activation_checkpointing_saves_less_and_recomputes_what_the_policy_says():
    batch = _batch()
    # full keeps only block inputs; selective (every 2nd of 4 blocks) keeps half the blocks' activations
    none, full, sel = (_saved_bytes(m, batch) for m in (_model(), _ac("full"), _ac("selective")))
    assert full < sel < none
    # recomputation: full re-runs each block's matmuls in backward, op (selective per operator)
    # keeps matmul outputs and re-runs only the cheap ops around them
    c_none, c_full, c_op = (_backward_op_counts(m, batch) for m in (_model(), _ac("full"), _ac("op")))
    mm = lambda c: c["mm"] + c["addmm"] + c["bmm"]  # noqa: E731
    assert mm(c_full) > mm(c_none)
    assert mm(c_op) == mm(c_none)
    assert c_op["silu"] > c_none["silu"]  # the MLP activation is recomputed


def test_checkpointing_is_skipped_in_eval_and_no_grad():
    model = ActivationCheckpointing({"mode": "full"}).apply(_model(), None)
    batch = _batch()
    model.eval()
    with torch.no_grad():
        a = model(batch, return_logits=True).logits
    plain = _model().eval()
    with torch.no_grad():
        b = plain(batch, return_logits=True).logits
    assert torch.equal(a, b)


@pytest.mark.slow
def test_compile_blocks_same_numbers():
    # aot_eager traces forward and backward through dynamo and AOTAutograd without codegen (fast on CPU)
    batch = _batch()
    ref_loss, ref_grads = _loss_and_grads(_model(), batch)
    compiled = CompileBlocks({"backend": "aot_eager"}).apply(_model(), None)
    assert type(compiled.blocks()[0]).__name__ == "Qwen2DecoderLayer"  # compiled in place: FSDP2 still finds blocks
    loss, grads = _loss_and_grads(compiled, batch)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for n, g in grads.items():
        assert torch.allclose(g, ref_grads[n], rtol=1e-4, atol=1e-6), n


def test_flops_model_counts_matmul_weights_and_per_sample_attention():
    model = _model()
    fm = flops_model(model.lm)
    cfg = model.lm.config
    h, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    hd = h // cfg.num_attention_heads
    kv = cfg.num_key_value_heads * hd
    # per block: q and o (h*h), k and v (h*kv) with biases on q/k/v, the MLP (3*h*i), two norms
    per_block = 2 * h * h + 2 * h * kv + h + 2 * kv + 3 * h * i + 2 * h
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * h
    expected_n = L * per_block + h + head + (cfg.vocab_size * h if cfg.tie_word_embeddings else 0)
    assert fm.matmul_params == expected_n
    assert fm.layers == L and fm.attn_dim == h
    # two samples of 3 and 5 tokens: 6 N 8 + 12 L d (9 + 25); a row of one 8-token sample costs more
    assert fm.step_flops([3, 5]) == 6 * expected_n * 8 + 12 * L * h * 34
    assert fm.step_flops([8]) - fm.step_flops([3, 5]) == 12 * L * h * (64 - 34)


def test_padding_waste():
    assert padding_waste(900, 1, 1000) == pytest.approx(0.1)
    assert padding_waste(4000, 4, 1000) == 0.0
    assert padding_waste(0, 0, 1000) == 0.0


def _train(cfg_dict, tmp_path, name):
    from omnicore.train.loop import train

    d = copy.deepcopy(cfg_dict)
    d["run"]["output_dir"] = str(tmp_path / name)
    cfg = Config.model_validate(d)
    cfg.source = str(tmp_path / "config.yaml")
    return train(cfg)


@pytest.fixture(scope="module")
def text_cfg(text_jsonl):
    d = tiny_config_dict(str(text_jsonl), decoders=False, max_steps=3)
    d["model"]["encoders"] = {}
    return d


@pytest.fixture(scope="module")
def text_jsonl(digits_jsonl):
    import json

    lines = []
    for i in range(40):
        q = "Say the number " + " ".join(str((i * 7 + k) % 10) for k in range(1 + i % 9))
        lines.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(i % 10) * (1 + i % 5)}]})
    path = digits_jsonl / "text.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.slow
def test_train_metrics_and_options(text_jsonl, text_cfg, tmp_path):
    base = _train(text_cfg, tmp_path, "base")
    for row in base:
        assert row["tflops"] > 0 and row["mfu"] is None  # CPU: no known peak
        assert 0.0 <= row["padding_waste"] < 1.0
        assert row["padding_waste"] == pytest.approx(1 - row["tokens"] / 512)
        assert row["peak_mem_mib"] > 50
    # a configured peak gives MFU = achieved / peak
    peak = _train({**text_cfg, "train": {**text_cfg["train"], "peak_tflops": 0.5}}, tmp_path, "peak")
    assert all(r["mfu"] == pytest.approx(r["tflops"] / 0.5) for r in peak)

    ac = _train(
        {**text_cfg, "parallel": {"strategies": [{"name": "activation_checkpointing", "options": {"mode": "full"}}]}}, tmp_path, "ac"
    )
    assert [r["loss"] for r in ac] == pytest.approx([r["loss"] for r in base], rel=1e-6)

    bf16 = _train({**text_cfg, "train": {**text_cfg["train"], "mixed_precision": "bf16"}}, tmp_path, "bf16")
    diffs = [abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(bf16, base)]
    assert max(diffs) < 2e-2  # close to fp32 ...
    assert max(diffs) > 1e-6  # ... but really computed in bf16


@pytest.mark.slow
def test_a_part_without_targets_is_left_out_of_the_row(text_jsonl, tmp_path):
    """Text-only data with an image decoder configured: no step has image targets, so no row carries
    loss/decoder.image (it used to read 0.0), and the text part is the whole loss."""
    d = tiny_config_dict(str(text_jsonl), max_steps=2)
    d["model"]["encoders"] = {}
    rows = _train(d, tmp_path, "no-images")
    assert len(rows) == 2 and all("loss/decoder.image" not in r for r in rows)
    assert all(r["loss/text"] == pytest.approx(r["loss"], rel=1e-9) for r in rows)
    written = [json.loads(line) for line in (tmp_path / "no-images" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in written] == [1, 2] and all("loss/decoder.image" not in r for r in written)


def test_bf16_autocast_computes_in_bf16_keeps_fp32_params():
    model = _model()
    seen = []
    model.lm.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(_batch())
    assert seen == [torch.bfloat16]
    assert out.loss_sum.dtype == torch.float32
    out.loss_sum.backward()
    assert all(p.dtype == torch.float32 and (p.grad is None or p.grad.dtype == torch.float32) for p in model.parameters())


@pytest.mark.multiprocess
def test_fsdp2_two_processes_with_checkpointing_and_bf16():
    """Through parallelize() on 2 gloo processes (tests/test_hsdp.py's harness): FSDP2 with full
    activation checkpointing equals one process without; FSDP2 bf16 (MixedPrecisionPolicy) runs
    block weights in bf16, keeps fp32 parameters, and stays close to one-process bf16 autocast."""
    from test_hsdp import train_steps

    from omnicore.testing.distributed import max_rel_diff, run_distributed

    ref = train_steps({"dp_shard": -1})
    ref_bf16 = train_steps({"dp_shard": -1}, {"mixed_precision": "bf16"})
    assert ref["forward_dtypes"] == ["torch.float32"] and ref_bf16["param_dtypes"] == ["torch.float32"]
    for r in run_distributed(
        train_steps, 2, args=({"dp_shard": -1, "strategies": [{"name": "activation_checkpointing", "options": {"mode": "full"}}, "fsdp2"]},)
    ):
        assert max(abs(a - b) / b for a, b in zip(r["losses"], ref["losses"])) <= 1e-5
        assert max_rel_diff(r["grads"], ref["grads"]) <= 1e-4
    for r in run_distributed(train_steps, 2, args=({"dp_shard": -1, "strategies": ["fsdp2"]}, {"mixed_precision": "bf16"})):
        assert r["forward_dtypes"] == ["torch.bfloat16"]  # FSDP2 gathered bf16 parameters
        assert r["param_dtypes"] == ["torch.float32"]  # the sharded parameters (and AdamW) stay fp32
        assert max(abs(a - b) / b for a, b in zip(r["losses"], ref_bf16["losses"])) <= 1e-2
        assert max(abs(a - b) / b for a, b in zip(r["losses"], ref["losses"])) <= 2e-2


from omnicore.testing import ParallelStrategyContract  # noqa: E402


class TestActivationCheckpointingContract(ParallelStrategyContract):
    name = "activation_checkpointing"
    options = {"mode": "op"}


@pytest.mark.slow
class TestCompileContract(ParallelStrategyContract):
    name = "compile"
    options = {"backend": "eager"}  # dynamo capture without codegen: fast, and exact


@pytest.mark.slow
def test_bf16_trains_the_omni_modal_model(digits_jsonl, tmp_path):
    """bf16 with every encoder and decoder, including the dummy passes of modalities a micro-batch
    lacks (their feature extraction must not run under autocast): losses close to fp32."""
    no_audio = tmp_path / "no_audio.jsonl"  # every micro-batch lacks audio: the whisper dummy pass runs
    lines = (digits_jsonl / "train.jsonl").read_text().splitlines()
    no_audio.write_text("".join(x + "\n" for x in lines if '"audio"' not in x).replace('"images/', f'"{digits_jsonl}/images/'))
    d = tiny_config_dict(str(no_audio), max_steps=2)
    fp32 = _train(d, tmp_path, "fp32")
    bf16 = _train({**d, "train": {**d["train"], "mixed_precision": "bf16"}}, tmp_path, "bf16")
    assert [r["loss"] for r in bf16] == pytest.approx([r["loss"] for r in fp32], rel=2e-2)


def test_a_misspelt_strategy_option_fails_before_the_model_is_built(text_jsonl, tmp_path, monkeypatch):
    """Strategy options are validated before the (slow) model build: the error names the option,
    and the foundation is never built."""
    import omnicore.model.build
    from omnicore.registry import RegistryError
    from omnicore.train.loop import train

    d = tiny_config_dict(str(text_jsonl), output_dir=str(tmp_path / "run"), max_steps=1)
    d["parallel"] = {"strategies": [{"name": "activation_checkpointing", "options": {"mdoe": "full"}}]}
    built = []
    real = omnicore.model.build.build_omni_model
    monkeypatch.setattr(omnicore.model.build, "build_omni_model", lambda *a, **k: built.append(1) or real(*a, **k))
    with pytest.raises(RegistryError, match=r"options of parallel/activation_checkpointing: mdoe: unknown key; did you mean 'mode'\?"):
        train(Config.model_validate(d))
    assert built == []
    d["parallel"]["strategies"][0]["options"] = {"mode": "full"}  # spelt right: the same path builds it
    train(Config.model_validate(d))
    assert built == [1]


def test_throughput_summary_names_the_steps_it_took_the_medians_over():
    from omnicore.train.loop import summarize

    def row(step, tps, ms):
        return {
            "step": step,
            "tokens_per_s": tps,
            "step_time_s": ms / 1e3,
            "tflops": 1.0,
            "mfu": None,
            "padding_waste": 0.1,
            "peak_mem_mib": 10 * step,
        }

    many = summarize([row(1, 5, 900), row(2, 100, 20), row(3, 300, 10), row(4, 200, 30)])
    assert many.startswith("throughput (median over steps 2..4): 200 tokens/s, 20.0 ms/step") and "peak memory 40 MiB" in many
    one = summarize([row(1, 5, 900)])
    assert one.startswith("throughput (step 1, warm-up included): 5 tokens/s, 900.0 ms/step")
