"""The whole family through omnicore's run path against transformers' ``CsmForConditionalGeneration``
and ``CsmProcessor`` on the same speech (fp32): input ids, the backbone's codebook-0 logits, the
two losses, packing, greedy generation, and training then export.

**Losses.** CSM's loss is ``backbone_loss + depth_decoder_loss``, each a mean: the backbone's over
the frames (codebook 0 from the hidden state before each frame, the audio end frame included), the
depth decoder's over codebooks ``1..K-1`` of those frames. omnicore sums its parts and divides the
total by all targets: part ``audio`` is the backbone's sum (``decoder_targets["audio"]`` = frames),
part ``audio.depth`` the depth decoder's (``(K - 1) x`` frames). So ``backbone_loss = audio /
frames`` and ``depth_decoder_loss = audio.depth / ((K - 1) x frames)``; omnicore's part ``text``
(the fixed head's ``<|end_of_text|>`` and end-of-turn targets) is a constant CSM does not have.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from omnicore.api import load_audio
from omnicore.testing import (
    ChatProcessor,
    Config,
    build_omni_model,
    cli_main,
    collate,
    generate_batch,
    isolated_registry,
    read_jsonl,
    train,
)

IGNORE = -100
CLIPS = {"a.wav": 24000, "b.wav": 11000, "c.wav": 16800}
SAMPLES = [
    [("0", "Hello there.", "a.wav")],
    [("0", "Hi.", "b.wav"), ("1", "How are you?", "c.wav")],
]
"""CSM conversations: per segment ``(speaker, text, clip)``."""


def _rows(samples):
    """omnicore's samples: per segment a user message (``[speaker]text``) and an assistant message (its audio)."""
    for segments in samples:
        messages = []
        for speaker, text, path in segments:
            messages.append({"role": "user", "content": [{"type": "text", "text": f"[{speaker}]{text}"}]})
            messages.append({"role": "assistant", "content": [{"type": "audio", "path": path}]})
        yield {"messages": messages}


def _config(data, out, standin, **train):
    return {
        "run": {"output_dir": str(out), "seed": 0},
        "model": {
            "foundation": {"name": "csm", "options": {"checkpoint": str(standin)}},
            "decoders": {"audio": {"name": "csm_audio", "options": {"checkpoint": str(standin), "max_seconds": 0.5}}},
        },
        "data": {"train": str(data / "train.jsonl"), "max_tokens": 256},
        "train": {"max_steps": 3, "lr": 1e-2, "warmup_steps": 0, "progress": False, **train},
        "generate": {"max_new_tokens": 1},
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory, clip, wav):
    folder = tmp_path_factory.mktemp("data")
    for i, (name, n) in enumerate(CLIPS.items()):
        wav(folder / name, clip(n, seed=i))
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(SAMPLES)))
    return folder


@pytest.fixture(scope="module")
def registry():
    import omnicore_family_csm.plugin as plugin

    return isolated_registry([(plugin, "omnicore-family-csm")], builtins=True)


@pytest.fixture(scope="module")
def run(standin, data, registry):
    """``(model, tokenizer, chat processor, encoded samples)`` built from the two config entries."""
    cfg = Config.model_validate(_config(data, data / "run", standin))
    model, tok = build_omni_model(cfg, registry)
    model.eval()
    proc = ChatProcessor.for_model(tok, model, cfg.data)
    return model, tok, proc, [proc.encode(s) for s in read_jsonl(data / "train.jsonl")]


def _hf_inputs(hf_processor, data, k):
    conversation = [
        {"role": speaker, "content": [{"type": "text", "text": text}, {"type": "audio", "path": load_audio(data / path).samples}]}
        for speaker, text, path in SAMPLES[k]
    ]
    return hf_processor.apply_chat_template(conversation, tokenize=True, return_dict=True, output_labels=True)


def _forward(model, encoded):
    """omnicore's forward on a packed row: its output and the backbone's codebook-0 logits ``[T, C]``."""
    seen = {}
    hook = model.lm.base_model.register_forward_hook(lambda m, args, out: seen.update(hidden=out.last_hidden_state))
    try:
        with torch.no_grad():
            out = model(collate(encoded, model.encoder_processors(), {"audio": model.decoders["audio"].processor}))
            logits = model.decoders["audio"].head(seen["hidden"][0])
    finally:
        hook.remove()
    return out, logits


