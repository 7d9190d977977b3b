"""The family's parts alone against transformers' own Qwen2.5-Omni classes on the same inputs (fp32):
the processors' features and token counts over grids of clip lengths and image sizes, frame
sampling, clips with sound at other rates (the chunking's corner cases), the towers' rows, the text
LM's logits, the layouts the checkpoint is found in, and the errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from omnicore.api import Audio, LoadError, Video, fill_now
from omnicore_family_qwen2_5_omni.encoder import build_audio, build_vision
from omnicore_family_qwen2_5_omni.foundation import Qwen2_5OmniFoundation
from omnicore_family_qwen2_5_omni.processor import build_audio_processor, build_vision_processor, chunk_bounds

AUDIO_TEXT = "<|audio_bos|><|AUDIO|><|audio_eos|>"
IMAGE_TEXT = "<|vision_bos|><|IMAGE|><|vision_eos|>"
VIDEO_TEXT = "<|vision_bos|><|VIDEO|><|vision_eos|>"
SECONDS = [0.021, 0.05, 0.3, 1.0, 1.37, 2.0, 3.99, 4.0]  # the fewest frames that give a token, chunk edges, the window
IMAGE_SIZES = [(10, 10), (56, 56), (60, 45), (41, 99), (112, 112), (113, 111), (200, 150), (20, 300)]
CLIP_SHAPES = [(2, 56, 56), (4, 50, 80), (6, 64, 48), (8, 30, 30)]


def _count(inputs, hf_processor, token):
    return int((inputs["input_ids"][0] == hf_processor.tokenizer.convert_tokens_to_ids(token)).sum())


def test_audio_tokens_and_features_equal_the_hf_processor(standin, hf_processor, wave):
    proc = build_audio_processor({"checkpoint": str(standin)})
    for i, s in enumerate(SECONDS):
        clip = wave(s, seed=i)
        feats = proc.preprocess(Audio(samples=clip, sample_rate=16000))
        ref = hf_processor(text=AUDIO_TEXT, audio=[clip], return_tensors="pt")
        assert proc.num_tokens(feats) == _count(ref, hf_processor, "<|AUDIO|>"), s
        assert torch.equal(feats["input_features"], ref["input_features"][0]), s
        assert torch.equal(feats["feature_attention_mask"], ref["feature_attention_mask"][0]), s
    assert proc.num_tokens(feats) == 100  # 4 s: 25 tokens a second


def test_long_and_short_audio_are_refused_or_cut(standin, wave):
    long = Audio(samples=wave(5.0), sample_rate=16000)
    with pytest.raises(ValueError, match=r"audio is 5.00 s long, longer than the checkpoint's window of 4 s \(long_audio: refuse\)"):
        build_audio_processor({"checkpoint": str(standin)}).preprocess(long)
    cut = build_audio_processor({"checkpoint": str(standin), "long_audio": "truncate"})
    assert cut.num_tokens(cut.preprocess(long)) == 100
    with pytest.raises(ValueError, match=r"too short for Qwen2.5-Omni \(it needs at least 3 mel frames, 321 samples\)"):
        cut.preprocess(Audio(samples=np.zeros(100, dtype=np.float32), sample_rate=16000))
    with pytest.raises(ValueError, match=r"expects mono audio of shape \[num_samples\]"):
        cut.preprocess(Audio(samples=np.zeros((2, 100), dtype=np.float32), sample_rate=16000))


def test_image_tokens_and_pixels_equal_the_hf_processor(standin, hf_processor, image):
    proc = build_vision_processor({"checkpoint": str(standin)})
    counts = []
    for i, (h, w) in enumerate(IMAGE_SIZES):
        img = image(h, w, seed=i)
        feats = proc.preprocess(img)
        ref = hf_processor(text=IMAGE_TEXT, images=[img], return_tensors="pt")
        want = _count(ref, hf_processor, "<|IMAGE|>")
        assert proc.num_tokens(feats) == want, (h, w)
        assert torch.equal(feats["pixel_values"], ref["pixel_values"]) and torch.equal(feats["image_grid_thw"], ref["image_grid_thw"][0])
        t, gh, gw = proc.grid(feats)
        assert t == 1 and gh * gw == want
        counts.append(want)
    assert min(counts) == 4 and max(counts) == 16  # the processor's pixel bounds: 4 to 16 tokens


def test_clip_tokens_and_pixels_equal_the_hf_processor(standin, hf_processor, frames):
    """Clips at 2 frames a second (what ``Qwen2_5OmniProcessor`` assumes) keep every frame."""
    proc = build_vision_processor({"checkpoint": str(standin), "modality": "video"})
    for i, (n, h, w) in enumerate(CLIP_SHAPES):
        clip = frames(n, h, w, seed=i)
        feats = proc.preprocess(Video(frames=clip, fps=2.0))
        ref = hf_processor(text=VIDEO_TEXT, videos=[clip], return_tensors="pt")
        assert proc.num_tokens(feats) == _count(ref, hf_processor, "<|VIDEO|>"), (n, h, w)
        assert torch.equal(feats["pixel_values_videos"], ref["pixel_values_videos"])
        assert torch.equal(feats["video_grid_thw"], ref["video_grid_thw"][0])
        assert float(feats["video_second_per_grid"]) == float(ref["video_second_per_grid"][0]) == 1.0
        assert "audio" not in feats and not proc.audio_track


def test_clips_at_other_rates_are_sampled_to_two_frames_a_second(standin, hf_processor, frames):
    """``Qwen2VLVideoProcessor.sample_frames`` at 2 frames a second: 20 frames at 10 fps keep every
    fifth (a frame group is then 1 s); 5 frames at 1 fps keep 4 over the 5 s (a group is 2.5 s); an
    odd count at 2 fps keeps an even one (7 frames: 6, a group 7/6 s). transformers' processor, given
    the kept frames and their rate, gives the same pixels and seconds."""
    proc = build_vision_processor({"checkpoint": str(standin), "modality": "video"})
    clip = frames(20, 56, 56)
    cases = [(clip, 10.0, [0, 5, 10, 15], 1.0), (clip[:5], 1.0, [0, 1, 2, 3], 2.5), (clip[:7], 2.0, [0, 1, 2, 3, 4, 5], 7 / 6)]
    for source, fps, kept, seconds in cases:
        feats = proc.preprocess(Video(frames=source, fps=fps))
        ref = hf_processor(text=VIDEO_TEXT, videos=[source[kept]], fps=2 / seconds, return_tensors="pt")
        assert torch.equal(feats["pixel_values_videos"], ref["pixel_values_videos"]), fps
        assert float(feats["video_second_per_grid"]) == pytest.approx(seconds, abs=1e-12)
        assert torch.equal(feats["video_second_per_grid"].float(), ref["video_second_per_grid"][0])


def test_chunk_bounds_are_transformers_chunked_index(hf_processor):
    """Step for step, jumps over several chunks included (one chunk boundary per value)."""
    cases = [np.arange(75), np.repeat([0, 25, 50], 4) * 1.0, np.repeat([0, 100, 200], 4) * 1.0, np.array([0.0, 49.99, 50.0, 149.0, 151.0])]
    for values in cases:
        assert chunk_bounds(values, 50) == hf_processor.get_chunked_index(values, 50)
    assert chunk_bounds(np.repeat([0, 100, 200], 4), 50) == [(0, 4), (4, 5), (5, 8), (8, 9), (9, 12)]


@pytest.mark.parametrize(
    ("n", "fps", "seconds"),
    [(6, 2.0, 3.0), (6, 1.0, 4.0), (6, 0.5, 2.5), (2, 2.0, 0.2)],
    ids=["sound_longer", "frames_longer", "frames_far_apart", "short"],
)
def test_clips_with_sound_equal_the_hf_processor_and_positions(
    tmp_path, standin, hf_processor, hf_thinker, omni_run, frames, wave, video_file, n, fps, seconds
):
    """A clip with its sound track at other rates and lengths: the ids are ``Qwen2_5OmniProcessor``'s
    (with ``load_audio_from_video``), the positions ``get_rope_index``'s (with
    ``use_audio_in_video``), the logits the thinker's. ``frames_far_apart`` places frame groups 4 s
    apart, so the chunking steps over empty chunks as transformers' does."""
    from omnicore.testing import collate, read_jsonl

    clip, sound = frames(n, 56, 56, seed=n), wave(seconds, seed=2)
    video_file(tmp_path / "v.mkv", clip, fps=fps, wave=sound)
    sample = {"messages": [{"role": "user", "content": [{"type": "video", "path": "v.mkv"}]}, {"role": "assistant", "content": "ok"}]}
    (tmp_path / "train.jsonl").write_text(json.dumps(sample) + "\n")
    model, _, proc, _ = omni_run(standin, tmp_path, use_audio_in_video=True)
    encoded = proc.encode(read_jsonl(tmp_path / "train.jsonl")[0])
    messages = [{"role": "user", "content": [{"type": "video"}]}, {"role": "assistant", "content": "ok"}]
    text = hf_processor.apply_chat_template(messages, tokenize=False)
    kwargs = {"audio_from_video_indices": [0], "load_audio_from_video": True, "fps": fps}  # its clip at fps: a group is 2 / fps s
    inputs = hf_processor(text=text, videos=[clip], audio=[sound], return_tensors="pt", **kwargs)
    assert encoded.input_ids == inputs["input_ids"][0].tolist()
    want, _ = hf_thinker.model.get_rope_index(
        inputs["input_ids"], None, inputs["video_grid_thw"], inputs["attention_mask"], True,
        inputs["feature_attention_mask"].sum(-1), inputs["video_second_per_grid"],
    )  # fmt: skip
    assert encoded.rope_position_ids == want[:, 0].tolist()
    with torch.no_grad():
        ref = hf_thinker(**inputs, use_audio_in_video=True).logits[0]
        got = model(collate([encoded], model.encoder_processors(), {}), return_logits=True).logits[0]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_a_clip_with_sound_is_a_plain_clip_without_use_audio_in_video(
    tmp_path, standin, hf_processor, hf_thinker, omni_run, frames, wave, video_file
):
    """``use_audio_in_video: false`` (the default, as transformers'): the sound track is not read."""
    from omnicore.testing import collate, read_jsonl

    clip = frames(4, 56, 56, seed=1)
    video_file(tmp_path / "v.mkv", clip, fps=2, wave=wave(2.0))
    sample = {"messages": [{"role": "user", "content": [{"type": "video", "path": "v.mkv"}]}, {"role": "assistant", "content": "ok"}]}
    (tmp_path / "train.jsonl").write_text(json.dumps(sample) + "\n")
    model, _, proc, _ = omni_run(standin, tmp_path)
    assert not proc.encoders["video"].audio_track
    encoded = proc.encode(read_jsonl(tmp_path / "train.jsonl")[0])
    assert [m for _, m, _ in encoded.media] == ["video"]
    text = hf_processor.apply_chat_template(
        [sample["messages"][0] | {"content": [{"type": "video"}]}, sample["messages"][1]], tokenize=False
    )
    inputs = hf_processor(text=text, videos=[clip], return_tensors="pt")
    assert encoded.input_ids == inputs["input_ids"][0].tolist()
    with torch.no_grad():
        ref = hf_thinker(**inputs).logits[0]
        got = model(collate([encoded], model.encoder_processors(), {}), return_logits=True).logits[0]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def _audio(folder):
    return fill_now(build_audio({"checkpoint": str(folder)}, hidden_size=64)).eval()


