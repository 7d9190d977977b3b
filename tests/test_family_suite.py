"""The family parity suite (:class:`omnicore.testing.FamilyParitySuite`) can fail: its test methods,
called directly on the LLaVA stand-in (CLIP tower), pass on the family as built and raise
AssertionError on a perturbed weight, a conversation the processor renders otherwise, a target
too many, an export that drops the training, a wrong ``mrope``, and a LoRA export whose adapter or
merged weights differ from the trained model's (or whose steps moved nothing). And pytest collects its
``Test*`` subclasses but not the base."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from omnicore.testing import FamilyParitySuite

pytest.importorskip("omnicore_family_llava")

IMAGE_FIRST = [{"type": "image", "path": "a.png"}, {"type": "text", "text": "\nWhat is it?"}]


class LlavaSuite(FamilyParitySuite):
    __test__ = False  # its tests are called below, on a model built once for the module
    foundation = "llava"
    plugins = [("omnicore_family_llava.plugin", "omnicore-family-llava")]
    hf_class = "LlavaForConditionalGeneration"
    samples = [([{"type": "text", "text": "Say hi"}], "hi there"), (IMAGE_FIRST, "noise")]
    media = {"a.png": (40, 52)}
    media_tokens = {"image": 16}

    def hf_messages(self, user, answer):
        content = [{"type": "image"} for p in user if p["type"] == "image"]
        content.append({"type": "text", "text": [p["text"] for p in user if p["type"] == "text"][-1].lstrip("\n")})
        return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(suite, run, reference)`` on a fresh CLIP stand-in."""
    from omnicore_family_llava.standin import save_standin

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    suite = LlavaSuite()
    standin = save_standin(tmp_path_factory.mktemp("llava") / "standin", tower="clip")
    run = suite.build_run(standin, tmp_path_factory.mktemp("data"))
    yield suite, run, suite.build_reference(standin, run.data)
    torch.set_num_threads(old)


def test_the_base_is_not_collected_and_a_subclass_is():
    class TestSome(FamilyParitySuite):
        foundation = "x"

    class TestWithPositions(TestSome):
        mrope = True

    assert FamilyParitySuite.__test__ is False and LlavaSuite.__test__ is False
    assert TestSome.__test__ is True
    assert TestSome.test_positions_equal_get_rope_index is None  # no mRoPE: left out, not skipped
    assert TestWithPositions.test_positions_equal_get_rope_index is FamilyParitySuite.test_positions_equal_get_rope_index


def test_sample_ids_name_the_media():
    class Some(LlavaSuite):
        samples = [
            ([{"type": "text", "text": "x"}], "y"),
            ([{"type": "image", "path": "a.png"}, {"type": "image", "path": "b.png"}, {"type": "video", "path": "c.mkv"}], "y"),
            pytest.param([{"type": "audio", "path": "d.wav"}], "y", id="named"),
        ]

    assert [sid for _, _, sid, _ in Some().sample_list()] == ["text", "two_images_one_video", "named"]
    with pytest.raises(TypeError, match=r"Bad.samples\[0\]: parts must be"):

        class Bad(LlavaSuite):
            samples = [([{"type": "image", "text": "no path"}], "y")]

        Bad()._check_class()


def test_a_perturbed_weight_fails_the_logits_test(built):
    suite, run, ref = built
    suite.test_logits_equal_transformers(run, ref, 1)
    weight = run.model.encoders["image"].multi_modal_projector.linear_1.weight
    with torch.no_grad():
        weight[0, 0] += 0.05
    try:
        with pytest.raises(AssertionError, match="Tensor-likes are not close"):
            suite.test_logits_equal_transformers(run, ref, 1)
        suite.test_logits_equal_transformers(run, ref, 0)  # text only: the projector is not used
    finally:
        with torch.no_grad():
            weight[0, 0] -= 0.05
    suite.test_logits_equal_transformers(run, ref, 1)


def test_a_conversation_rendered_otherwise_fails_the_ids_test(built):
    suite, run, ref = built
    suite.test_ids_equal_transformers(run, ref, 1)

    class InOrder(LlavaSuite):
        hf_messages = FamilyParitySuite.hf_messages  # the text keeps its newline: one token more

    other = InOrder()
    with pytest.raises(AssertionError, match="first difference"):
        other.test_ids_equal_transformers(
            run, other.build_reference(run.config["model"]["foundation"]["options"]["checkpoint"], run.data), 1
        )


