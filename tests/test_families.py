"""What a published model family needs from the core (issue 24), proven with a toy family plugin:

* a foundation that brings its towers (``Foundation.encoders()``): one config entry builds them;
* two modalities encoded by one module (``model.encoders.<m>.share``), as Qwen2-VL's one vision
  tower encodes images and video;
* a processor's own placeholder and wrap tokens (``Processor.placeholder`` / ``wrap``), which
  the tokenizer already has, so its vocabulary is left as published;
* a tower read from its part of a composite checkpoint on the meta device (``plan_checkpoint``
  with key ``renames``), filled after sharding as the LM is.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY_LM
from safetensors.torch import save_file

from omnicore.config import Config
from omnicore.data.chat import ChatProcessor
from omnicore.data.jsonl import Message, Part, Sample
from omnicore.data.packing import collate
from omnicore.model.build import build_omni_model, prepare_tokenizer
from omnicore.model.foundation import byte_tokenizer
from omnicore.model.loading import LoadError, checkpoint_index, fill_now, fill_pending, on_meta, plan_checkpoint, plan_load
from omnicore.registry import RegistryError

TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
FAMILY_TOKENS = ["<|im_start|>", "<|im_end|>", "<img>", "<vid>", "<vs>", "<ve>"]

HOOK = """
from omnicore.components import ComponentSpec
from omnicore.hookspecs import hookimpl

@hookimpl
def omnicore_foundations():
    return [ComponentSpec(name="toyfam", target="toyfam:build_foundation")]

@hookimpl
def omnicore_encoders():
    return [
        ComponentSpec(name="toyvis", target="toyfam:build_tower", processor="toyfam:image_processor", modalities=("image", "video")),
        ComponentSpec(name="toyvid", target="toyfam:build_tower", processor="toyfam:video_processor", modalities=("video",)),
    ]
"""

TOYS = """
import torch
from torch import nn

from omnicore.api import on_meta, plan_checkpoint
from omnicore.model.foundation import HFCausalLM

PATCH = 4  # one token per 4 values

class ImageProcessor:
    modality = "image"
    placeholder = "<img>"
    wrap = ("<vs>", "<ve>")
    def preprocess(self, media):
        return {"values": torch.as_tensor(media, dtype=torch.float32).reshape(-1, PATCH)}
    def num_tokens(self, features):
        return int(features["values"].shape[0])
    def collate(self, items):
        return {"values": torch.cat([i["values"] for i in items])}

class VideoProcessor(ImageProcessor):
    modality = "video"
    placeholder = "<vid>"
    def preprocess(self, media):  # frames averaged in pairs: the tower sees the same layout as an image
        v = torch.as_tensor(media, dtype=torch.float32)
        return {"values": v.reshape(-1, 2, PATCH).mean(1)}

def image_processor(options):
    return ImageProcessor()

def video_processor(options):
    return VideoProcessor()

class Tower(nn.Module):
    modality = "image"
    modalities = ("image", "video")
    def __init__(self, hidden_size):
        super().__init__()
        self.tower = nn.Sequential(nn.Linear(PATCH, 8), nn.Tanh(), nn.Linear(8, hidden_size))
        self.processor = ImageProcessor()
        self.calls = []
    def forward(self, batch):
        self.calls.append(int(batch["values"].shape[0]))
        return self.tower(batch["values"])
    def dummy_batch(self):
        return {"values": torch.zeros(1, PATCH)}
    def save_pretrained(self, path):
        raise NotImplementedError

def build_tower(options, *, hidden_size):
    with on_meta():
        module = Tower(hidden_size)
    module.omnicore_pending_load = plan_checkpoint(
        module, options["checkpoint"], renames={"model.visual.": "tower.", "visual.": "tower."},
        ignore_unused=["model.language_model"], what="model.encoders.image.options.checkpoint",
    )
    return module