def _vision(folder, modality="image"):
    return fill_now(build_vision({"checkpoint": str(folder), "modality": modality}, hidden_size=64)).eval()


def test_audio_tower_rows_equal_the_thinkers_audio_features(standin, hf_thinker, wave):
    enc = _audio(standin)
    proc = enc.processor
    feats = [proc.preprocess(Audio(samples=wave(s, seed=i), sample_rate=16000)) for i, s in enumerate([0.3, 4.0, 1.37, 0.05])]
    batch = proc.collate(feats)
    with torch.no_grad():
        got = enc(batch)
        want = hf_thinker.model.get_audio_features(batch["input_features"], batch["feature_attention_mask"]).last_hidden_state
    assert got.shape == (sum(proc.num_tokens(f) for f in feats), 64)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with torch.no_grad():  # a clip alone gives its rows of the batch (attention stays within its chunks)
        alone = enc(proc.collate([feats[2]]))
    start = sum(proc.num_tokens(f) for f in feats[:2])
    torch.testing.assert_close(alone, got[start : start + alone.shape[0]], atol=1e-5, rtol=0)


def test_vision_tower_rows_equal_the_thinkers_image_and_video_features(standin, hf_thinker, image, frames):
    enc = _vision(standin)
    proc = enc.processor
    feats = [proc.preprocess(image(h, w, seed=i)) for i, (h, w) in enumerate([(60, 45), (112, 112), (20, 300)])]
    batch = proc.collate(feats)
    with torch.no_grad():
        got = enc(batch)
        want = torch.cat(hf_thinker.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"]).pooler_output)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    vproc = build_vision_processor({"checkpoint": str(standin), "modality": "video"})
    clips = [vproc.preprocess(Video(frames=frames(n, h, w, seed=n), fps=2.0)) for n, h, w in CLIP_SHAPES]
    vbatch = vproc.collate(clips)
    with torch.no_grad():
        got = enc(vbatch)
        want = torch.cat(hf_thinker.model.get_video_features(vbatch["pixel_values_videos"], vbatch["video_grid_thw"]).pooler_output)
    assert got.shape == (sum(vproc.num_tokens(c) for c in clips), 64)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_lm_logits_equal_the_thinker_on_text(standin, hf_thinker):
    found = Qwen2_5OmniFoundation({"checkpoint": str(standin)})
    tok = found.build_tokenizer()
    lm = fill_now(found.build_model(len(tok))).eval()
    ids = torch.tensor([tok.encode("<|im_start|>user\nhello there<|im_end|>\n", add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(lm(input_ids=ids).logits, hf_thinker(input_ids=ids).logits, atol=1e-5, rtol=0)
    assert lm.get_input_embeddings().weight.shape == hf_thinker.get_input_embeddings().weight.shape
    assert lm.lm_head.weight is not lm.model.embed_tokens.weight  # untied, as published


def test_part_names_split_the_model_exactly(standin, omni_run, tmp_path):
    (tmp_path / "train.jsonl").write_text("")
    model, _, _, _ = omni_run(standin, tmp_path)
    parts = Qwen2_5OmniFoundation({"checkpoint": str(standin)}).part_names()
    names = [n for n, _ in model.named_parameters()]
    owner = {n: [k for k, prefixes in parts.items() if any(n.startswith(p) for p in prefixes)] for n in names}
    assert all(len(v) == 1 for v in owner.values()), [n for n, v in owner.items() if len(v) != 1][:3]
    assert {v[0] for v in owner.values()} == set(parts)


def _relayout(src, dst):
    """``src``'s checkpoint re-saved under transformers 5's in-memory names (``thinker.model.audio_tower.*``,
    ``thinker.model.visual.*``, ``thinker.model.language_model.*``)."""
    shutil.copytree(src, dst)
    names = {
        "thinker.audio_tower.": "thinker.model.audio_tower.",
        "thinker.visual.": "thinker.model.visual.",
        "thinker.model.": "thinker.model.language_model.",
    }
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        tensors = {next((new + k[len(old) :] for old, new in names.items() if k.startswith(old)), k): f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return tensors


def test_every_layout_loads_the_same_tensors(standin, hf_thinker, tmp_path):
    """The published whole model, its in-memory names, its thinker as
    ``Qwen2_5OmniThinkerForConditionalGeneration.save_pretrained`` writes it after loading it from
    the whole model (``thinker.*`` names), and a thinker under its own names (``audio_tower.*``,
    ``model.*``, as a thinker built alone saves)."""
    tensors = _relayout(standin, tmp_path / "new")
    hf_thinker.save_pretrained(tmp_path / "thinker")
    bare = tmp_path / "bare"
    hf_thinker.save_pretrained(bare)
    with safe_open(str(standin / "model.safetensors"), "pt") as f:
        own = {k[len("thinker.") :]: f.get_tensor(k) for k in f.keys() if k.startswith("thinker.")}
    save_file(own, str(bare / "model.safetensors"), metadata={"format": "pt"})
    assert "audio_tower.conv1.weight" in own and "model.embed_tokens.weight" in own and "lm_head.weight" in own
    for folder in (tmp_path / "thinker", bare):  # a thinker's processor files, as its processor's save_pretrained writes them
        shutil.copyfile(standin / "preprocessor_config.json", folder / "preprocessor_config.json")
    for folder in (standin, tmp_path / "new", tmp_path / "thinker", bare):
        assert folder == standin or json.loads((folder / "config.json").read_text())["model_type"] in (
            "qwen2_5_omni",
            "qwen2_5_omni_thinker",
        )
        audio, vision = _audio(folder), _vision(folder)
        assert torch.equal(audio.audio_tower.conv2.weight, tensors["thinker.model.audio_tower.conv2.weight"])
        assert torch.equal(vision.visual.merger.mlp[2].bias, tensors["thinker.model.visual.merger.mlp.2.bias"])
        lm = fill_now(Qwen2_5OmniFoundation({"checkpoint": str(folder)}).build_model(10))
        assert torch.equal(lm.lm_head.weight, tensors["thinker.lm_head.weight"])
        assert torch.equal(lm.model.layers[1].mlp.up_proj.weight, tensors["thinker.model.language_model.layers.1.mlp.up_proj.weight"])


def test_bad_checkpoints_and_media_name_what_to_fix(standin, tmp_path, image):
    with pytest.raises(
        ValueError, match=r"model.encoders.audio.options.checkpoint: .* has no config.json; point options.checkpoint at a Qwen2.5-Omni"
    ):
        build_audio_processor({"checkpoint": str(tmp_path)})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    with pytest.raises(
        ValueError,
        match=r"model_type 'qwen2_vl', not one of qwen2_5_omni, qwen2_5_omni_thinker; model type 'qwen2_vl' is served by "
        r"foundation/qwen2_vl: set model.foundation.name to qwen2_vl \(or auto\); otherwise point options.checkpoint at a Qwen2.5-Omni",
    ):
        Qwen2_5OmniFoundation({"checkpoint": str(tmp_path)})
    with pytest.raises(ValueError, match=r"model.encoders.video.options.checkpoint: .*model_type 'qwen2_vl'"):
        build_vision_processor({"checkpoint": str(tmp_path), "modality": "video"})
    with pytest.raises(ValueError, match=r"model.encoders.audio.options.checkpoint: .*hidden size of 64, but the foundation's is 48"):
        build_audio({"checkpoint": str(standin)}, hidden_size=48)
    tensors = _relayout(standin, tmp_path / "broken")
    del tensors["thinker.model.visual.merger.ln_q.weight"]
    save_file(tensors, str(tmp_path / "broken" / "model.safetensors"))
    with pytest.raises(LoadError, match=r"model.encoders.image.options.checkpoint: .*visual.merger.ln_q.weight"):
        build_vision({"checkpoint": str(tmp_path / "broken")}, hidden_size=64)
    with pytest.raises(TypeError, match="expects a PIL image"):
        build_vision_processor({"checkpoint": str(standin)}).preprocess(np.zeros((4, 4, 3)))
    with pytest.raises(TypeError, match="expects an omnicore.api.Video"):
        build_vision_processor({"checkpoint": str(standin), "modality": "video"}).preprocess(image(30, 30))
    with pytest.raises(ValueError, match=r"video_fps"):
        Qwen2_5OmniFoundation({"checkpoint": str(standin), "video_fps": 0})


def test_the_foundation_serves_its_model_types():
    """foundation/qwen2_5_omni names its model types (the whole model and the thinker alone) in its
    spec, so ``name: auto`` picks it for both."""
    from omnicore.api import Registry
    from omnicore_family_qwen2_5_omni import plugin

    assert plugin.MODEL_TYPES == ("qwen2_5_omni", "qwen2_5_omni_thinker")
    assert [s.extra["model_types"] for s in plugin.omnicore_foundations()] == [plugin.MODEL_TYPES]
    reg = Registry.discover()
    assert {t: reg.foundation_for(t) for t in plugin.MODEL_TYPES} == dict.fromkeys(plugin.MODEL_TYPES, "qwen2_5_omni")


def test_the_hint_comes_from_the_installed_foundations(tmp_path, monkeypatch, isolated_registry):
    """The foundation named is whichever installed one lists the model type (no table here): with
    another family listing ``qwen2_vl``, that one is named; with only this family, none is."""
    from omnicore.api import ComponentSpec, hookimpl
    from omnicore_family_kit import checkpoint

    class OtherVL:
        @hookimpl
        def omnicore_foundations(self):
            return [ComponentSpec(name="other_vl", target="other_vl:build", extra={"model_types": ("qwen2_vl",)})]

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    for plugins, hint in (
        (("omnicore_family_qwen2_5_omni.plugin", (OtherVL(), "other")), "; model type 'qwen2_vl' is served by foundation/other_vl: "),
        (("omnicore_family_qwen2_5_omni.plugin",), ""),
    ):
        rows = tuple(isolated_registry(*plugins).rows)
        monkeypatch.setattr(checkpoint, "_installed_rows", lambda rows=rows: rows)
        with pytest.raises(ValueError) as err:
            Qwen2_5OmniFoundation({"checkpoint": str(tmp_path)})
        assert f"not one of qwen2_5_omni, qwen2_5_omni_thinker{hint}" in str(err.value)
        assert hint or "; otherwise point options.checkpoint" in str(err.value)


def test_the_clip_processor_with_sound_pickles_as_data_workers_need(standin, frames, wave):
    """Data workers may be spawned: the processor crosses processes and gives the same features."""
    import pickle

    proc = build_vision_processor({"checkpoint": str(standin), "modality": "video", "use_audio_in_video": True})
    assert proc.audio_track
    clip = Video(frames=frames(4, 56, 56), fps=2.0, audio=Audio(samples=wave(2.0), sample_rate=16000))
    again = pickle.loads(pickle.dumps(proc))
    a, b = proc.preprocess(clip), again.preprocess(clip)
    assert torch.equal(a["pixel_values_videos"], b["pixel_values_videos"]) and torch.equal(
        a["audio"]["input_features"], b["audio"]["input_features"]
    )
    x, y = again.layout(b), proc.layout(a)
    assert (x.tokens, x.positions, x.advance) == (y.tokens, y.positions, y.advance) and [m for m, _ in x.items] == ["video", "audio"]
