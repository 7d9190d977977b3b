"""LoRA on a published family (the Qwen2-Audio and Qwen3-VL stand-ins) exported both ways:
``merged`` loads in the family's class (``Qwen2AudioForConditionalGeneration``,
``Qwen3VLForConditionalGeneration``) with the trained logits, and ``adapter`` is a PEFT adapter of
that class (``PeftModel.from_pretrained``) with the trained logits, injected into the language
model's layers only; omnicore's own loader reads either export back to the same logits. Qwen3-VL's
sample holds an image, so its DeepStack rows run through the adapted layers."""

from __future__ import annotations

import json
import wave

import numpy as np
import pytest
import torch
from PIL import Image

from omnicore.testing.distributed import max_rel_diff

LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
USER = {
    "qwen2_audio": [{"type": "text", "text": "Audio 1: "}, {"type": "audio", "path": "a.wav"}, {"type": "text", "text": "\nWhat is it?"}],
    "qwen3_vl": [{"type": "image", "path": "a.png"}, {"type": "text", "text": "What is it?"}],
}
TOWER = {"qwen2_audio": "audio_tower", "qwen3_vl": ".visual."}
"""A name part of the family's tower modules, where no adapter may go."""


def _write_media(root, family):
    if family == "qwen2_audio":
        samples = (0.2 * np.random.default_rng(0).standard_normal(8000)).clip(-1, 1)
        with wave.open(str(root / "a.wav"), "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
            w.writeframes((samples * 32767).astype("<i2").tobytes())
    else:
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8)).save(root / "a.png")


@pytest.fixture(scope="module", params=sorted(USER))
def trained(request, tmp_path_factory):
    """A family's stand-in with LoRA whose adapters moved (lora_B nonzero, as after training)."""
    import importlib

    from omnicore.config import Config
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.packing import collate
    from omnicore.model.build import build_omni_model
    from omnicore.model.lora import apply_lora
    from omnicore.testing import read_jsonl

    family = request.param
    root = tmp_path_factory.mktemp(f"lora_{family}")
    standin = importlib.import_module(f"omnicore_family_{family}.standin").save_standin(root / "standin")
    _write_media(root, family)
    sample = {"messages": [{"role": "user", "content": USER[family]}, {"role": "assistant", "content": "noise"}]}
    (root / "train.jsonl").write_text(json.dumps(sample) + "\n")
    cfg = Config.model_validate(
        {
            "run": {"output_dir": str(root / "run"), "seed": 0},
            "model": {"foundation": {"name": family, "options": {"checkpoint": str(standin)}}, "lora": dict(LORA)},
            "data": {"train": str(root / "train.jsonl")},
        }
    )
    torch.manual_seed(0)
    model, tok = build_omni_model(cfg)
    adapted = apply_lora(model, cfg.model.lora, seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(len(name)))
    model.eval()
    proc = ChatProcessor.for_model(tok, model, cfg.data)
    encoded = proc.encode(read_jsonl(root / "train.jsonl")[0])
    batch = collate([encoded], model.encoder_processors(), {})
    with torch.no_grad():
        want = model(batch, return_logits=True).logits[0]
    return {
        "family": family,
        "cfg": cfg,
        "model": model,
        "tok": tok,
        "root": root,
        "standin": standin,
        "adapted": adapted,
        "want": want,
        "batch": batch,
    }


def _hf_inputs(folder, trained):
    """The sample as the family's class takes it: from the export's own processor (Qwen2-Audio), or
    from the collated batch (Qwen3-VL, whose processor needs torchvision for video; the plugin's
    tests check its ids against that processor's)."""
    if trained["family"] == "qwen3_vl":
        ids, image = trained["batch"].input_ids, trained["batch"].encoder_inputs["image"]
        types = (ids == trained["tok"].convert_tokens_to_ids("<|image_pad|>")).int()
        return {
            "input_ids": ids,
            "pixel_values": image["pixel_values"],
            "image_grid_thw": image["image_grid_thw"],
            "mm_token_type_ids": types,
        }
    from transformers import AutoProcessor

    from omnicore.api import load_audio

    proc = AutoProcessor.from_pretrained(folder)
    messages = [
        {"role": "user", "content": [{"type": "audio", "audio_url": "a.wav"}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "noise"},
    ]
    text = proc.apply_chat_template(messages, tokenize=False)
    return proc(text=text, audio=[load_audio(trained["root"] / "a.wav").samples], sampling_rate=16000, return_tensors="pt")


def _export(trained, tmp_path, mode):
    import copy

    from omnicore.checkpoint.export import write_export

    cfg = trained["cfg"].model_copy(deep=True)
    cfg.model.lora.export = mode
    model = copy.deepcopy(trained["model"])  # the export changes the model in place (merge or strip)
    out = tmp_path / "export"
    write_export(model, trained["tok"], cfg, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["merged", "adapter"])
def test_family_lora_export_gives_the_trained_logits_in_transformers_and_in_omnicore(trained, tmp_path, mode):
    import transformers
    from peft import PeftModel

    from omnicore.eval.loading import load_trained

    out = _export(trained, tmp_path, mode)
    inputs = _hf_inputs(out, trained)
    assert inputs["input_ids"][0].tolist() == trained["batch"].input_ids[0].tolist()
    family_class = getattr(transformers, json.loads((out / "config.json").read_text())["architectures"][0])
    base = family_class.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        base_logits = base(**inputs).logits[0]
    if mode == "merged":
        assert not (out / "foundation_lora").exists()
        got = base_logits
    else:
        cfg = json.loads((out / "foundation_lora" / "adapter_config.json").read_text())
        # every target is a full name in the class, under its language model, none in the tower
        assert cfg["target_modules"] and all(t.startswith("model.language_model.layers.") for t in cfg["target_modules"])
        assert len(cfg["target_modules"]) == len(trained["adapted"])
        peft_model = PeftModel.from_pretrained(base, out / "foundation_lora").eval()
        injected = [n for n, m in peft_model.named_modules() if hasattr(m, "lora_A") and n.endswith(("q_proj", "v_proj", "down_proj"))]
        assert len(injected) == len(trained["adapted"]) and not any(TOWER[trained["family"]] in n for n in injected)
        with torch.no_grad():
            got = peft_model(**inputs).logits[0]
        assert max_rel_diff(base_logits, trained["want"]) > 1e-3  # without the adapter the logits differ
    torch.testing.assert_close(got, trained["want"], atol=1e-5, rtol=0)
    reloaded, _, _ = load_trained(trained["cfg"], export=str(out))
    with torch.no_grad():
        again = reloaded(trained["batch"], return_logits=True).logits[0]
    torch.testing.assert_close(again, trained["want"], atol=1e-5, rtol=0)
