"""Several codebooks per frame: one LM position a frame, a depth decoder for codebooks 1..K-1.

A tiny omni model speaks through EnCodec with ``codebooks: depth`` (2 codebooks of 16 entries, 100
frames/s). Checked against computations made another way: the model's decoder losses against
transformers' own ``CsmDepthDecoderForCausalLM`` loss frame by frame, greedy generation against
teacher forcing of the codes it generated, and the code cache against encoding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import DIGITS, tiny_config_dict

from omnicore.config import Config
from omnicore.data.chat import ChatProcessor
from omnicore.data.jsonl import parse_line
from omnicore.data.packing import collate
from omnicore.model.build import build_omni_model
from omnicore.model.code_cache import CodeCache
from omnicore.model.generation import generate_batch

FSDD = DIGITS / "raw" / "fsdd" / "recordings"
TINY_CODEC = {"num_filters": 4, "hidden_size": 8, "codebook_size": 16, "upsampling_ratios": [8, 5, 4], "num_quantizers": 2}
SECONDS = 0.2  # 20 frames at 100 frames/s


def _say(digit: int, take: int) -> str:
    import json

    wav = FSDD / f"{digit}_jackson_{take}.wav"
    return json.dumps(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": f"Say the digit {digit}."}]},
                {"role": "assistant", "content": [{"type": "audio", "path": str(wav)}]},
            ]
        }
    )


@pytest.fixture(scope="module")
def built(digits_jsonl):
    raw = tiny_config_dict(str(digits_jsonl / "train.jsonl"), decoders=False)
    raw["model"]["decoders"] = {
        "audio": {
            "name": "encodec",
            "options": {
                "config": dict(TINY_CODEC),
                "max_seconds": SECONDS,
                "long_audio": "crop",
                "codebooks": "depth",
                "depth": {"layers": 1, "hidden_size": 16, "heads": 2},
            },
        }
    }
    cfg = Config.model_validate(raw)
    torch.manual_seed(0)
    model, tok = build_omni_model(cfg)
    model.eval()
    return model, tok, ChatProcessor.for_model(tok, model, cfg.data)


def _samples(proc, digits=(3, 7)):
    return [proc.encode(parse_line(_say(d, 10 + d), "say.jsonl", i + 1)) for i, d in enumerate(digits)]


def test_one_position_per_frame(built):
    """A 0.2 s clip is 20 placeholders (one per frame), and its codes are ``[20, 2]``."""
    model, _, proc = built
    dec = model.decoders["audio"]
    enc = _samples(proc)[0]
    feats = [f for side, m, f in enc.media if side == "decoder"]
    assert dec.num_codebooks == 2 and dec.codebook_size == 16
    assert sum(t == model.token_ids["decoder"]["audio"] for t in enc.input_ids) == 20 == proc.decoders["audio"].num_tokens(feats[0])
    codes = dec.encode(proc.decoders["audio"].collate(feats))
    assert tuple(codes.shape) == (20, 2)


def test_losses_equal_transformers_depth_decoder_frame_by_frame(built):
    """The model's ``audio`` part is codebook 0's cross-entropy from the LM's hidden states, and its
    ``audio.depth`` part equals the sum over frames of ``CsmDepthDecoderForCausalLM``'s own loss (a
    mean over the frame's K - 1 codebooks) run on each frame alone; the text part is unchanged."""
    model, tok, proc = built
    dec = model.decoders["audio"]
    encs = _samples(proc)
    mb = collate(encs, proc.encoders, proc.decoders)
    with torch.no_grad():
        out = model(mb)
        codes = dec.encode(mb.decoder_inputs["audio"])  # [40, 2]
        ids = mb.input_ids
        emb = model.lm.get_input_embeddings()(ids).clone()
        where = (ids[0] == model.token_ids["decoder"]["audio"]).nonzero()[:, 0]
        emb[0, where] = dec.code_embed(codes[:, 0]) + dec.code_embed(codes[:, 1] + 16)
        hidden = model.lm.base_model(inputs_embeds=emb, position_ids=mb.position_ids, use_cache=False).last_hidden_state[0]
        h = hidden[where - 1]
        want0 = F.cross_entropy(dec.lm_head(h), codes[:, 0], reduction="sum")
        want_depth = sum(
            float(
                dec.depth_decoder(
                    input_ids=F.pad(codes[i : i + 1, :1], (1, 0)), backbone_last_hidden_state=h[i : i + 1], labels=codes[i : i + 1]
                ).loss
            )
            for i in range(codes.shape[0])
        )
    assert codes.shape == (40, 2)
    assert float(out.decoder_loss_sums["audio"]) == pytest.approx(float(want0), rel=1e-5)
    assert float(out.decoder_loss_sums["audio.depth"]) == pytest.approx(want_depth, rel=1e-5)
    assert out.decoder_targets == {"audio": 40, "audio.depth": 40}
    assert float(out.loss_sum) == pytest.approx(float(out.text_loss_sum) + float(want0) + want_depth, rel=1e-5)
    # random heads over 16 entries score about log(16) per code
    assert float(want0) / 40 == pytest.approx(torch.log(torch.tensor(16.0)).item(), rel=0.25)


