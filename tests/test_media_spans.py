"""Bidirectional media spans (``FoundationOptional.media_span_inputs``), the core side: each
modality's placeholder runs numbered along the row, handed with the LM's config and the packed
positions to the foundation, its masks passed to the LM's forward, and refused where they cannot
be applied (varlen attention kernels, sequence parallelism, a sequence hook that cuts the row).
The generic family's Gemma 3 checks the same path against transformers
(``plugins/omnicore-family-kit/tests/test_spans.py`` and ``test_matrix.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from omnicore.data.packing import MicroBatch
from omnicore.model.build import check_span_attention
from omnicore.model.omni import OmniModel, media_spans
from omnicore.parallel.parallelize import model_violations
from omnicore.registry import RegistryError

H, IMG, AUD = 16, 30, 31
IDS = [1, IMG, IMG, 2, IMG, 3, 0, AUD, AUD, IMG, 4]  # two packed samples: the second starts at the 0
POS = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4]


def test_each_run_of_placeholders_is_one_span():
    spans = media_spans(torch.tensor([IDS]), {"image": IMG, "audio": AUD})
    assert spans["image"].tolist() == [[-1, 0, 0, -1, 1, -1, -1, -1, -1, 2, -1]]
    assert spans["audio"].tolist() == [[-1, -1, -1, -1, -1, -1, -1, 0, 0, -1, -1]]


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, H)

    def forward(self, batch):
        return self.proj(batch["values"])

    def dummy_batch(self):
        return {"values": torch.zeros(1, 4)}


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=40, hidden_size=H, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    lm = LlamaForCausalLM(config).eval()
    ids = {"encoder": {"image": IMG, "audio": AUD}, "decoder": {}, "decoder_start": {}}
    return OmniModel(lm, {"image": Tower(), "audio": Tower()}, {}, ids)


def _batch():
    g = torch.Generator().manual_seed(0)
    return MicroBatch(
        input_ids=torch.tensor([IDS]),
        labels=torch.tensor([IDS[1:] + [-100]]),
        position_ids=torch.tensor([POS]),
        encoder_inputs={"image": {"values": torch.randn(4, 4, generator=g)}, "audio": {"values": torch.randn(2, 4, generator=g)}},
    )


def _image_mask(spans, position_ids):
    """By hand: causal within each packed sample, and each image's tokens see each other."""
    t = position_ids.shape[-1]
    sample = (position_ids == 0).cumsum(-1)[0]
    block = spans["image"][0]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    same_image = (block[:, None] == block[None, :]) & (block[:, None] >= 0)
    return ((causal | same_image) & (sample[:, None] == sample[None, :]))[None, None]


def test_the_span_masks_reach_the_foundation():
    model, seen = _model(), []

    def span_inputs(config, spans, position_ids, inputs_embeds, attention_mask=None, cache=None):
        seen.append((config, spans, position_ids, attention_mask, cache))
        return {"attention_mask": _image_mask(spans, position_ids)}

    with torch.no_grad():
        causal = model(_batch(), return_logits=True).logits
        model.media_span_inputs = span_inputs
        got = model(_batch(), return_logits=True).logits
        embeds = model.embed(torch.tensor([IDS]), _batch().encoder_inputs, {})[0]
        want = model.lm(inputs_embeds=embeds, attention_mask=_image_mask(seen[0][1], torch.tensor([POS])), use_cache=False).logits
    config, spans, position_ids, attention_mask, cache = seen[0]
    assert config is model.lm.config and position_ids.tolist() == [POS] and attention_mask is None and cache is None
    assert (
        set(spans) == {"image", "audio"} and spans["image"].tolist() == media_spans(torch.tensor([IDS]), {"image": IMG})["image"].tolist()
    )
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert not torch.allclose(got[0, 1:3], causal[0, 1:3], atol=1e-4)  # the first image's tokens see each other
    torch.testing.assert_close(got[0, :1], causal[0, :1], atol=1e-6, rtol=0)  # the token before it does not change


def test_a_sequence_hook_that_cuts_the_row_is_refused():
    model = _model()
    model.media_span_inputs = lambda config, spans, *args, **kwargs: {"attention_mask": _image_mask(spans, torch.tensor([POS]))}
    model.register_sequence_hook(lambda m, seq: {**seq, **{k: seq[k][:, :6] for k in ("inputs_embeds", "position_ids", "labels")}})
    with pytest.raises(ValueError, match="parallel.sp: 1"), torch.no_grad():
        model(_batch())


@pytest.mark.parametrize("impl", ["sdpa", "eager", "sdpa_varlen", "flash_attention_2"])
def test_span_masks_need_an_attention_kernel_that_applies_them(impl):
    lm = _model().lm
    lm.config._attn_implementation = impl
    if impl in ("sdpa", "eager"):
        check_span_attention(lm, "auto")
    else:
        with pytest.raises(RegistryError, match=f"model.kernels.attention: .*{impl!r}.*choose sdpa or eager"):
            check_span_attention(lm, "auto")


class _State:
    def __init__(self, sp):
        self.sp, self.world_size = sp, sp

    def size(self, dim):
        return self.sp if dim == "sp" else 1


def test_sequence_parallelism_is_refused_with_media_spans():
    model = _model()
    assert model_violations(model, _State(2)) == []
    model.media_span_inputs = lambda *args, **kwargs: {}
    assert model_violations(model, _State(1)) == []
    (v,) = model_violations(model, _State(2))
    assert v.field == "parallel.sp" and "bidirectionally" in v.message and "set parallel.sp: 1" in v.message
