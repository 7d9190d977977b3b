"""The thinker trained and the whole model exported: a run on the stand-in (images, audio and a clip
with its sound track) trains the thinker's towers and LM; its export is a
``Qwen2_5OmniForConditionalGeneration`` folder (the composite ``config.json``, the trained thinker
under the published names, the talker's and token2wav's tensors byte for byte those of the input
checkpoint, its speakers), which transformers' whole-model class loads with the thinker's logits
equal to omnicore's. A thinker-only checkpoint exports a thinker-only folder.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from omnicore.testing import collate, read_jsonl

SAMPLES = [
    ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "What is it?"}], "noise"),
    ([{"type": "audio", "path": "s.wav"}, {"type": "text", "text": "What is said?"}], "a tone"),
    ([{"type": "video", "path": "d.mkv"}, {"type": "text", "text": "What happens?"}], "it hums"),
]


def _tensors(folder, keep=lambda k: True):
    """Every tensor of a safetensors folder (one file or shards) whose key ``keep`` accepts."""
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    out = {}
    for name in files:
        with safe_open(str(folder / name), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys() if keep(k)})
    return out


def _speech(key):
    return key.startswith(("talker.", "token2wav."))


@pytest.fixture(scope="module")
def data(tmp_path_factory, image, wave, frames, video_file):
    import soundfile as sf

    folder = tmp_path_factory.mktemp("export_data")
    image(60, 45, seed=1).save(folder / "a.png")
    sf.write(folder / "s.wav", wave(1.3, seed=1), 16000, subtype="FLOAT")
    video_file(folder / "d.mkv", frames(6, 56, 56, seed=4), fps=2, wave=wave(3.0, seed=3))
    with open(folder / "train.jsonl", "w") as f:
        for user, answer in SAMPLES:
            f.write(json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}) + "\n")
    return folder


@pytest.fixture(scope="module")
def trained(standin, data):
    """Three optimizer steps over the samples; the run folder (its ``export/``)."""
    import omnicore_family_qwen2_5_omni.plugin as plugin
    from omnicore.testing import Config, isolated_registry, train

    cfg = Config.model_validate(
        {
            "run": {"output_dir": str(data / "run"), "seed": 0},
            "model": {"foundation": {"name": "qwen2_5_omni", "options": {"checkpoint": str(standin), "use_audio_in_video": True}}},
            "data": {"train": str(data / "train.jsonl"), "max_tokens": 512, "num_workers": 0, "packing_window": 3},
            "train": {"max_steps": 3, "lr": 1e-2, "warmup_steps": 0, "progress": False},
        }
    )
    rows = train(cfg, registry=isolated_registry([(plugin, "omnicore-family-qwen2-5-omni")], builtins=True))
    assert len(rows) == 3 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    return data / "run"


def test_the_export_is_the_whole_model_with_the_speech_side_unchanged(trained, standin):
    export = trained / "export"
    config = json.loads((export / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_omni" and config["architectures"] == ["Qwen2_5OmniForConditionalGeneration"]
    for name in ("spk_dict.pt", "preprocessor_config.json", "tokenizer.json", "omnicore.yaml"):
        assert (export / name).is_file(), name
    index = export / "model.safetensors.index.json"  # one file or shards, as save_pretrained chose: every file listed, none stale
    listed = set(json.loads(index.read_text())["weight_map"].values()) if index.is_file() else {"model.safetensors"}
    assert {f.name for f in export.glob("*.safetensors")} == listed
    source, out = _tensors(standin), _tensors(export)
    assert sorted(out) == sorted(source)  # the names save_pretrained writes, every one of them
    speech = [k for k in source if _speech(k)]
    assert speech and all(k.startswith("thinker.") for k in source if not _speech(k))
    for k in speech:  # byte for byte: dtype, shape and bytes
        assert out[k].dtype == source[k].dtype and torch.equal(out[k].view(torch.uint8), source[k].view(torch.uint8)), k
    for k in source:  # every tensor as the class holds it: dtype and shape
        assert out[k].dtype == source[k].dtype and out[k].shape == source[k].shape, k
    moved = [k for k in source if not _speech(k) and not torch.equal(out[k], source[k])]
    for part in ("thinker.audio_tower.", "thinker.visual.", "thinker.model.", "thinker.lm_head."):  # every part trained
        assert any(k.startswith(part) for k in moved), part
    assert not any("audio_bos_eos_token" in k for k in moved)  # read by no forward: frozen
    assert torch.equal(torch.load(export / "spk_dict.pt")["Chelsie"]["cond"], torch.load(standin / "spk_dict.pt")["Chelsie"]["cond"])


def test_the_whole_class_loads_the_export_with_omnicores_logits(trained, data, omni_run, hf_processor_of, hf_call):
    """transformers' ``Qwen2_5OmniForConditionalGeneration.from_pretrained(export)``: its talker and
    token2wav are the input's, its thinker gives the logits of omnicore's model read from the
    export (each sample, the clip with its sound included)."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    export = trained / "export"
    whole = Qwen2_5OmniForConditionalGeneration.from_pretrained(export, dtype=torch.float32).eval()
    assert whole.has_talker and "Chelsie" in whole.speaker_map
    source = _tensors(export, _speech)
    for name, p in [*whole.talker.named_parameters(prefix="talker"), *whole.token2wav.named_parameters(prefix="token2wav")]:
        assert torch.equal(p, source[name].float()), name
    model, _, proc, _ = omni_run(export, data, use_audio_in_video=True)
    hf = hf_processor_of(export)
    for sample, (user, answer) in zip(read_jsonl(data / "train.jsonl"), SAMPLES, strict=True):
        encoded = proc.encode(sample)
        inputs, with_sound = hf_call(hf, data, user, answer)
        assert encoded.input_ids == inputs["input_ids"][0].tolist()
        with torch.no_grad():
            want = whole.thinker(**inputs, use_audio_in_video=with_sound).logits[0]
            got = model(collate([encoded], model.encoder_processors(), {}), return_logits=True).logits[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("whole", [True, False], ids=["whole_model", "thinker_only"])
def test_export_pretrained_reads_back_with_the_trained_logits(
    standin, hf_thinker, data, omni_run, hf_processor_of, hf_call, tmp_path, whole
):
    """``export_pretrained`` of a model whose every part moved (as after training), read back by
    transformers' class of the checkpoint: the thinker's logits are the in-memory model's. A
    thinker-only checkpoint (``Qwen2_5OmniThinkerForConditionalGeneration.save_pretrained``)
    exports a thinker-only folder, without speech tensors."""
    import shutil

    from transformers import Qwen2_5OmniForConditionalGeneration, Qwen2_5OmniThinkerForConditionalGeneration

    from omnicore_family_qwen2_5_omni.foundation import Qwen2_5OmniFoundation

    folder = standin
    if not whole:
        folder = tmp_path / "thinker"
        hf_thinker.save_pretrained(folder)
        for name in ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copyfile(standin / name, folder / name)
    model, tok, proc, _ = omni_run(folder, data, use_audio_in_video=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # "trained": every part moves
            model.lm.model.layers[0].mlp.up_proj.weight.add_(0.05)
            model.lm.lm_head.weight.mul_(1.1)
            model.encoders["image"].visual.blocks[1].norm2.weight.add_(0.05)
            model.encoders["audio"].audio_tower.layers[0].fc1.bias.add_(0.1)
        Qwen2_5OmniFoundation({"checkpoint": str(folder)}).export_pretrained(model, tok, tmp_path / "hf")
        cls = Qwen2_5OmniForConditionalGeneration if whole else Qwen2_5OmniThinkerForConditionalGeneration
        back = cls.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
        thinker = back.thinker if whole else back
        assert any(_speech(k) for k in _tensors(tmp_path / "hf")) == whole
        hf = hf_processor_of(tmp_path / "hf")
        for k in (0, 2):  # an image; the clip and its sound
            encoded = proc.encode(read_jsonl(data / "train.jsonl")[k])
            inputs, with_sound = hf_call(hf, data, *SAMPLES[k])
            assert inputs["input_ids"][0].tolist() == encoded.input_ids
            with torch.no_grad():
                want = thinker(**inputs, use_audio_in_video=with_sound).logits[0]
                got = model(collate([encoded], model.encoder_processors(), {}), return_logits=True).logits[0]
                torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
                assert not torch.allclose(
                    hf_thinker(**inputs, use_audio_in_video=with_sound).logits[0], want, atol=1e-3
                )  # the moves are in
    finally:
        model.load_state_dict(state)


def test_generate_speaks_the_answer_through_the_talker(trained, standin, data, tmp_path, capsys, hf_processor_of, hf_call):
    """``omnicore generate --export EXPORT --speak``: the text is ``omnicore generate``'s own (greedy)
    answer, and the WAV is what transformers' ``Qwen2_5OmniForConditionalGeneration.generate``
    of the export speaks for the same prompt and seed (token2wav's 24 kHz, written as 16-bit PCM)."""
    import numpy as np
    import soundfile as sf
    from transformers import Qwen2_5OmniForConditionalGeneration

    from omnicore.testing import cli_main

    export = trained / "export"
    config = tmp_path / "speak.yaml"
    options = {"checkpoint": str(standin), "use_audio_in_video": True}
    data_section = {"train": str(data / "train.jsonl")}
    config.write_text(
        json.dumps({"model": {"foundation": {"name": "qwen2_5_omni", "options": options}}, "data": data_section, "run": {"seed": 3}})
    )
    base = ["generate", str(config), "--export", str(export), "--prompt", "Say hi", "--image", str(data / "a.png"), "--max-new-tokens", "6"]
    assert cli_main([*base, "--out", str(tmp_path / "text")]) == 0
    text_only = capsys.readouterr().out.strip().splitlines()
    assert cli_main([*base, "--speak", "--out", str(tmp_path / "spoken")]) == 0
    spoken = capsys.readouterr().out.strip().splitlines()
    assert spoken[0] == text_only[0] and spoken[0].startswith("text: ")
    wav = tmp_path / "spoken" / "generated-speech-0.wav"
    assert spoken[1:] == [f"saved {wav}"]
    got, rate = sf.read(wav, dtype="float32")
    whole = Qwen2_5OmniForConditionalGeneration.from_pretrained(export, dtype=torch.float32).eval()
    user = [{"type": "image", "path": "a.png"}, {"type": "text", "text": "Say hi"}]
    inputs, _ = hf_call(hf_processor_of(export), data, user, None, prompt_only=True)
    inputs["thinker_pixel_values"] = inputs.pop("pixel_values")  # unprefixed, generate hands them to the talker, which refuses them
    torch.manual_seed(3)
    talker = whole.config.talker_config
    with torch.no_grad():
        _, want = whole.generate(
            **inputs,
            thinker_max_new_tokens=6,
            thinker_do_sample=False,
            talker_eos_token_id=[talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id],
        )
    assert rate == 24000 and got.shape[0] == want.numel() > 0 and float(want.abs().max()) > 0
    np.testing.assert_allclose(got, np.clip(want.numpy(), -1, 1), atol=1 / 32767, rtol=0)


def test_speaking_needs_an_export(standin, data, tmp_path, capsys):
    from omnicore.testing import cli_main

    config = tmp_path / "speak.yaml"
    model = {"foundation": {"name": "qwen2_5_omni", "options": {"checkpoint": str(standin)}}}
    config.write_text(json.dumps({"model": model, "data": {"train": str(data / "train.jsonl")}}))
    assert cli_main(["generate", str(config), "--prompt", "hi", "--speak", "--out", str(tmp_path / "o")]) == 2
    assert "--speak: the voice is read from an export" in capsys.readouterr().err