def test_a_target_too_many_fails_the_loss_test(built):
    suite, run, ref = built
    suite.test_loss_equals_transformers_loss_on_the_assistant_tokens(run, ref, 1)
    enc = run.encoded[1]
    first = next(i for i, label in enumerate(enc.labels) if label != -100)
    labels = list(enc.labels)
    labels[first - 1] = enc.input_ids[first]  # the header's last token is supervised too
    wrong = dataclasses.replace(run, encoded=[run.encoded[0], dataclasses.replace(enc, labels=labels)])
    with pytest.raises(AssertionError, match="the targets decode to"):
        suite.test_loss_equals_transformers_loss_on_the_assistant_tokens(wrong, ref, 1)


def test_an_export_of_the_stand_in_fails_the_export_test(built, tmp_path, monkeypatch):
    suite, run, ref = built
    suite.test_export_is_read_back_by_from_pretrained_with_the_same_logits(run, ref, tmp_path / "good")
    standin = run.config["model"]["foundation"]["options"]["checkpoint"]
    foundation = type(run.registry.build("foundation", "llava", {"checkpoint": standin}))
    monkeypatch.setattr(foundation, "export_pretrained", lambda self, model, tok, folder: shutil.copytree(standin, folder))
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        suite.test_export_is_read_back_by_from_pretrained_with_the_same_logits(run, ref, tmp_path / "bad")
    assert all(torch.equal(v, before[k]) for k, v in run.model.state_dict().items())  # the test restores the model

    class Still(LlavaSuite):
        def perturb(self, model):
            model.lm.lm_head.weight.add_(0.05)

    with pytest.raises(AssertionError, match="moved no parameter of the parts"):
        Still().test_export_is_read_back_by_from_pretrained_with_the_same_logits(run, ref, tmp_path / "still")


def test_a_wrong_mrope_fails_the_ids_test(built):
    _, run, ref = built

    class WithPositions(LlavaSuite):
        mrope = True

    with pytest.raises(AssertionError, match="set mrope = False on"):
        WithPositions().test_ids_equal_transformers(run, ref, 0)


@pytest.mark.slow
def test_a_wrong_adapter_a_wrong_merged_export_or_unmoved_logits_fail_the_lora_test(built, tmp_path, monkeypatch):
    """``test_lora_export_merged_and_adapter_equal_omnicore`` (left out unless ``lora_export``) fails
    on a PEFT adapter whose B matrices are halved, on a merged export whose embedding is shifted,
    and on steps too small to move the logits (each a 2-step LoRA run)."""
    import omnicore.model.lora

    class Lora(LlavaSuite):
        lora_export = True

    name = "test_lora_export_merged_and_adapter_equal_omnicore"
    assert getattr(LlavaSuite, name) is None and getattr(Lora, name) is FamilyParitySuite.__dict__[name]
    _, run, ref = built
    real_adapter = omnicore.model.lora.family_adapter

    def halved(*args, **kwargs):
        config, state = real_adapter(*args, **kwargs)
        return config, {k: v / 2 if ".lora_B." in k else v for k, v in state.items()}

    with monkeypatch.context() as m:
        m.setattr(omnicore.model.lora, "family_adapter", halved)
        with pytest.raises(AssertionError, match="adapter: Tensor-likes are not close"):
            Lora().test_lora_export_merged_and_adapter_equal_omnicore(run, ref, tmp_path / "halved")

    standin = run.config["model"]["foundation"]["options"]["checkpoint"]
    foundation = type(run.registry.build("foundation", "llava", {"checkpoint": standin}))
    real_export = foundation.export_pretrained

    def shifted(self, model, tok, folder):
        with torch.no_grad():
            model.lm.get_input_embeddings().weight.add_(0.01)
        real_export(self, model, tok, folder)

    with monkeypatch.context() as m:
        m.setattr(foundation, "export_pretrained", shifted)
        with pytest.raises(AssertionError, match="merged: Tensor-likes are not close"):
            Lora().test_lora_export_merged_and_adapter_equal_omnicore(run, ref, tmp_path / "shifted")

    class Tiny(Lora):
        lora_lr = 1e-8

    with pytest.raises(AssertionError, match="the LoRA steps left the stand-in's logits"):
        Tiny().test_lora_export_merged_and_adapter_equal_omnicore(run, ref, tmp_path / "tiny")
