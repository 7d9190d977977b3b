"""Cutting collated batches into items and costing them (``omnicore_parallel_encoder_balance.exchange``),
on the tiny digits model's SigLIP and Whisper processors; one process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import balance_cases as cases  # noqa: E402

from omnicore.api import ITEM_SEEDS  # noqa: E402
from omnicore_parallel_encoder_balance.exchange import (  # noqa: E402
    _as_bytes,
    _from_bytes,
    _nbytes,
    _spec,
    item_cost,
    split_items,
)


@pytest.fixture(scope="module")
def processors():
    from omnicore.api import Registry

    reg = Registry.discover()
    enc = cases.model_dict()["encoders"]
    return {m: reg.build_processor("encoder", e["name"], e["options"]) for m, e in enc.items()}


def test_stacked_batches_cut_into_items_that_collate_back(processors):
    image, audio = processors["image"], processors["audio"]
    pics = [image.preprocess(cases._image(s)) for s in range(3)]
    items = split_items(image, image.collate(pics))
    assert len(items) == 3 and all(torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(items, pics))
    clips = [audio.preprocess(cases._clip(s, i)) for i, s in enumerate((1.9, 0.7))]
    items = split_items(audio, audio.collate(clips))
    assert [audio.num_tokens(it) for it in items] == [19, 7]
    # features travel as bytes: the same tensors, dtypes and shapes come out (float32 mel, int64 frames)
    for it in items:
        spec = _spec(it)
        buf = torch.cat(_as_bytes(it))
        assert buf.numel() == _nbytes(spec)
        back = _from_bytes(buf, spec)
        assert all(torch.equal(back[k], it[k]) and back[k].dtype == it[k].dtype for k in it)


def test_batches_that_cannot_be_cut_are_refused(processors):
    image = processors["image"]
    assert split_items(image, {"pixel_values": torch.zeros(2, 3, 28, 28), "sizes": [28, 28]}) is None  # not all tensors
    assert split_items(image, {"a": torch.zeros(2, 3), "b": torch.zeros(3)}) is None  # two leading sizes
    assert split_items(image, {"pixel_values": torch.zeros(2, 3, 5, 5)}) is None  # collate refuses the items


def test_a_processor_split_member_is_used():
    class Concatenating:
        """Items of different lengths, concatenated (as patch-flattening processors collate)."""

        def collate(self, items):
            return {"x": torch.cat([it["x"] for it in items]), "n": torch.tensor([len(it["x"]) for it in items])}

        def split(self, batch):
            return [{"x": x} for x in batch["x"].split(batch["n"].tolist())]

    batch = Concatenating().collate([{"x": torch.arange(3.0)}, {"x": torch.arange(5.0)}])
    items = split_items(Concatenating(), batch)
    assert [len(it["x"]) for it in items] == [3, 5]
    # a training batch's item seeds: the processor's split never sees them, each item carries its own
    seeded = {**batch, ITEM_SEEDS: torch.tensor([11, 12])}
    items = split_items(Concatenating(), seeded)
    assert [int(it[ITEM_SEEDS]) for it in items] == [11, 12] and [len(it["x"]) for it in items] == [3, 5]


def test_item_seeds_of_a_stacked_batch_go_with_their_rows(processors):
    from omnicore.api import collate_items

    image = processors["image"]
    pics = [image.preprocess(cases._image(s)) for s in range(3)]
    batch = collate_items(image, pics, seeds=[7, 8, 9])
    items = split_items(image, batch)
    assert [int(it[ITEM_SEEDS]) for it in items] == [7, 8, 9]
    moved = collate_items(image, [items[2], items[0]])  # as a rank that encodes two of them collates them
    assert moved[ITEM_SEEDS].tolist() == [9, 7] and torch.equal(moved["pixel_values"][0], pics[2]["pixel_values"])


def test_costs_by_mode(processors):
    from omnicore.api import input_units

    image = processors["image"]
    pic = image.preprocess(cases._image(0))
    assert item_cost("tokens", None, image, pic) == 16.0
    assert item_cost("elements", None, image, pic) == input_units(pic) == 3 * 28 * 28

    class WithFlops:
        def flops(self, batch):
            return 1000.0 * batch["pixel_values"].shape[0]

    assert item_cost("auto", WithFlops(), image, pic) == 1000.0  # the component's own cost wins
    assert item_cost("auto", object(), image, pic) == 3 * 28 * 28
    clip = processors["audio"].preprocess(cases._clip(0.5, 0))
    # the padded mel window (what the encoder computes on), not the int64 valid_frames
    assert item_cost("elements", None, processors["audio"], clip) == input_units(clip) == 80 * 250
