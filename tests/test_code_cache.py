"""The code cache: a frozen decoder tokenizer encodes each training target once (train.code_cache_mb)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_model import _build

from omnicore.data.jsonl import parse_line
from omnicore.data.packing import collate, features_digest
from omnicore.model.code_cache import ENTRY_OVERHEAD, CodeCache


@pytest.fixture(scope="module")
def built(digits_jsonl):
    return _build(digits_jsonl / "train.jsonl", "sdpa")


@pytest.fixture(scope="module")
def drawn(built, digits_jsonl):
    """The first three text_to_image samples (their target images differ), encoded."""
    _, _, proc = built
    path = digits_jsonl / "train.jsonl"
    out = []
    for lineno, text in enumerate(path.read_text().splitlines(), start=1):
        if json.loads(text)["task"] == "text_to_image":
            out.append(proc.encode(parse_line(text, str(path), lineno)))
        if len(out) == 3:
            return out
    raise AssertionError("fewer than three text_to_image samples")


class _CountEncode:
    """Counts calls of a decoder's encode (and the targets each call encoded)."""

    def __init__(self, dec, monkeypatch):
        self.calls: list[int] = []
        orig = dec.encode

        def encode(batch):
            self.calls.append(int(batch["pixel_values"].shape[0]))
            return orig(batch)

        monkeypatch.setattr(dec, "encode", encode)


def _loss(model, mb):
    with torch.no_grad():
        out = model(mb)
    return float(out.loss_sum), {m: float(v) for m, v in out.decoder_loss_sums.items()}


def test_collate_keys_each_target_by_its_features(built, drawn):
    """decoder_keys holds, per target in order, the digest of its features and its code count."""
    _, _, proc = built
    assert collate(drawn, proc.encoders, proc.decoders).decoder_keys == {}  # no digest unless asked for
    mb = collate(drawn, proc.encoders, proc.decoders, decoder_keys=True)
    feats = [f for s in drawn for side, m, f in s.media if side == "decoder"]
    assert mb.decoder_keys["image"] == [(features_digest(f), int(proc.decoders["image"].num_tokens(f))) for f in feats]
    assert len({d for d, _ in mb.decoder_keys["image"]}) == 3  # three different images, three keys
    assert sum(n for _, n in mb.decoder_keys["image"]) == int((mb.input_ids == built[0].token_ids["decoder"]["image"]).sum())


def test_cached_codes_give_the_losses_of_encoding(built, drawn, monkeypatch):
    """With the cache, the second pass over the same targets encodes nothing and gives exactly the
    losses of a model without the cache; a new target is encoded (alone in its micro-batch)."""
    model, _, proc = built
    dec = model.decoders["image"]
    assert dec.fixed_codes  # the MoVQGAN is frozen by default
    plain = [
        _loss(model, collate(drawn[:2], proc.encoders, proc.decoders, decoder_keys=True)),
        _loss(model, collate(drawn[1:], proc.encoders, proc.decoders, decoder_keys=True)),
    ]
    count = _CountEncode(dec, monkeypatch)
    model.code_cache = CodeCache(1 << 20)
    try:
        first = _loss(model, collate(drawn[:2], proc.encoders, proc.decoders, decoder_keys=True))
        again = _loss(model, collate(drawn[:2], proc.encoders, proc.decoders, decoder_keys=True))
        assert count.calls == [2]  # the second pass read both targets from the cache
        assert model.code_cache.hits == 2 and model.code_cache.misses == 2
        mixed = _loss(model, collate(drawn[1:], proc.encoders, proc.decoders, decoder_keys=True))  # one seen target, one new
        assert count.calls == [2, 2]  # a miss encodes the whole micro-batch
        assert first == again == plain[0] and mixed == plain[1]
        assert len(model.code_cache) == 3
    finally:
        model.code_cache = None


def test_decoder_without_fixed_codes_is_encoded_every_time(built, drawn, monkeypatch):
    """A tokenizer that trains (fixed_codes false) is never cached."""
    model, _, proc = built
    dec = model.decoders["image"]
    count = _CountEncode(dec, monkeypatch)
    model.code_cache = CodeCache(1 << 20)
    dec.vq.requires_grad_(True)
    try:
        assert not dec.fixed_codes
        for _ in range(2):
            _loss(model, collate(drawn[:2], proc.encoders, proc.decoders, decoder_keys=True))
        assert count.calls == [2, 2] and len(model.code_cache) == 0
    finally:
        dec.vq.requires_grad_(False)
        model.code_cache = None


def test_lookup_needs_every_item_and_its_count():
    cache = CodeCache(1 << 20)
    assert cache.store("image", [("a", 2), ("b", 3)], torch.tensor([5, 6, 7, 8, 9]))
    assert torch.equal(cache.lookup("image", [("b", 3), ("a", 2)]), torch.tensor([7, 8, 9, 5, 6]))
    assert cache.lookup("image", [("a", 2), ("c", 1)]) is None  # c never seen
    assert cache.lookup("image", [("a", 3)]) is None  # a has 2 codes, not 3
    assert cache.lookup("audio", [("a", 2)]) is None  # keys are per modality
    assert not cache.store("image", [("d", 2)], torch.tensor([1, 2, 3]))  # counts do not add up: nothing kept
    assert cache.store("image", [(None, 1), ("e", 0), ("f", 2)], torch.tensor([4, 5, 6]))  # no digest: not kept
    assert cache.lookup("image", [("e", 0), ("f", 2)]).tolist() == [5, 6] and cache.lookup("image", [(None, 1)]) is None
    assert len(cache) == 4 and (cache.hits, cache.misses) == (4, 5)  # every item of a failed lookup is a miss


