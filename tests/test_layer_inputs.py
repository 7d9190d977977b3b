"""Encoder rows for the foundation's intermediate layers (``omnicore.api.EncoderOutput``, the core
side of DeepStack): gathered over modalities in sequence order, handed to the foundation's
``layer_inputs``, kept in the graph by dummy passes, refused where they cannot be used, cut by
Ulysses with the sequence, and an encoder item written as several runs (``Processor.runs``). The published Qwen3-VL family checks
the same path against transformers (``plugins/omnicore-family-qwen3-vl/tests/test_model.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from omnicore.components import EncoderOutput
from omnicore.data.packing import MicroBatch
from omnicore.model.omni import OmniModel, PlaceholderMismatch

H, IMG, VID = 16, 30, 31


def _lm():
    """A tiny Qwen3-VL text model under its head (it takes DeepStack rows)."""
    from transformers import Qwen3VLConfig

    from omnicore.model.mrope import build_mrope_lm

    text = {
        "vocab_size": 40,
        "hidden_size": H,
        "intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
    }
    vision = {"depth": 1, "hidden_size": 8, "intermediate_size": 8, "num_heads": 1, "out_hidden_size": H, "deepstack_visual_indexes": [0]}
    torch.manual_seed(0)
    return build_mrope_lm(Qwen3VLConfig(text_config=text, vision_config=vision)).eval()


class Tower(nn.Module):
    """Rows from 4 values per token, plus ``depth`` sets of layer rows (none: a plain tensor)."""

    def __init__(self, modality: str, depth: int):
        super().__init__()
        self.modality = modality
        self.proj = nn.Linear(4, H)
        self.layers = nn.ModuleList(nn.Linear(4, H) for _ in range(depth))

    def forward(self, batch):
        x = batch["values"]
        return EncoderOutput(self.proj(x), [m(x) for m in self.layers]) if len(self.layers) else self.proj(x)

    def dummy_batch(self):
        return {"values": torch.zeros(1, 4)}


def _model(image_depth=2, video_depth=2, seen=None):
    model = OmniModel(
        _lm(),
        {"image": Tower("image", image_depth), "video": Tower("video", video_depth)},
        {},
        {"encoder": {"image": IMG, "video": VID}, "decoder": {}, "decoder_start": {}},
    )

    def layer_inputs(mask, per_layer):
        if seen is not None:
            seen.append((mask, per_layer))
        return {"visual_pos_masks": mask, "deepstack_visual_embeds": per_layer}

    model.layer_inputs = layer_inputs
    return model


IDS = [1, VID, VID, 2, IMG, 3, VID, IMG, IMG, 4]


def _batch(encoder_inputs, ids=IDS):
    t = len(ids)
    return MicroBatch(
        input_ids=torch.tensor([ids]),
        labels=torch.tensor([ids[1:] + [-100]]),
        position_ids=torch.arange(t)[None],
        encoder_inputs=encoder_inputs,
    )


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"image": {"values": torch.randn(3, 4, generator=g)}, "video": {"values": torch.randn(3, 4, generator=g)}}


def test_layer_rows_are_joined_in_sequence_order_over_modalities():
    seen: list = []
    model = _model(seen=seen)
    inputs = _inputs()
    with torch.no_grad():
        model(_batch(inputs), return_logits=True)
        img, vid = model.encoders["image"](inputs["image"]), model.encoders["video"](inputs["video"])
    (mask, per_layer), ids = seen[0], torch.tensor(IDS)
    assert mask[0].tolist() == [i in (IMG, VID) for i in IDS] and len(per_layer) == 2
    for k in range(2):  # row j of the joined layer is the j-th visual position's own row
        want = torch.zeros(6, H)
        want[ids[mask[0]] == IMG], want[ids[mask[0]] == VID] = img.layer_embeds[k], vid.layer_embeds[k]
        assert torch.equal(per_layer[k], want)


def test_the_layer_rows_reach_the_foundation():
    model, inputs = _model(), _inputs()
    with torch.no_grad():
        full = model(_batch(inputs), return_logits=True).logits
        model.layer_inputs = lambda mask, per_layer: {}
        without = model(_batch(inputs), return_logits=True).logits
    assert not torch.allclose(full, without, atol=1e-4)
    assert torch.equal(full[0, 0], without[0, 0])  # the first token sits before every visual row


def test_only_modalities_with_layer_rows_are_in_the_mask():
    seen: list = []
    model = _model(image_depth=0, seen=seen)  # the image tower returns a plain tensor
    with torch.no_grad():
        model(_batch(_inputs()), return_logits=True)
    assert seen[0][0][0].tolist() == [i == VID for i in IDS] and seen[0][1][0].shape == (3, H)


def test_dummy_passes_keep_the_layer_rows_in_the_graph():
    model = _model()
    ids = [1, IMG, IMG, 2]
    out = model(_batch({"image": {"values": torch.randn(2, 4)}}, ids))  # no video: its tower runs on its dummy batch
    out.loss_sum.backward()
    missing = [n for n, p in model.encoders.named_parameters() if p.grad is None]
    assert not missing, missing


def test_layer_rows_the_model_cannot_use_are_refused():
    model = _model()
    model.layer_inputs = None
    with pytest.raises(ValueError, match=r"rows for 2 foundation layers .* the foundation takes none"):
        model(_batch(_inputs()))
    with pytest.raises(PlaceholderMismatch, match=r"different numbers of foundation layers \[1, 2\]"):
        _model(image_depth=1)(_batch(_inputs()))


def test_ulysses_cuts_the_layer_rows_with_the_sequence():
    """Ulysses' sequence hook gives each rank its positions of the mask and their rows (the row is
    padded to a multiple of sp first), rebuilt through the model's ``layer_kwargs``; without
    ``layer_rows`` to cut from it refuses."""
    from types import SimpleNamespace

    from omnicore.model.omni import LayerRows
    from omnicore_parallel_ulysses.strategy import SequenceShard

    model = _model()
    ids = torch.tensor([IDS[:-1]])  # 9 tokens: padded to 10 for sp 2
    mask = (ids == IMG) | (ids == VID)
    rows = LayerRows(mask, [torch.arange(6.0)[:, None].expand(6, H), 10 + torch.arange(6.0)[:, None].expand(6, H)])
    seq = {
        "inputs_embeds": torch.zeros(1, 9, H),
        "position_ids": torch.arange(9)[None],
        "labels": torch.zeros(1, 9, dtype=torch.long),
        "decoder_labels": {},
        "cu_seqlens": torch.tensor([0, 9], dtype=torch.int32),
        "max_seqlen": 9,
        "foundation_kwargs": model.layer_kwargs(rows),
        "layer_inputs": ("visual_pos_masks", "deepstack_visual_embeds"),
        "layer_rows": rows,
    }
    got = [SequenceShard(SimpleNamespace(size=2, rank=r), False)(model, dict(seq)) for r in (0, 1)]
    assert [g["foundation_kwargs"]["visual_pos_masks"][0].tolist() for g in got] == [
        [False, True, True, False, True],
        [False, True, True, True, False],
    ]
    assert [g["foundation_kwargs"]["deepstack_visual_embeds"][1][:, 0].tolist() for g in got] == [[10, 11, 12], [13, 14, 15]]
    with pytest.raises(NotImplementedError, match=r"cannot slice the foundation's layer inputs \['visual_pos_masks'\]"):
        SequenceShard(SimpleNamespace(size=2, rank=0), False)(model, {**seq, "layer_rows": None, "layer_inputs": ("visual_pos_masks",)})


def test_an_item_written_as_runs_with_text_between():
    """``Processor.runs``: text before each run, each run wrapped and its own mRoPE block."""
    from omnicore.data.chat import ChatProcessor
    from omnicore.data.jsonl import Message, Part, Sample
    from omnicore.data.positions import RopeLayout
    from omnicore.model.build import prepare_tokenizer
    from omnicore.model.foundation import byte_tokenizer

    class Clip:
        modality, placeholder, wrap = "video", "<|video_pad|>", ("<vs>", "<ve>")

        def preprocess(self, media):
            return {"n": media}

        def num_tokens(self, f):
            return 4 * f["n"]

        def collate(self, items):
            return items

        def grid(self, f):
            return (f["n"], 2, 2)

        def runs(self, f):
            return [(f"<{i}s>", (1, 2, 2)) for i in range(f["n"])]

    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<vs>", "<ve>"]})
    tok = prepare_tokenizer(tok, {"video": Clip()}, [], chat_template="chatml")
    proc = ChatProcessor(tok, {"video": Clip()}, {}, rope=RopeLayout(3, "spatial"))
    import omnicore.data.chat as chat

    old = dict(chat.LOADERS)
    chat.LOADERS["video"] = lambda path: 2
    try:
        enc = proc.encode(Sample([Message("user", [Part("video", "v")]), Message("assistant", [Part("text", "x")])], "a.jsonl", 1))
    finally:
        chat.LOADERS.update(old)
    pads = "<|video_pad|>" * 4
    assert f"<0s><vs>{pads}<ve><1s><vs>{pads}<ve>" in tok.decode(enc.input_ids)
    s = enc.input_ids.index(tok.convert_tokens_to_ids("<vs>")) + 1  # the first run's first pad (index = position here)
    first = [row[s : s + 4] for row in enc.rope_position_ids]
    assert first == [[s] * 4, [s, s, s + 1, s + 1], [s, s + 1, s, s + 1]]
    # after the run, text resumes at s + max(h, w) = s + 2: <ve>, the 4 bytes of "<1s>", <vs>, then the second run
    second = s + 4 + 1 + 4 + 1
    assert [row[s + 4 : second] for row in enc.rope_position_ids] == [list(range(s + 2, s + 8))] * 3
    assert [row[second] for row in enc.rope_position_ids] == [s + 8] * 3