def test_greedy_generation_equals_teacher_forcing(built, monkeypatch):
    """Two prompts forced into speech (the audio-start logit set high) generate 20 frames each, greedily;
    fed back as targets, the codes are the argmax of the LM head (codebook 0) and of the depth
    decoder (codebook 1) at every frame."""
    model, tok, proc = built
    dec = model.decoders["audio"]
    prompts = [proc.encode(parse_line(_say(d, 10 + d), "say.jsonl", 1), prompt_only=True) for d in (3, 7)]
    spoken: list[torch.Tensor] = []
    decode = dec.decode
    monkeypatch.setattr(dec, "decode", lambda codes: spoken.append(codes.clone()) or decode(codes))
    start = model.token_ids["decoder_start"]["audio"]
    force = model.lm.get_output_embeddings().register_forward_hook(lambda m, i, o: o.index_fill(-1, torch.tensor([start]), 1e4))
    try:
        outs = generate_batch(model, tok, prompts, max_new_tokens=1)
    finally:
        force.remove()
    assert [o["token_ids"] for o in outs] == [[start], [start]]
    assert len(spoken) == 2 and all(tuple(c.shape) == (20, 2) for c in spoken)
    assert len({tuple(f) for f in spoken[0].tolist()}) > 2  # frames differ: the check is not of one repeated frame
    for p, codes in zip(prompts, spoken):
        ids = torch.tensor([p.input_ids + [start] + [model.token_ids["decoder"]["audio"]] * 20])
        with torch.no_grad():
            emb = model.lm.get_input_embeddings()(ids).clone()
            emb[0, -20:] = dec.embed(codes)
            hidden = model.lm.base_model(
                inputs_embeds=emb, position_ids=torch.arange(ids.shape[1])[None], use_cache=False
            ).last_hidden_state[0]
            h = hidden[-21:-1]
            assert torch.equal(dec.head(h).argmax(-1), codes[:, 0])
            assert torch.equal(dec.depth_logits(h, codes).argmax(-1), codes[:, 1:])


def test_cached_frames_give_the_losses_of_encoding(built):
    """The code cache keeps ``[frames, K]`` codes per target: a second pass encodes nothing and gives
    exactly the losses of encoding."""
    model, _, proc = built
    encs = _samples(proc)
    dec = model.decoders["audio"]
    with torch.no_grad():
        plain = model(collate(encs, proc.encoders, proc.decoders, decoder_keys=True))
        model.code_cache = CodeCache(1 << 20)
        try:
            model(collate(encs, proc.encoders, proc.decoders, decoder_keys=True))
            calls = []
            orig = dec.encode
            dec.encode = lambda batch: calls.append(1) or orig(batch)
            try:
                cached = model(collate(encs, proc.encoders, proc.decoders, decoder_keys=True))
            finally:
                del dec.encode
            assert calls == [] and model.code_cache.hits == 2
        finally:
            model.code_cache = None
    assert float(cached.loss_sum) == float(plain.loss_sum)
    assert {k: float(v) for k, v in cached.decoder_loss_sums.items()} == {k: float(v) for k, v in plain.decoder_loss_sums.items()}


def test_code_cache_round_trips_frames():
    """``store`` of ``[5, 3]`` codes for items of 2 and 3 frames, ``lookup`` with width 3 gives them
    back; a lookup with another width misses."""
    cache = CodeCache(1 << 16)
    codes = torch.arange(15).reshape(5, 3) * 100
    keys = [("a", 2), ("b", 3)]
    assert cache.store("audio", keys, codes)
    assert torch.equal(cache.lookup("audio", keys, width=3), codes)
    assert torch.equal(cache.lookup("audio", [("b", 3)], width=3), codes[2:])
    assert cache.lookup("audio", keys, width=2) is None


def test_a_batch_without_speech_gives_every_decoder_parameter_a_zero_gradient(built):
    """On a micro-batch with no spoken answer the audio decoder's trainable parameters (its code
    embedding, codebook-0 head and the whole depth decoder) still get gradients, all exactly zero, so
    FSDP2 reduces the same tensors on every rank; and the loss is the text loss alone."""
    import json

    model, _, proc = built
    line = json.dumps({"messages": [{"role": "user", "content": "Say the digit 3."}, {"role": "assistant", "content": "three"}]})
    mb = collate([proc.encode(parse_line(line, "text.jsonl", 1))], proc.encoders, proc.decoders)
    model.zero_grad(set_to_none=True)
    out = model(mb)
    out.loss_sum.backward()
    dec = model.decoders["audio"]
    params = {n: p for n, p in dec.named_parameters() if p.requires_grad}
    assert any(n.startswith("depth_decoder.") for n in params)
    missing = [n for n, p in params.items() if p.grad is None]
    assert not missing
    assert all(float(p.grad.abs().max()) == 0.0 for p in params.values())
    assert float(out.loss_sum) == float(out.text_loss_sum)
    assert out.decoder_loss_sums == {}
    model.zero_grad(set_to_none=True)
