"""Processors apart from weights (core API 1.2): ``ComponentSpec.processor``,
``Registry.build_processor`` (and its API 1.1 fallback), ``build_processors`` from a run config
without building any module, and ``ChatProcessor`` fed processors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from omnicore.components import ComponentSpec, Processor
from omnicore.registry import RegistryError

HOOK = """
from omnicore.components import ComponentSpec
from omnicore.hookspecs import hookimpl

@hookimpl
def omnicore_encoders():
    return [
        ComponentSpec(name="new", target="toys:build", processor="toys:build_processor",
                      options_model="toys:Options", modalities=("image",)),
    ]
"""

TOYS = """
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    side: int = Field(4, description="pixels per side")

class ToyProcessor:
    modality = "image"
    def __init__(self, side):
        self.side = side
    def preprocess(self, media):
        return {"pixels": torch.zeros(self.side, self.side)}
    def num_tokens(self, features):
        return int(features["pixels"].shape[0])
    def collate(self, items):
        return {"pixels": torch.stack([i["pixels"] for i in items])}

def build_processor(options):
    return ToyProcessor(options.get("side", 4))

class Toy(nn.Module, ToyProcessor):
    def __init__(self, side, hidden_size):
        nn.Module.__init__(self)
        ToyProcessor.__init__(self, side)
        self.proj = nn.Linear(1, hidden_size)

def build(options, *, hidden_size):
    return Toy(options.get("side", 4), hidden_size)
