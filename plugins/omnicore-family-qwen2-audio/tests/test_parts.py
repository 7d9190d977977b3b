"""The family's parts alone against transformers' own Qwen2-Audio classes on the same inputs (fp32):
the processor's features and token counts, the audio encoder's rows, the text LM's logits, and
both checkpoint layouts."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from omnicore.api import Audio, LoadError, fill_now
from omnicore_family_qwen2_audio.encoder import build as build_encoder
from omnicore_family_qwen2_audio.foundation import Qwen2AudioFoundation
from omnicore_family_qwen2_audio.processor import WHAT_TO_PUT, build_processor

# samples at 16 kHz: shortest clip with a token, around hop multiples (160), odd frame counts, the window
LENGTHS = [321, 480, 481, 799, 961, 1121, 1600, 2241, 1601, 3359, 8000, 16000, 16159, 23999, 31841, 32000]


def test_token_counts_and_features_equal_the_hf_processor(standin, hf_processor, clip):
    proc = build_processor({"checkpoint": str(standin)})
    audio_id = hf_processor.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    counts = []
    for i, n in enumerate(LENGTHS):
        wave = clip(n, seed=i)
        feats = proc.preprocess(Audio(samples=wave, sample_rate=16000))
        ref = hf_processor(text="<|audio_bos|><|AUDIO|><|audio_eos|>", audio=[wave], sampling_rate=16000, return_tensors="pt")
        want = int((ref["input_ids"][0] == audio_id).sum())
        assert proc.num_tokens(feats) == want, f"{n} samples"
        assert torch.equal(feats["input_features"], ref["input_features"][0]), f"{n} samples"
        assert torch.equal(feats["feature_attention_mask"], ref["feature_attention_mask"][0]), f"{n} samples"
        counts.append(want)
    # the grid spans one token up to the whole window's (max_source_positions positions, pooled by 2)
    assert min(counts) == 1 and max(counts) == hf_processor.feature_extractor.nb_max_frames // 4 and len(set(counts)) >= 9


def test_long_and_too_short_clips(standin, hf_processor, clip):
    wave = clip(40000)
    with pytest.raises(ValueError, match=r"2.50 s long, longer than the checkpoint's window of 2 s"):
        build_processor({"checkpoint": str(standin)}).preprocess(Audio(samples=wave, sample_rate=16000))
    cut = build_processor({"checkpoint": str(standin), "long_audio": "truncate"}).preprocess(Audio(samples=wave, sample_rate=16000))
    ref = hf_processor(text="<|AUDIO|>", audio=[wave], sampling_rate=16000, return_tensors="pt")
    assert torch.equal(cut["input_features"], ref["input_features"][0])
    with pytest.raises(ValueError, match=r"too short for Qwen2-Audio"):
        build_processor({"checkpoint": str(standin)}).preprocess(Audio(samples=clip(320), sample_rate=16000))


def test_resampled_clip_is_what_the_hf_processor_gives_for_the_resampled_samples(standin, hf_processor, clip):
    from omnicore.api import resample

    media = Audio(samples=clip(9000, seed=5), sample_rate=22050)
    feats = build_processor({"checkpoint": str(standin)}).preprocess(media)
    wave = resample(media, 16000).samples
    ref = hf_processor(text="<|AUDIO|>", audio=[wave], sampling_rate=16000, return_tensors="pt")
    assert torch.equal(feats["input_features"], ref["input_features"][0])


def _encoder(folder, hidden=32):
    return fill_now(build_encoder({"checkpoint": str(folder)}, hidden_size=hidden)).eval()


def test_encoder_rows_equal_the_hf_audio_path_for_a_batch_of_clips(standin, hf_audio_rows, clip):
    enc = _encoder(standin)
    clips = [clip(n, seed=i) for i, n in enumerate([4000, 32000, 1601, 11111])]
    want, inputs = hf_audio_rows(clips)
    batch = enc.processor.collate([enc.processor.preprocess(Audio(samples=c, sample_rate=16000)) for c in clips])
    assert torch.equal(batch["input_features"], inputs["input_features"])
    with torch.no_grad():
        got = enc(batch)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    feats = [enc.processor.preprocess(Audio(samples=c, sample_rate=16000)) for c in clips]
    start = sum(enc.processor.num_tokens(f) for f in feats[:2])
    with torch.no_grad():  # a clip alone gives its rows of the batch: the others' padding changes nothing
        alone = enc(enc.processor.collate([feats[2]]))
    torch.testing.assert_close(alone, got[start : start + alone.shape[0]], atol=1e-5, rtol=0)


def test_lm_logits_equal_the_hf_model_on_text(standin, hf_model):
    found = Qwen2AudioFoundation({"checkpoint": str(standin)})
    tok = found.build_tokenizer()
    lm = fill_now(found.build_model(len(tok))).eval()
    ids = torch.tensor([tok.encode("<|im_start|>user\nhello there<|im_end|>\n", add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(lm(input_ids=ids).logits, hf_model(input_ids=ids).logits, atol=1e-5, rtol=0)
    assert lm.get_input_embeddings().weight.shape == hf_model.get_input_embeddings().weight.shape


def _relayout(src, dst):
    """``src``'s checkpoint re-saved under transformers 5's in-memory names (model.audio_tower.*, ...)."""
    import shutil

    shutil.copytree(src, dst)
    names = {
        "audio_tower.": "model.audio_tower.",
        "multi_modal_projector.": "model.multi_modal_projector.",
        "language_model.model.": "model.language_model.",
        "language_model.lm_head.": "lm_head.",
    }
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        tensors = {next(new + k[len(old) :] for old, new in names.items() if k.startswith(old)): f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return tensors


def test_both_layouts_load_the_same_tensors(standin, tmp_path):
    tensors = _relayout(standin, tmp_path / "new")
    assert "model.language_model.embed_tokens.weight" in tensors and "lm_head.weight" in tensors
    for folder in (standin, tmp_path / "new"):
        enc = _encoder(folder)
        assert torch.equal(enc.audio_tower.conv1.weight, tensors["model.audio_tower.conv1.weight"])
        assert torch.equal(enc.multi_modal_projector.linear.bias, tensors["model.multi_modal_projector.linear.bias"])
        found = Qwen2AudioFoundation({"checkpoint": str(folder)})
        lm = fill_now(found.build_model(10))
        assert torch.equal(lm.lm_head.weight, tensors["lm_head.weight"])
        assert torch.equal(lm.model.layers[1].mlp.up_proj.weight, tensors["model.language_model.layers.1.mlp.up_proj.weight"])


def test_bad_checkpoints_name_the_field(standin, tmp_path):
    with pytest.raises(ValueError, match=r"model.encoders.audio.options.checkpoint: .* has no config.json"):
        build_processor({"checkpoint": str(tmp_path)})
    with pytest.raises(ValueError, match=r"hidden size of 32, but the foundation's is 48"):
        build_encoder({"checkpoint": str(standin)}, hidden_size=48)
    tensors = _relayout(standin, tmp_path / "broken")
    del tensors["model.audio_tower.conv2.bias"]
    save_file(tensors, str(tmp_path / "broken" / "model.safetensors"))
    with pytest.raises(LoadError, match=r"model.encoders.audio.options.checkpoint: .*audio_tower.conv2.bias"):
        build_encoder({"checkpoint": str(tmp_path / "broken")}, hidden_size=32)


def test_the_foundation_serves_its_model_types():
    """foundation/qwen2_audio names its model type in its spec, so ``name: auto`` picks it."""
    from omnicore.api import Registry
    from omnicore_family_qwen2_audio import plugin

    assert plugin.MODEL_TYPES == ("qwen2_audio",)
    assert [s.extra["model_types"] for s in plugin.omnicore_foundations()] == [plugin.MODEL_TYPES]
    assert Registry.discover().foundation_for("qwen2_audio") == "qwen2_audio"


def test_another_model_type_names_the_installed_foundation_serving_it(tmp_path, monkeypatch, isolated_registry):
    """A checkpoint of another model type names the installed foundation listing it (read from the
    registry, no table here); with none listing it, no hint."""
    from omnicore.api import ComponentSpec, hookimpl
    from omnicore_family_kit import checkpoint

    class Other:
        @hookimpl
        def omnicore_foundations(self):
            return [ComponentSpec(name="other_fam", target="other_fam:build", extra={"model_types": ("qwen2_5_omni",)})]

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    cfg = tmp_path / "config.json"
    for plugins, hint in (
        (
            ("omnicore_family_qwen2_audio.plugin", (Other(), "other")),
            "; model type 'qwen2_5_omni' is served by foundation/other_fam: set model.foundation.name to other_fam (or auto)",
        ),
        (("omnicore_family_qwen2_audio.plugin",), ""),
    ):
        rows = tuple(isolated_registry(*plugins).rows)
        monkeypatch.setattr(checkpoint, "_installed_rows", lambda rows=rows: rows)
        with pytest.raises(ValueError) as err:
            Qwen2AudioFoundation({"checkpoint": str(tmp_path)})
        assert (
            str(err.value)
            == f"model.foundation.options.checkpoint: {cfg} has model_type 'qwen2_5_omni', not one of qwen2_audio{hint}; otherwise {WHAT_TO_PUT}"
        )
        if hint:  # an encoder's field: the checkpoint belongs to a foundation, not to it
            with pytest.raises(
                ValueError,
                match=r"model.encoders.audio.options.checkpoint: .* is served by foundation/other_fam: point model.foundation \(name: other_fam, or auto\) at it, not model.encoders.audio;",
            ):
                build_processor({"checkpoint": str(tmp_path)})
