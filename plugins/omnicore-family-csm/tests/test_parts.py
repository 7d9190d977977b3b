"""The family's parts alone against transformers' own CSM classes on the same inputs (fp32): the
processor's frame counts and features, the decoder's codes, embeddings, depth logits and decoded
audio, the foundation's backbone, and the checks that name a bad checkpoint."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from omnicore.api import Audio, LoadError, fill_now, resample
from omnicore_family_csm.decoder import build as build_decoder
from omnicore_family_csm.foundation import CsmFoundation
from omnicore_family_csm.processor import WHAT_TO_PUT, build_processor

# samples at 24 kHz around Mimi's 1920-sample frames: one sample, a frame either side, 1 s, odd lengths
LENGTHS = [1, 1919, 1920, 1921, 3840, 5000, 11519, 24000, 24001, 30000]


@pytest.fixture(scope="module")
def decoder(standin):
    return build_decoder({"checkpoint": str(standin), "max_seconds": 0.5}, hidden_size=32).eval()


def _codes(hf_model, samples):
    with torch.no_grad():
        return hf_model.codec_model.encode(torch.as_tensor(samples).reshape(1, 1, -1)).audio_codes[0].t()


def test_frame_counts_equal_mimi_and_the_csm_processor(standin, hf_model, hf_processor, clip):
    proc = build_processor({"checkpoint": str(standin)})
    audio_id = hf_processor.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    for i, n in enumerate(LENGTHS):
        wave = clip(n, seed=i)
        ref = hf_processor(text="[0]x<|AUDIO|><|audio_eos|>", audio=[wave], return_tensors="pt")
        want = int((ref["input_ids"][0] == audio_id).sum())
        assert proc.frames(n) == want == int(hf_model.codec_model.get_encoded_length(torch.tensor(n))), f"{n} samples"
        feats = proc.preprocess(Audio(samples=wave, sample_rate=24000))
        assert torch.equal(feats["input_values"], ref["input_values"][0, 0]), f"{n} samples"
        assert proc.num_tokens(feats) == want + 1  # and the audio end frame
    assert proc.start == "<|end_of_text|>" and proc.placeholder == "<|AUDIO|>" and proc.codes_per_token == 4


def test_other_rates_are_resampled_to_the_codec_rate(standin, clip):
    media = Audio(samples=clip(9000, seed=5), sample_rate=16000)
    feats = build_processor({"checkpoint": str(standin)}).preprocess(media)
    assert torch.equal(feats["input_values"], torch.from_numpy(resample(media, 24000).samples))


def test_encode_is_mimi_encode_then_the_audio_end_frame(decoder, hf_model, clip):
    clips = [clip(n, seed=i) for i, n in enumerate([24000, 5000, 1921])]
    proc = decoder.processor
    feats = [proc.preprocess(Audio(samples=c, sample_rate=24000)) for c in clips]
    with torch.no_grad():
        got = decoder.encode(proc.collate(feats))
    want = [torch.cat([_codes(hf_model, c), torch.zeros(1, 4, dtype=torch.long)]) for c in clips]
    assert torch.equal(got, torch.cat(want))
    assert sum(proc.num_tokens(f) for f in feats) == got.shape[0] == 13 + 3 + 2 + 3
    assert len({tuple(r) for r in got.tolist()}) > 5  # the stand-in's codec gives varied frames


def test_decoder_holds_the_checkpoint_tensors_with_the_audio_embedding_tied(decoder, hf_model):
    assert torch.equal(decoder.code_embed.weight, hf_model.backbone_model.embed_tokens.embed_audio_tokens.weight)
    assert torch.equal(decoder.lm_head.weight, hf_model.lm_head.weight) and decoder.lm_head.bias is None
    for part, ref in ((decoder.depth_decoder, hf_model.depth_decoder), (decoder.codec, hf_model.codec_model)):
        mine, theirs = part.state_dict(), ref.state_dict()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), "a depth decoder or codec tensor differs"
    assert decoder.depth_decoder.model.embed_tokens.weight is decoder.code_embed.weight  # one tensor, as CSM ties them
    names = [n for n, _ in decoder.named_parameters()]
    assert "code_embed.weight" in names and "depth_decoder.model.embed_tokens.weight" not in names
    assert not any(p.requires_grad for p in decoder.codec.parameters()) and decoder.fixed_codes
    assert (decoder.codebook_size, decoder.num_codebooks) == (19, 4)


def test_embed_head_and_depth_logits_equal_csm(decoder, hf_model):
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 19, (6, 4), generator=g)
    hidden = torch.randn(6, 32, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(decoder.embed(codes), hf_model.backbone_model.embed_tokens(codes[None])[0], rtol=0, atol=0)
        torch.testing.assert_close(decoder.head(hidden), hf_model.lm_head(hidden), rtol=0, atol=0)
        ids = torch.nn.functional.pad(codes[:, :3], (1, 0))
        want = hf_model.depth_decoder(input_ids=ids, backbone_last_hidden_state=hidden).logits
        torch.testing.assert_close(decoder.depth_logits(hidden, codes), want, rtol=1e-5, atol=1e-6)


def test_decode_is_mimi_decode_up_to_the_audio_end_frame(decoder, hf_model, clip):
    codes = _codes(hf_model, clip(11000, seed=3))  # 6 frames
    with torch.no_grad():
        want = hf_model.codec_model.decode(codes[:4].t()[None]).audio_values.reshape(-1).clamp(-1, 1).numpy()
    cut = torch.cat([codes[:4], torch.zeros(1, 4, dtype=torch.long), codes[4:]])
    out = decoder.decode(cut)
    assert out.sample_rate == 24000 and out.samples.dtype == np.float32 and len(out.samples) == 4 * 1920
    np.testing.assert_allclose(out.samples, want, rtol=0, atol=1e-6)
    odd = codes.clone()
    odd[4, 2] = 18  # codebook_pad_token_id: the codec has no such entry
    assert len(decoder.decode(odd).samples) == 4 * 1920
    assert len(decoder.decode(torch.zeros(3, 4, dtype=torch.long)).samples) == 0
    assert decoder.dummy_codes().shape == (8, 4) and decoder.processor.max_frames == 8  # ceil(0.5 s x 12.5 frames/s) + 1
    with pytest.raises(ValueError, match=r"decode needs codes \[frames, 4\]"):
        decoder.decode(torch.zeros(8, dtype=torch.long))


def test_backbone_equals_csm_and_the_text_head_opens_the_audio(standin, hf_model, hf_processor):
    found = CsmFoundation({"checkpoint": str(standin)})
    tok = found.build_tokenizer()
    lm = fill_now(found.build_model(len(tok))).eval()
    ids = torch.tensor([tok.encode("<|begin_of_text|>[0]hello there<|end_of_text|>", add_special_tokens=False)])
    with torch.no_grad():
        hidden = lm.model(inputs_embeds=lm.get_input_embeddings()(ids)).last_hidden_state
        want = hf_model.backbone_model(inputs_embeds=hf_model.embed_text_tokens(ids)).last_hidden_state
        torch.testing.assert_close(hidden, want, rtol=1e-5, atol=1e-6)
        logits = lm(input_ids=ids).logits
    eot = tok.convert_tokens_to_ids("<|end_of_text|>")
    assert (logits.argmax(-1) == eot).all() and float(torch.softmax(logits[0, 0], -1)[eot]) > 1 - 1e-9
    assert torch.equal(lm.get_input_embeddings().weight, hf_model.embed_text_tokens.weight)
    assert not any(n.startswith("lm_head") for n in lm.state_dict()) and not list(lm.lm_head.parameters())
    assert tok.get_vocab() == hf_processor.tokenizer.get_vocab() and tok.pad_token == "<|end_of_text|>"
    assert sorted(found.part_names()) == ["backbone_model", "codec_model", "depth_decoder", "embed_text_tokens", "lm_head"]


def test_save_pretrained_writes_the_published_names(decoder, standin, tmp_path):
    decoder.save_pretrained(tmp_path / "dec")
    with safe_open(str(tmp_path / "dec" / "model.safetensors"), "pt") as f, safe_open(str(standin / "model.safetensors"), "pt") as g:
        mine, theirs = set(f.keys()), set(g.keys())
        assert mine == {k for k in theirs if not k.startswith(("embed_text_tokens.", "backbone_model."))}
        assert all(torch.equal(f.get_tensor(k), g.get_tensor(k)) for k in mine)
    assert json.loads((tmp_path / "dec" / "config.json").read_text())["model_type"] == "csm"


def test_bad_checkpoints_name_the_field(standin, tmp_path):
    with pytest.raises(ValueError, match=r"model.decoders.audio.options.checkpoint: .* has no config.json"):
        build_processor({"checkpoint": str(tmp_path)})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mimi"}))
    with pytest.raises(ValueError, match=r"model.foundation.options.checkpoint: .* has model_type 'mimi', not one of csm"):
        CsmFoundation({"checkpoint": str(tmp_path)})
    with pytest.raises(ValueError, match=r"hidden size 32, but the foundation's is 48"):
        build_decoder({"checkpoint": str(standin)}, hidden_size=48)
    broken = tmp_path / "broken"
    shutil.copytree(standin, broken)
    with safe_open(str(standin / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != "depth_decoder.codebooks_head.weight"}
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(LoadError, match=r"model.decoders.audio.options.checkpoint: .*lacks \['depth_decoder.codebooks_head.weight'\]"):
        build_decoder({"checkpoint": str(broken)}, hidden_size=32)
    del tensors["backbone_model.norm.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(LoadError, match=r"model.foundation.options.checkpoint: .*model.norm.weight"):
        fill_now(CsmFoundation({"checkpoint": str(broken)}).build_model(10))


def test_the_foundation_serves_its_model_types():
    """foundation/csm names its model type in its spec, so ``name: auto`` picks it."""
    from omnicore.api import Registry
    from omnicore_family_csm import plugin

    assert plugin.MODEL_TYPES == ("csm",)
    assert [s.extra["model_types"] for s in plugin.omnicore_foundations()] == [plugin.MODEL_TYPES]
    assert Registry.discover().foundation_for("csm") == "csm"


def test_another_model_type_names_the_installed_foundation_serving_it(tmp_path, monkeypatch, isolated_registry):
    """A checkpoint of another model type names the installed foundation listing it (read from the
    registry, no table here); with none listing it, no hint."""
    from omnicore.api import ComponentSpec, hookimpl
    from omnicore_family_kit import checkpoint

    class Other:
        @hookimpl
        def omnicore_foundations(self):
            return [ComponentSpec(name="other_fam", target="other_fam:build", extra={"model_types": ("mimi",)})]

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mimi"}))
    cfg = tmp_path / "config.json"
    for plugins, hint in (
        (
            ("omnicore_family_csm.plugin", (Other(), "other")),
            "; model type 'mimi' is served by foundation/other_fam: set model.foundation.name to other_fam (or auto)",
        ),
        (("omnicore_family_csm.plugin",), ""),
    ):
        rows = tuple(isolated_registry(*plugins).rows)
        monkeypatch.setattr(checkpoint, "_installed_rows", lambda rows=rows: rows)
        with pytest.raises(ValueError) as err:
            CsmFoundation({"checkpoint": str(tmp_path)})
        assert (
            str(err.value)
            == f"model.foundation.options.checkpoint: {cfg} has model_type 'mimi', not one of csm{hint}; otherwise {WHAT_TO_PUT}"
        )
        if hint:  # a decoder's field: the checkpoint belongs to a foundation, not to it
            with pytest.raises(
                ValueError,
                match=r"model.decoders.audio.options.checkpoint: .* is served by foundation/other_fam: point model.foundation \(name: other_fam, or auto\) at it, not model.decoders.audio;",
            ):
                build_processor({"checkpoint": str(tmp_path)})