@pytest.mark.parametrize("k", [0, 1], ids=["one_segment", "two_segments"])
def test_ids_are_the_csm_processors(run, hf_processor, data, k):
    """CsmProcessor's ids, but ``<|AUDIO|>`` where it writes ``<|audio_eos|>`` (the audio end frame's
    position, whose embedding both replace by the frame's) and one ``<|begin_of_text|>`` after the
    last frame (the end of omnicore's assistant turn)."""
    _, tok, _, encoded = run
    want = _hf_inputs(hf_processor, data, k)["input_ids"][0].tolist()
    audio, eos, bos = (tok.convert_tokens_to_ids(t) for t in ("<|AUDIO|>", "<|audio_eos|>", "<|begin_of_text|>"))
    assert encoded[k].input_ids == [audio if i == eos else i for i in want] + [bos]
    trained = [encoded[k].input_ids[i + 1] for i, lab in enumerate(encoded[k].labels) if lab != IGNORE]
    assert trained == [tok.convert_tokens_to_ids("<|end_of_text|>"), bos] * len(SAMPLES[k])  # the text targets


@pytest.mark.parametrize("k", [0, 1], ids=["one_segment", "two_segments"])
def test_logits_and_losses_equal_csm(run, hf_model, hf_processor, data, k):
    model, _, _, encoded = run
    inputs = _hf_inputs(hf_processor, data, k)
    with torch.no_grad():
        want = hf_model(**inputs)
    out, logits = _forward(model, [encoded[k]])
    t = inputs["input_ids"].shape[1]
    torch.testing.assert_close(logits[:t], want.logits[0], rtol=1e-5, atol=1e-5)
    frames = int((inputs["labels"][0] != IGNORE).sum())  # every <|AUDIO|> and <|audio_eos|> position
    assert out.decoder_targets == {"audio": frames, "audio.depth": 3 * frames}
    backbone = out.decoder_loss_sums["audio"] / frames
    depth = out.decoder_loss_sums["audio.depth"] / (3 * frames)
    torch.testing.assert_close(backbone, want.backbone_loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(depth, want.depth_decoder_loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(backbone + depth, want.loss, rtol=1e-5, atol=0)
    text_targets = 2 * len(SAMPLES[k])
    assert out.n_targets == text_targets + 4 * frames
    torch.testing.assert_close(out.text_loss_sum, torch.tensor(30.0 * len(SAMPLES[k])), rtol=1e-5, atol=1e-4)  # the fixed head's constant


def test_packed_row_equals_each_sample_alone(run):
    model, _, _, encoded = run
    out, packed = _forward(model, encoded)
    start, sums = 0, torch.zeros(())
    for e in encoded:
        alone_out, alone = _forward(model, [e])
        torch.testing.assert_close(packed[start : start + len(e)], alone, rtol=1e-5, atol=1e-5)
        sums = sums + alone_out.decoder_loss_sums["audio"]
        start += len(e)
    torch.testing.assert_close(out.decoder_loss_sums["audio"], sums, rtol=1e-5, atol=0)


def _greedy(model, tok, proc, texts):
    """omnicore's greedy generation of ``texts`` (``[speaker]text``): each row's frames ``[n, K]``
    (captured as the decoder decodes them) and its outputs."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "prompts.jsonl"
        file.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts))
        prompts = [proc.encode(s, prompt_only=True) for s in read_jsonl(file)]
    dec = model.decoders["audio"]
    frames, decode = [], dec.decode
    dec.decode = lambda codes: frames.append(codes.clone()) or decode(codes)
    try:
        outs = generate_batch(model, tok, prompts, max_new_tokens=1, stop_id=proc.end_of_turn_id)
    finally:
        del dec.decode
    return prompts, frames, outs


def _assert_teacher_forcing(model, prompt, codes):
    """Fed back after the prompt and ``<|end_of_text|>``, each frame is the argmax of the head
    (codebook 0) and of the depth decoder (codebooks 1..K-1) at its position."""
    dec, n = model.decoders["audio"], codes.shape[0]
    start, audio = model.token_ids["decoder_start"]["audio"], model.token_ids["decoder"]["audio"]
    ids = torch.tensor([prompt.input_ids + [start] + [audio] * n])
    with torch.no_grad():
        emb = model.lm.get_input_embeddings()(ids).clone()
        emb[0, -n:] = dec.embed(codes)
        hidden = model.lm.base_model(inputs_embeds=emb, position_ids=torch.arange(ids.shape[1])[None]).last_hidden_state[0]
        h = hidden[-n - 1 : -1]
        assert torch.equal(dec.head(h).argmax(-1), codes[:, 0])
        assert torch.equal(dec.depth_logits(h, codes).argmax(-1), codes[:, 1:])


def test_greedy_generation_equals_csm_generate_and_teacher_forcing(run, hf_model, hf_processor):
    """Two prompts in one batch: the fixed head writes ``<|end_of_text|>``, then each row's 8 frames
    (0.5 s and the end frame) are those of ``CsmForConditionalGeneration.generate`` (greedy backbone
    and depth decoder) from CsmProcessor's prompt, and their own teacher-forced argmax."""
    model, tok, proc, _ = run
    texts = [("0", "Hello there."), ("1", "Fine, thanks!")]
    prompts, frames, outs = _greedy(model, tok, proc, [f"[{s}]{t}" for s, t in texts])
    eot = tok.convert_tokens_to_ids("<|end_of_text|>")
    assert [o["token_ids"] for o in outs] == [[eot], [eot]] and [f.shape for f in frames] == [(8, 4), (8, 4)]
    for (speaker, text), prompt, codes in zip(texts, prompts, frames):
        conversation = [{"role": speaker, "content": [{"type": "text", "text": text}]}]
        inputs = hf_processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        assert inputs["input_ids"][0].tolist() == prompt.input_ids + [eot]
        with torch.no_grad():
            want = hf_model.generate(**inputs, do_sample=False, depth_decoder_do_sample=False, max_new_tokens=8)
        want = want if isinstance(want, torch.Tensor) else want.sequences
        n = want.shape[1]  # CSM stops after an audio end frame; omnicore writes its 8
        assert torch.equal(codes[:n], want[0]) and len({tuple(f) for f in codes.tolist()}) > 2
        _assert_teacher_forcing(model, prompt, codes)


def test_train_export_generate(standin, data, registry, hf_model, hf_processor, tmp_path):
    """Three AdamW steps through omnicore's run path, exported: ``CsmForConditionalGeneration`` reads
    the export with the codebook-0 logits and losses of omnicore's model rebuilt from the export's
    ``omnicore.yaml``; the backbone, text embedding, head and depth decoder moved, the Mimi codec is
    the checkpoint's, bit for bit; ``omnicore generate`` then writes a WAV of Mimi's decoding of
    frames that are their own teacher-forced argmax."""
    from safetensors import safe_open
    from transformers import AutoProcessor, CsmForConditionalGeneration

    rows = train(Config.model_validate(_config(data, tmp_path / "run", standin)), registry=registry)
    assert len(rows) == 3 and all(np.isfinite(r["loss"]) for r in rows)
    export = tmp_path / "run" / "export"
    back = CsmForConditionalGeneration.from_pretrained(export, dtype=torch.float32).eval()
    proc = AutoProcessor.from_pretrained(export)
    assert proc.chat_template == hf_processor.chat_template and proc.tokenizer.eos_token == "<|end_of_text|>"
    with safe_open(str(export / "model.safetensors"), "pt") as f, safe_open(str(standin / "model.safetensors"), "pt") as g:
        assert set(f.keys()) == set(g.keys())
        moved = {k.split(".")[0] for k in f.keys() if not torch.equal(f.get_tensor(k), g.get_tensor(k))}
        assert moved == {"embed_text_tokens", "backbone_model", "lm_head", "depth_decoder"}  # codec_model unchanged
    section = yaml.safe_load((export / "omnicore.yaml").read_text())["model"]
    cfg = Config.model_validate({**_config(data, tmp_path / "again", standin), "model": section})
    cfg.source = str(export / "omnicore.yaml")
    model, tok = build_omni_model(cfg, registry)
    model.eval()
    chat = ChatProcessor.for_model(tok, model, cfg.data)
    encoded = [chat.encode(s) for s in read_jsonl(data / "train.jsonl")]
    for k in (0, 1):
        inputs = _hf_inputs(proc, data, k)
        with torch.no_grad():
            want = back(**inputs)
            old = hf_model(**inputs)
        out, logits = _forward(model, [encoded[k]])
        t = inputs["input_ids"].shape[1]
        torch.testing.assert_close(logits[:t], want.logits[0], rtol=1e-5, atol=1e-5)
        frames = out.decoder_targets["audio"]
        torch.testing.assert_close(out.decoder_loss_sums["audio"] / frames, want.backbone_loss, rtol=1e-5, atol=0)
        torch.testing.assert_close(out.decoder_loss_sums["audio.depth"] / (3 * frames), want.depth_decoder_loss, rtol=1e-5, atol=0)
        assert float(want.loss) < float(old.loss)  # three steps on these very samples lowered CSM's own loss
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(_config(data, tmp_path / "run", standin)))
    prompts, frames, _ = _greedy(model, tok, chat, ["[0]Hello there."])
    _assert_teacher_forcing(model, prompts[0], frames[0])
    argv = ["generate", str(tmp_path / "gen.yaml"), "--export", str(export), "--prompt", "[0]Hello there.", "--out", str(tmp_path / "gen")]
    assert cli_main(argv) == 0
    wav = load_audio(tmp_path / "gen" / "generated-audio-0.wav")
    want_wave = model.decoders["audio"].decode(frames[0]).samples
    assert wav.sample_rate == 24000 and len(wav.samples) == len(want_wave) > 0
    np.testing.assert_allclose(wav.samples, want_wave, rtol=0, atol=1.0 / 16384)  # 16-bit PCM
