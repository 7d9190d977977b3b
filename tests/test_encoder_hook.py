"""``OmniModel.register_encoder_hook``: what a hook is called with, in which order, what it may
return, and that a pass-through hook changes nothing (the tiny digits model's image and audio
encoders, one process; ``plugins/omnicore-parallel-encoder-balance`` tests the hook across ranks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_config_dict

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_and_batch():
    from PIL import Image

    from omnicore.config import Config
    from omnicore.data.packing import MicroBatch
    from omnicore.model.build import build_omni_model

    model, _ = build_omni_model(Config.model_validate(tiny_config_dict("unused.jsonl", decoders=False)))
    model.eval()  # no dropout: exact comparisons
    proc = model.encoder_processors()["image"]
    g = np.random.default_rng(0)
    feats = [proc.preprocess(Image.fromarray(g.integers(0, 256, (28, 28, 3), dtype=np.uint8))) for _ in range(2)]
    n = sum(proc.num_tokens(f) for f in feats)
    ids = torch.cat([torch.arange(5, 10), torch.full((n,), model.token_ids["encoder"]["image"]), torch.arange(10, 15)])
    labels = torch.cat([ids[1:5], torch.full((n + 1,), -100), ids[6 + n :], torch.tensor([-100])])
    mb = MicroBatch(ids[None], labels[None], torch.arange(len(ids))[None], encoder_inputs={"image": proc.collate(feats)})
    return model, mb


def _loss_and_grads(model, mb):
    model.zero_grad(set_to_none=True)
    out = model(mb)
    out.loss_sum.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.loss_sum.detach(), grads


def test_a_pass_through_hook_sees_every_call_and_changes_nothing(model_and_batch):
    model, mb = model_and_batch
    want_loss, want_grads = _loss_and_grads(model, mb)
    seen = []

    def hook(m, call):
        assert m is model and call.module is model.encoders[call.modality]
        assert call.processor is model.encoder_processors()[call.modality]
        seen.append((call.modality, None if call.batch is None else call.batch["pixel_values"].shape[0]))
        return call.encode(call.batch)

    handle = model.register_encoder_hook(hook)
    loss, grads = _loss_and_grads(model, mb)
    # module order (image, then audio), whether the micro-batch holds the modality or not
    assert seen == [("image", 2), ("audio", None)]
    assert torch.equal(loss, want_loss) and grads.keys() == want_grads.keys()
    assert all(torch.equal(grads[k], want_grads[k]) for k in grads)  # the dummy pass of audio still gives its zero grads
    handle.remove()
    seen.clear()
    model(mb)
    assert seen == []


def test_hooks_nest_in_registration_order_and_may_compute_rows_their_own_way(model_and_batch):
    """The outer hook encodes the image items one at a time (as a strategy might, on other ranks)
    through the inner one; the rows and the loss are those of one call on the batch."""
    model, mb = model_and_batch
    want_loss, want_grads = _loss_and_grads(model, mb)
    order = []

    def outer(m, call):
        order.append(("outer", call.modality))
        if call.batch is None:
            return call.encode(None)  # the dummy batch
        items = [{"pixel_values": x} for x in call.batch["pixel_values"]]
        return torch.cat([call.encode(call.processor.collate([it])) for it in items])

    def inner(m, call):
        order.append(("inner", call.modality, None if call.batch is None else call.batch["pixel_values"].shape[0]))
        assert call.dummy_batch().keys() == model.encoders[call.modality].dummy_batch().keys()
        return call.encode(call.batch)

    handles = [model.register_encoder_hook(outer), model.register_encoder_hook(inner)]
    loss, grads = _loss_and_grads(model, mb)
    for h in handles:
        h.remove()
    assert order == [("outer", "image"), ("inner", "image", 1), ("inner", "image", 1), ("outer", "audio"), ("inner", "audio", None)]
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=0)
    for k, g in want_grads.items():
        torch.testing.assert_close(grads[k], g, rtol=1e-5, atol=1e-7 * float(g.abs().max()))