"""


@pytest.fixture
def toy_registry(fake_distribution, isolated_registry):
    fake_distribution("omnicore-toys", "1.0", {"toys": "toys_hook"}, {"toys_hook": HOOK, "toys": TOYS})
    import toys_hook

    return isolated_registry(toys_hook)


def test_spec_processor_only_for_encoders_and_decoders():
    assert ComponentSpec(name="d", target="m:f", processor="m:p").of_kind("decoder").processor == "m:p"
    with pytest.raises(ValueError, match=r"kernel/k: processor= is only for encoders and decoders"):
        ComponentSpec(name="k", target="m:f", processor="m:p").of_kind("kernel")
    with pytest.raises(ValueError, match=r"ComponentSpec e: processor 'm.p' must be 'module:factory'"):
        ComponentSpec(name="e", target="m:f", processor="m.p")
    for kind in ("encoder", "decoder"):  # API 2.0: the data side is always registered apart
        with pytest.raises(ValueError, match=rf"{kind}/e names no processor"):
            ComponentSpec(name="e", target="m:f").of_kind(kind)


def test_build_processor_validates_options_and_builds_no_module(toy_registry, monkeypatch):
    built = []
    init = nn.Module.__init__
    monkeypatch.setattr(nn.Module, "__init__", lambda self, *a, **k: (built.append(type(self).__name__), init(self, *a, **k))[1])
    proc = toy_registry.build_processor("encoder", "new", {"side": 3})
    assert (type(proc).__name__, proc.side, built) == ("ToyProcessor", 3, [])
    assert isinstance(proc, Processor) and proc.num_tokens(proc.preprocess(None)) == 3
    with pytest.raises(RegistryError, match=r"options of encoder/new: sides: unknown key; did you mean 'side'\?"):
        toy_registry.build_processor("encoder", "new", {"sides": 3})
    with pytest.raises(RegistryError, match=r"only encoders and decoders have processors, not 'kernel'"):
        toy_registry.build_processor("kernel", "sdpa", {})
    with pytest.raises(RegistryError, match=r"no encoder named 'neww'; did you mean 'new'\?"):
        toy_registry.build_processor("encoder", "neww", {})


def _config(tmp_path, **model):
    from conftest import tiny_config_dict

    from omnicore.config import Config

    d = tiny_config_dict(str(tmp_path / "train.jsonl"))
    d["model"].update(model)
    cfg = Config.model_validate(copy.deepcopy(d))
    cfg.source = str(tmp_path / "config.yaml")
    return cfg


def test_build_processors_builds_no_module_and_reads_no_weights(tmp_path, monkeypatch):
    from omnicore.model.build import build_processors
    from omnicore_image_siglip.encoder import build as build_siglip

    torch.manual_seed(0)
    build_siglip(
        {
            "config": {
                "image_size": 14,
                "patch_size": 7,
                "hidden_size": 16,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 32,
            }
        },
        hidden_size=8,
    ).save_pretrained(tmp_path / "sig")
    (tmp_path / "sig" / "model.safetensors").unlink()  # a processor that read weights would fail
    cfg = _config(tmp_path)
    cfg.model.encoders["image"].options = {"checkpoint": "sig"}  # relative to the config file's folder
    built = []
    init = nn.Module.__init__
    monkeypatch.setattr(nn.Module, "__init__", lambda self, *a, **k: (built.append(type(self).__name__), init(self, *a, **k))[1])
    encoders, decoders = build_processors(cfg)
    assert built == []
    assert {k: type(v).__name__ for k, v in encoders.items()} == {"image": "SiglipImageProcessor", "audio": "WhisperAudioProcessor"}
    assert {k: type(v).__name__ for k, v in decoders.items()} == {"image": "MoVQGANProcessor"}
    assert encoders["image"].tokens_per_image == 4  # (14 // 7) ** 2, from the checkpoint's config.json
    assert (decoders["image"].image_size, decoders["image"].downsample_factor) == (32, 4)


def test_build_processors_checks_the_modality_key(tmp_path):
    from omnicore.model.build import build_processors

    cfg = _config(tmp_path)
    cfg.model.encoders = {"audio": cfg.model.encoders["image"]}
    with pytest.raises(
        RegistryError,
        match=r"^model.encoders.audio: encoder 'siglip''s processor handles modality 'image', not 'audio'; "
        r"put it under model.encoders.image$",
    ):
        build_processors(cfg)
    cfg = _config(tmp_path)
    cfg.model.encoders["image"].options = {"checkpoint": "missing"}
    with pytest.raises(
        RegistryError,
        match=r"^model.encoders.image: options.checkpoint: 'missing' is neither a folder \(looked for '.*missing'\) nor a model",
    ):
        build_processors(cfg)


def test_chat_processor_fed_processors_counts_placeholders(tmp_path):
    from omnicore.data.chat import ChatProcessor, encoder_token
    from omnicore.data.jsonl import Message, Part, Sample
    from omnicore.model.build import build_processors, prepare_tokenizer
    from omnicore.model.foundation import byte_tokenizer

    cfg = _config(tmp_path)
    encoders, decoders = build_processors(cfg)
    tok = prepare_tokenizer(byte_tokenizer(), list(encoders), list(decoders))
    Image.fromarray(np.full((30, 20, 3), 200, np.uint8)).save(tmp_path / "x.png")
    chat = ChatProcessor(tok, encoders, decoders)
    sample = Sample([Message("user", [Part("image", str(tmp_path / "x.png")), Part("text", "hi")])], file="t.jsonl", line=1)
    enc = chat.encode(sample)
    pad = tok.convert_tokens_to_ids(encoder_token("image"))
    assert enc.input_ids.count(pad) == encoders["image"].tokens_per_image == 16  # (28 // 7) ** 2
    assert [(side, m, tuple(f["pixel_values"].shape)) for side, m, f in enc.media] == [("encoder", "image", (3, 28, 28))]


def test_module_processors_reads_each_modules_processor_and_names_one_without(toy_registry):
    from omnicore.data.chat import module_processors

    new = toy_registry.build("encoder", "new", {"side": 2}, hidden_size=4)
    new.processor = toy_registry.build_processor("encoder", "new", {"side": 3})
    got = module_processors({"image": new}, "encoder")
    assert got["image"] is new.processor and got["image"].side == 3
    del new.processor
    with pytest.raises(TypeError, match=r"encoder 'image' \(Toy\) has no processor attribute"):
        module_processors({"image": new}, "encoder")