def test_codes_are_stored_small_and_handed_back_long():
    cache = CodeCache(1 << 20)
    cache.store("a", [("small", 2)], torch.tensor([0, 32767]))
    cache.store("a", [("big", 2)], torch.tensor([0, 40000]))
    assert cache.bytes == (1 + 2 * 2) + (1 + 2 * 4) + 2 * ENTRY_OVERHEAD  # a tag, then int16; a tag, then int32
    out = cache.lookup("a", [("big", 2), ("small", 2)])
    assert out.dtype == torch.long and out.tolist() == [0, 40000, 0, 32767]


def test_least_recently_used_are_evicted_beyond_the_budget():
    item = 1 + 4 * 2 + ENTRY_OVERHEAD  # 4 int16 codes after their tag, and the entry's bookkeeping
    cache = CodeCache(3 * item)  # three items
    for k in "abc":
        cache.store("m", [(k, 4)], torch.arange(4))
    assert cache.lookup("m", [("a", 4)]) is not None  # a is now the most recently used
    cache.store("m", [("d", 4)], torch.arange(4))
    assert cache.lookup("m", [("b", 4)]) is None  # b, the least recently used, went
    assert all(cache.lookup("m", [(k, 4)]) is not None for k in "acd")
    assert cache.bytes == 3 * item and len(cache) == 3
    cache.store("m", [("a", 4)], torch.arange(4))  # storing a kept key again does not count it twice
    assert cache.bytes == 3 * item and len(cache) == 3
    with pytest.raises(ValueError, match="max_bytes"):
        CodeCache(-1)


def test_features_digest_follows_values_shape_and_dtype():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = features_digest({"pixel_values": x, "n": 3})
    assert d == features_digest({"n": 3, "pixel_values": torch.from_numpy(x.copy())})  # numpy or torch, any key order
    y = x.copy()
    y[2, 3] += 1e-6
    others = [
        {"pixel_values": y, "n": 3},
        {"pixel_values": x.reshape(4, 3), "n": 3},
        {"pixel_values": x.astype(np.float64), "n": 3},
        {"pixel_values": x, "n": 4},
        {"pixel_values": x},
        {"other": x, "n": 3},
    ]
    digests = {features_digest(f) for f in others}
    assert len(digests) == len(others) and d not in digests
    t = torch.arange(4, dtype=torch.float32)
    assert features_digest({"x": t.bfloat16()}) != features_digest({"x": t})  # bfloat16 is marked
    assert features_digest({"x": t[::2]}) == features_digest({"x": torch.tensor([0.0, 2.0])})  # strides do not matter


def test_features_digest_hashes_nested_values_exactly_or_gives_none():
    """Lists, tuples and dicts of arrays are hashed element by element (two arrays that print the
    same, over numpy's 1000-element summary, still differ); a value it cannot hash exactly makes the
    item uncacheable (None)."""
    a = np.zeros(5000, dtype=np.float32)
    b = a.copy()
    b[2500] = 1.0
    assert repr([a]) == repr([b])  # what a repr-based digest would have confused
    assert features_digest({"x": [a, 1]}) != features_digest({"x": [b, 1]})
    assert features_digest({"x": {"k": (a, "s")}}) == features_digest({"x": {"k": (a.copy(), "s")}})
    assert features_digest({"x": (1, 2)}) != features_digest({"x": [1, 2]}) != features_digest({"x": [1, 2.0]})
    assert features_digest({"x": True}) != features_digest({"x": 1})
    assert features_digest({"x": object()}) is None and features_digest({"x": [a, object()]}) is None
    assert features_digest({"x": np.array([object()])}) is None


def _tensors(v) -> list:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _tensors(x)]
    if isinstance(v, list):
        return [t for x in v for t in _tensors(x)]
    return []


def test_pinning_a_keyed_micro_batch_pins_every_tensor_and_keeps_the_keys(built, drawn, monkeypatch):
    """data.pin_memory (CUDA) goes through every field, decoder_keys' lists of tuples included."""
    from omnicore.data.packing import pinned as pin_all

    _, _, proc = built
    mb = collate(drawn, proc.encoders, proc.decoders, decoder_keys=True)
    keys, n = mb.decoder_keys, len(_tensors(vars(mb)))
    pinned: list = []

    def fake_pin(self):  # no CUDA here: a copy, remembered, stands for the page-locked one
        pinned.append(self.clone())
        return pinned[-1]

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    out = pin_all(mb)
    assert out.decoder_keys == keys and len(keys["image"]) == 3
    assert n == 5  # input_ids, labels, position_ids, cu_seqlens and, nested, the decoder's pixel_values
    assert {id(t) for t in _tensors(vars(out))} == {id(t) for t in pinned}
    assert any(t is out.decoder_inputs["image"]["pixel_values"] for t in pinned)