class Family(HFCausalLM):
    def __init__(self, options):
        self.folder = options["checkpoint"]
        super().__init__({"config": options["lm"], "tokenizer": options["checkpoint"]})
    def export_pretrained(self, model, tokenizer, folder):
        from safetensors.torch import save_file
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {"model.visual." + k: v.contiguous() for k, v in model.encoders["image"].tower.state_dict().items()}
        tensors["model.language_model.embed_tokens.weight"] = model.lm.get_input_embeddings().weight.detach().contiguous()
        save_file(tensors, str(folder / "model.safetensors"))
        tokenizer.save_pretrained(folder)
    def part_names(self):
        return {"vision_tower": ["encoders.image.tower.0"], "merger": ["encoders.image.tower.2"], "language_model": ["lm"]}
    def encoders(self):
        return {
            "image": {"name": "toyvis", "options": {"checkpoint": self.folder}},
            "video": {"name": "toyvid", "share": "image", "options": {"checkpoint": self.folder}},
        }

def build_foundation(options):
    return Family(dict(options))
"""


def family_tokenizer():
    tok = byte_tokenizer()
    tok.add_special_tokens({"pad_token": "<pad>", "additional_special_tokens": FAMILY_TOKENS})
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture
def family(fake_distribution, isolated_registry, tmp_path):
    """``(registry, folder, tensors)``: the toy family installed, and a composite checkpoint
    folder (its tokenizer, and the tower under ``layout``'s prefix plus an LM tensor to ignore)."""
    fake_distribution("omnicore-toyfam", "1.0", {"toyfam": "toyfam_hook"}, {"toyfam_hook": HOOK, "toyfam": TOYS})
    import toyfam_hook

    folder = tmp_path / "published"
    family_tokenizer().save_pretrained(folder)
    g = torch.Generator().manual_seed(3)
    tower = {
        "0.weight": torch.randn(8, 4, generator=g),
        "0.bias": torch.randn(8, generator=g),
        "2.weight": torch.randn(TINY_LM["hidden_size"], 8, generator=g),
        "2.bias": torch.randn(TINY_LM["hidden_size"], generator=g),
    }
    return isolated_registry(toyfam_hook, builtins=True), folder, tower


def _save(folder, tower, prefix):
    tensors = {prefix + k: v for k, v in tower.items()}
    tensors["model.language_model.embed_tokens.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(folder / "model.safetensors"))


def _config(folder, tmp_path, **encoders):
    raw = {
        "run": {"output_dir": str(tmp_path / "run")},
        "model": {"foundation": {"name": "toyfam", "options": {"checkpoint": str(folder), "lm": dict(TINY_LM)}}, "encoders": encoders},
        "data": {"train": "unused.jsonl"},
    }
    return Config.model_validate(copy.deepcopy(raw))


@pytest.mark.parametrize("prefix", ["model.visual.", "visual."])
def test_one_foundation_entry_builds_its_towers_shared_and_loaded_from_the_composite_checkpoint(family, tmp_path, prefix):
    """The config names only the foundation: the image tower comes from its checkpoint (either
    published key layout), video shares it, and the tokenizer keeps its published vocabulary."""
    registry, folder, tower = family
    _save(folder, tower, prefix)
    cfg = _config(folder, tmp_path)
    model, tok = build_omni_model(cfg, registry, defer_load=True)
    assert sorted(cfg.model.encoders) == ["image", "video"] and cfg.model.encoders["video"].share == "image"
    assert list(model.encoders) == ["image"] and model.shared["video"][0] == "image"
    assert type(model.shared["video"][1]).__name__ == "VideoProcessor"
    assert len(tok) == len(family_tokenizer())  # nothing added: every token the family needs is its own
    enc = model.encoders["image"]
    assert all(p.is_meta for p in enc.parameters())
    assert sorted(p.prefix for p in model.pending_loads) == ["encoders.image."]
    fill_pending(model)
    for name, value in tower.items():
        assert torch.equal(dict(enc.tower.named_parameters())[name], value)


def test_shared_module_encodes_both_modalities_with_the_processors_own_tokens(family, tmp_path):
    registry, folder, tower = family
    _save(folder, tower, "model.visual.")
    cfg = _config(folder, tmp_path)
    model, tok = build_omni_model(cfg, registry)
    proc = ChatProcessor.for_model(tok, model, cfg.data)
    image, video = torch.arange(12.0).reshape(3, 4), torch.arange(32.0).reshape(8, 4) / 7
    sample = Sample(
        [Message("user", [Part("text", "a"), Part("image", "i"), Part("video", "v")]), Message("assistant", [Part("text", "b")])],
        "x.jsonl",
        1,
    )
    import omnicore.data.chat as chat

    media = {"i": image.numpy(), "v": video.numpy()}
    old = dict(chat.LOADERS)
    chat.LOADERS.update({"image": media.__getitem__, "video": media.__getitem__})
    try:
        enc = proc.encode(sample)
    finally:
        chat.LOADERS.update(old)
    ids = tok.convert_tokens_to_ids
    text = tok.encode
    want = (
        text("<|im_start|>user\n", add_special_tokens=False)
        + text("a", add_special_tokens=False)
        + [ids("<vs>")] + [ids("<img>")] * 3 + [ids("<ve>")]
        + [ids("<vs>")] + [ids("<vid>")] * 4 + [ids("<ve>")]
        + text("<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n", add_special_tokens=False)
    )  # fmt: skip
    assert enc.input_ids == want
    mb = collate([enc], model.encoder_processors(), {})
    model.encoders["image"].calls.clear()
    with torch.no_grad():
        embeds, _, _ = model.embed(mb.input_ids, mb.encoder_inputs, {})
        tower_fn = model.encoders["image"].tower
        img_rows = tower_fn(image.reshape(-1, 4))
        vid_rows = tower_fn(video.reshape(-1, 2, 4).mean(1))
    row = torch.tensor(enc.input_ids)
    assert torch.allclose(embeds[0][row == ids("<img>")], img_rows, atol=0, rtol=0)
    assert torch.allclose(embeds[0][row == ids("<vid>")], vid_rows, atol=0, rtol=0)
    assert model.encoders["image"].calls == [3, 4]  # once per modality, no dummy pass: both had input


def test_a_shared_module_is_called_once_per_modality_whatever_the_batch_holds(family, tmp_path):
    """FSDP2 all-gathers on every call of a sharded module, so every rank must call each encoder
    module equally often in the same order whatever its micro-batch holds: once per modality the
    module encodes, on the real input or on its dummy batch (one row)."""
    registry, folder, tower = family
    _save(folder, tower, "model.visual.")
    cfg = _config(folder, tmp_path)
    model, tok = build_omni_model(cfg, registry)
    enc = model.encoders["image"]
    ph = {m: tok.convert_tokens_to_ids(t) for m, t in (("image", "<img>"), ("video", "<vid>"))}
    assert model.token_ids["encoder"]["image"] == ph["image"] and model.token_ids["encoder"]["video"] == ph["video"]
    text = tok.encode("hello", add_special_tokens=False)
    width = enc.dummy_batch()["values"].shape[1]
    cases = {
        (): ({}, [1, 1]),
        ("image",): ({"image": {"values": torch.ones(2, width)}}, [2, 1]),
        ("video",): ({"video": {"values": torch.ones(3, width)}}, [1, 3]),
    }
    for held, (inputs, want) in cases.items():
        ids = torch.tensor([text + [ph[m] for m in held for _ in range(inputs[m]["values"].shape[0])]])
        enc.calls.clear()
        with torch.no_grad():
            model.embed(ids, inputs, {})
        assert enc.calls == want, held


def test_share_errors_name_the_field(family, tmp_path):
    registry, folder, tower = family
    _save(folder, tower, "model.visual.")
    with pytest.raises(ValueError, match=r"model.encoders.video.share: 'imgae' is not another encoder key \(encoders: image\)"):
        _config(
            folder, tmp_path, image={"name": "toyvis", "options": {"checkpoint": str(folder)}}, video={"name": "toyvid", "share": "imgae"}
        )
    with pytest.raises(ValueError, match=r"model.decoders.image.share: only encoders share a module"):
        Config.model_validate({"model": {"decoders": {"image": {"name": "x", "share": "audio"}}}, "data": {"train": "t.jsonl"}})
    # a module that does not encode the sharing modality
    cfg = _config(
        folder, tmp_path, image={"name": "toyvis", "options": {"checkpoint": str(folder)}}, video={"name": "toyvid", "share": "image"}
    )
    from toyfam import Tower

    Tower.modalities = ("image",)
    try:
        with pytest.raises(RegistryError, match=r"model.encoders.video.share: image: the image encoder \(Tower\) does not encode video"):
            build_omni_model(cfg, registry)
    finally:
        Tower.modalities = ("image", "video")


def test_two_modalities_may_not_share_a_placeholder_token():
    from omnicore.data.chat import placeholder_ids

    class P:
        placeholder = "<img>"

    tok = family_tokenizer()
    with pytest.raises(ValueError, match=r"encoder modalities \['image', 'video'\] use one placeholder token"):
        placeholder_ids(tok, {"image": P(), "video": P()}, [])
    with pytest.raises(ValueError, match=r"tokenizer lacks the special tokens \['<|audio_pad|>'\]"):
        placeholder_ids(tok, ["audio"], [])


def test_prepare_tokenizer_adds_only_what_is_missing():
    """A published tokenizer with a usable template and a pad token gains nothing; the byte
    tokenizer gains ChatML's tokens, ``<|pad|>`` and the placeholders, in the fixed order."""
    tok = family_tokenizer()
    before = dict(tok.get_vocab())

    class P:
        placeholder, wrap = "<img>", ("<vs>", "<ve>")

    prepare_tokenizer(tok, {"image": P()}, [])
    assert tok.get_vocab() == before and tok.eos_token == "<|im_end|>" and tok.pad_token == "<pad>"
    plain = prepare_tokenizer(byte_tokenizer(), ["image"], ["audio"])
    added = [plain.convert_ids_to_tokens(i) for i in range(256, len(plain))]
    assert added == ["<|im_start|>", "<|im_end|>", "<|pad|>", "<|image_pad|>", "<|audio_start|>", "<|audio_out|>"]
    # chatml asked for on a templated tokenizer that lacks ChatML's tokens: they are added
    templ = byte_tokenizer()
    templ.add_special_tokens({"pad_token": "<pad>", "additional_special_tokens": ["<s>", "</s>"]})
    templ.chat_template = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
    n = len(templ)
    prepare_tokenizer(templ, [], [], chat_template="chatml")
    assert [templ.convert_ids_to_tokens(i) for i in range(n, len(templ))] == ["<|im_start|>", "<|im_end|>"]


def test_plan_load_renames_read_a_part_of_a_composite_checkpoint(tmp_path):
    """``renames`` are tried after the name itself, first match wins; a parameter under no layout
    is reported missing with its own name."""
    module = torch.nn.Sequential()
    module.tower = torch.nn.Linear(2, 3)
    module.head = torch.nn.Linear(3, 1)
    save_file(
        {"visual.weight": torch.ones(3, 2), "visual.bias": torch.zeros(3), "head.weight": torch.ones(1, 3), "head.bias": torch.ones(1)},
        str(tmp_path / "model.safetensors"),
    )
    entries = checkpoint_index(tmp_path)
    plan = plan_load(module, tmp_path, entries, prefix="", renames={"model.visual.": "tower.", "visual.": "tower."})
    assert plan.sources == {
        "tower.weight": "visual.weight",
        "tower.bias": "visual.bias",
        "head.weight": "head.weight",
        "head.bias": "head.bias",
    }
    with pytest.raises(LoadError, match=r"tower.weight"):
        plan_load(module, tmp_path, entries, prefix="", renames={"model.visual.": "tower."}, ignore_unused=["visual"])


def test_other_parts_leave_the_rest_of_a_composite_checkpoint_unused(tmp_path):
    """``plan_checkpoint(other_parts=...)`` leaves the tensors under those prefixes unused where
    present, and a prefix of a layout this folder does not use is no error (an ``ignore_unused``
    pattern that matches nothing is); without it the other part's tensors are reported unused;
    ``fill_now`` then reads the plan's tensors on this process."""
    save_file(
        {"visual.weight": torch.full((3, 2), 2.0), "visual.bias": torch.zeros(3), "language_model.norm.weight": torch.ones(3)},
        str(tmp_path / "model.safetensors"),
    )
    with on_meta():
        tower = torch.nn.Linear(2, 3)
    renames = {"visual.": ""}
    with pytest.raises(LoadError, match=r"does not use: 'language_model.norm.weight'"):
        plan_checkpoint(tower, tmp_path, renames=renames)
    with pytest.raises(LoadError, match=r"ignore_unused patterns match nothing: \['model.language_model'\]"):
        plan_checkpoint(tower, tmp_path, renames=renames, ignore_unused=["language_model", "model.language_model"])
    tower.omnicore_pending_load = plan_checkpoint(tower, tmp_path, renames=renames, other_parts=["model.language_model", "language_model"])
    assert tower.omnicore_pending_load.sources == {"weight": "visual.weight", "bias": "visual.bias"}
    filled = fill_now(tower)
    assert torch.equal(filled.weight, torch.full((3, 2), 2.0)) and torch.equal(filled.bias, torch.zeros(3))
    assert not hasattr(filled, "omnicore_pending_load")


def test_freeze_and_lr_multipliers_take_the_familys_part_names(family, tmp_path):
    """A part name stands for its prefixes; module prefixes still work beside it; a typo names the parts."""
    from omnicore.config import ConfigError
    from omnicore.model.trainable import apply_freeze, lr_factors

    registry, folder, tower = family
    _save(folder, tower, "model.visual.")
    model, _ = build_omni_model(_config(folder, tmp_path), registry)
    assert model.part_names == {"vision_tower": ["encoders.image.tower.0"], "merger": ["encoders.image.tower.2"], "language_model": ["lm"]}
    apply_freeze(model, ["vision_tower"])
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    assert frozen == ["encoders.image.tower.0.bias", "encoders.image.tower.0.weight"]
    factors = lr_factors(model, {"merger": 10.0, "language_model": 0.5, "lm.lm_head": 2.0})
    named = dict(model.named_parameters())
    assert factors[id(named["encoders.image.tower.2.weight"])] == 10.0
    assert factors[id(named["lm.model.norm.weight"])] == 0.5
    assert factors[id(named["lm.lm_head.weight"])] == 2.0  # the more specific prefix wins over the part
    with pytest.raises(
        ConfigError,
        match=r"train.freeze\[0\]: 'vision_towr' matches no module.*its family's part names: language_model, merger, vision_tower",
    ):
        apply_freeze(model, ["vision_towr"])


def test_export_writes_the_family_layout_and_a_config_that_rebuilds_from_it(family, tmp_path):
    """With ``export_pretrained`` the export is the family's own folder (no foundation/ or
    encoders/ of omnicore's), and its ``omnicore.yaml`` names only the foundation, at ``.``: a
    later stage started from it (``model.init_from``) gets the trained tower back."""
    import yaml

    from omnicore.checkpoint.export import write_export
    from omnicore.checkpoint.init_from import apply_export

    registry, folder, tower = family
    _save(folder, tower, "visual.")
    cfg = _config(folder, tmp_path)
    model, tok = build_omni_model(cfg, registry)
    with torch.no_grad():
        model.encoders["image"].tower[0].weight.add_(1.0)  # "trained"
    import omnicore.model.build as build

    real = build.registry_for
    build.registry_for = lambda cfg: registry
    try:
        write_export(model, tok, cfg, tmp_path / "export")
        section = yaml.safe_load((tmp_path / "export" / "omnicore.yaml").read_text())["model"]
        assert (tmp_path / "export" / "model.safetensors").is_file() and (tmp_path / "export" / "tokenizer.json").is_file()
        assert section["foundation"]["options"]["checkpoint"] == "." and section["encoders"] == {}
        again = apply_export(_config(folder, tmp_path), tmp_path / "export")
        model2, _ = build_omni_model(again, registry)
    finally:
        build.registry_for = real
    assert torch.equal(model2.encoders["image"].tower[0].weight, model.encoders["image"].tower[0].weight)
    assert not (tmp_path / "export" / "foundation").exists() and not (tmp_path / "export" / "encoders").exists()


def test_plan_shows_each_family_part(family, tmp_path):
    """``omnicore plan`` counts parameters and per-rank bytes per family part; they add up to
    the whole, and a frozen part carries no gradient or AdamW bytes."""
    from omnicore.parallel.plan import make_plan

    registry, folder, tower = family
    _save(folder, tower, "model.visual.")
    cfg = _config(folder, tmp_path)
    cfg.train.freeze = ["vision_tower"]
    report = make_plan(cfg, 1, registry)
    n_tower0 = tower["0.weight"].numel() + tower["0.bias"].numel()
    n_merger = tower["2.weight"].numel() + tower["2.bias"].numel()
    assert sorted(report.parts) == ["language_model", "merger", "vision_tower"]
    assert report.parts["vision_tower"] == [n_tower0, 0, 4 * n_tower0]
    assert report.parts["merger"] == [n_merger, n_merger, 4 * 4 * n_merger]  # fp32 parameter, gradient, two AdamW states
    assert sum(v[0] for v in report.parts.values()) == report.params
    assert (
        sum(v[2] for v in report.parts.values())
        == report.param_bytes_per_rank + report.grad_bytes_per_rank + report.optimizer_bytes_per_rank
    )
    assert "  vision_tower: 40 parameters (trainable 0)" in report.render()


def test_a_decoder_processor_names_its_own_start_and_placeholder_tokens(tmp_path):
    """A decoder processor's ``start`` and ``placeholder`` (CSM's ``<|end_of_text|>`` and
    ``<|AUDIO|>``) replace ``<|m_start|>`` / ``<|m_out|>``: the tokenizer keeps its vocabulary, the
    start token is a text target, the placeholders are not; a start token that is a placeholder
    is refused."""
    from omnicore.data.chat import placeholder_ids

    class Speech:
        modality, start, placeholder, codes_per_token = "audio", "<s>", "<vid>", 2

        def preprocess(self, media):
            return {"n": 3}

        def num_tokens(self, features):
            return features["n"]

        def collate(self, items):
            return {"n": [it["n"] for it in items]}

    tok = family_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<s>"]}, replace_extra_special_tokens=False)
    before = dict(tok.get_vocab())
    prepare_tokenizer(tok, {}, {"audio": Speech()})
    assert tok.get_vocab() == before
    ids = placeholder_ids(tok, {}, {"audio": Speech()})
    start, out = tok.convert_tokens_to_ids("<s>"), tok.convert_tokens_to_ids("<vid>")
    assert ids["decoder"] == {"audio": out} and ids["decoder_start"] == {"audio": start}
    wav = tmp_path / "a.wav"
    wav.write_bytes(b"")
    proc = ChatProcessor(tok, {}, {"audio": Speech()})
    proc._media = lambda kind, path, side, where: (Speech().preprocess(None), Speech())  # no file to read
    sample = Sample([Message("user", [Part("text", "hi")]), Message("assistant", [Part("audio", str(wav))])], "x.jsonl", 1)
    enc = proc.encode(sample)
    i = enc.input_ids.index(start)
    assert enc.input_ids[i + 1 : i + 4] == [out] * 3 and enc.labels[i - 1] == start
    assert enc.labels[i : i + 3] == [-100] * 3 and enc.n_targets == 2 + 3 * 2  # start, <|im_end|>; 3 frames of 2 codes

    class Clash(Speech):
        start = "<vid>"

    with pytest.raises(ValueError, match=r"start and placeholder are both '<vid>'"):
        placeholder_ids(tok, {}, {"audio": Clash()})

    class OnImage(Speech):
        start = "<img>"

    class Img:
        placeholder = "<img>"

    with pytest.raises(ValueError, match=r"decoder modalities \['audio'\] share a placeholder token"):
        placeholder_ids(tok, {"image": Img()}, {"audio": OnImage()})
