"""The generic family's matrix: every model type it serves, each a tiny random checkpoint of its
transformers class (:mod:`omnicore_family_kit.standins`), run through ``model.foundation: {name:
auto}`` against the class's own forward by the family parity suite
(:class:`omnicore.testing.FamilyParitySuite`): ids equal the processor's, logits equal the class's
on text only, one image and two images (fp32, 1e-5), a packed row equals each sample alone, the
loss equals transformers' on the assistant tokens, and the export is read back by the class's
``from_pretrained`` with equal logits. Two FSDP2 processes equal one, and a 2-step LoRA run's
merged and PEFT adapter exports give the trained model's logits, for two representative types
(LLaVA-NeXT's tiling, Idefics3's tiles and connector); the rest leave those tests out to keep the
suite's time.

Each model type the generic family cannot serve exactly is refused at build time with one line
naming the reason (:data:`REFUSED`). docs/families.md holds the matrix as a table.
"""

from __future__ import annotations

import pytest

import omnicore_family_kit.plugin
from omnicore.testing import FamilyParitySuite
from omnicore_family_kit.standins import MODEL_TYPES, save_standin

SERVED = ("llava", "llava_next", "llava_onevision", "internvl", "idefics3", "smolvlm", "glm4v", "gemma3")
"""Model types the generic family serves exactly (each one class below)."""
MROPE = ("glm4v",)
"""The served types with 3-D rotary positions (the suite also checks them against ``get_rope_index``)."""
FSDP2 = ("llava_next", "idefics3")
"""The types whose FSDP2 test runs (about 40 s each), and whose LoRA export test runs (``lora_export``:
a 2-step LoRA run exported merged and as a PEFT adapter, 4 to 9 s each)."""
REFUSED = {
    "paligemma": "token_type_ids",
    "aya_vision": "logit_scale",
    "qwen3_vl": "DeepStack",
    "minicpmv4_6": "linear_attention",
    "qwen2_audio": "get_audio_features",
}
"""Model type -> a word of the reason the generic family gives when it refuses it."""
CLOSE_TURN = {"glm4v": "<|endoftext|>"}
"""Model type -> the token its stand-in's template writes after each assistant turn here. GLM-4.1V's
published template closes none (the model stops at the next ``<|user|>``), which omnicore's
``data.chat_template: auto`` refuses (no special token ends the turn): the test closes it, so what
differs from the published checkpoint is the template, not the model."""

IMAGES = {"a.png": (40, 52), "b.png": (70, 33)}


class GenericParity(FamilyParitySuite):
    """The suite on one stand-in of :attr:`model_type`, served by the generic family."""

    __test__ = False
    model_type = ""
    foundation = "auto"
    plugins = [(omnicore_family_kit.plugin, "omnicore-family-kit")]
    hf_class = "AutoModelForImageTextToText"
    samples = [
        ([{"type": "text", "text": "Say hi"}], "hi there"),
        ([{"type": "image", "path": "a.png"}, {"type": "text", "text": "What is it?"}], "noise"),
        (
            [{"type": "image", "path": "b.png"}, {"type": "image", "path": "a.png"}, {"type": "text", "text": "Which is wider?"}],
            "the first",
        ),
    ]
    media = IMAGES

    def standin(self, tmp_path_factory):
        folder = save_standin(self.model_type, tmp_path_factory.mktemp(self.model_type) / "standin")
        close = CLOSE_TURN.get(self.model_type)
        if close:
            template = folder / "chat_template.jinja"
            end = "{% elif message['role'] == 'assistant' %}{% endif %}"
            text = template.read_text()
            assert text.count(end) == 1, "the stand-in's template changed: update CLOSE_TURN's rewrite"
            template.write_text(text.replace(end, "{% elif message['role'] == 'assistant' %}" + close + "{% endif %}"))
        return folder

    def load_hf_processor(self, folder):
        from omnicore_family_kit.processors import load_hf_processor

        return load_hf_processor(str(folder))

    def hf_messages(self, user, answer):
        """The same parts, in order, as the processor's chat template takes them."""
        content = [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]} for p in user]
        return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


for _type in SERVED:
    _name = "Test" + "".join(part.capitalize() for part in _type.split("_"))
    _attrs = {"model_type": _type, "__module__": __name__, "__qualname__": _name}
    if _type in FSDP2:
        _attrs["lora_export"] = True
    else:
        _attrs["test_two_fsdp2_processes_equal_one"] = None
    if _type in MROPE:
        _attrs["mrope"] = True
    globals()[_name] = type(_name, (GenericParity,), _attrs)
del _type, _name, _attrs


class TestQwen2VlThroughGeneric(GenericParity):
    """Qwen2-VL through ``name: generic`` (omnicore-family-qwen2-vl serves ``auto``): a second class
    whose positions come from its own ``get_rope_index`` on the data side."""

    model_type = "qwen2_vl"
    foundation = "generic"
    mrope = True
    test_two_fsdp2_processes_equal_one = None


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_a_type_the_generic_family_cannot_serve_is_refused_with_its_reason(model_type, tmp_path):
    from omnicore.testing import isolated_registry

    if model_type not in MODEL_TYPES:
        pytest.skip(f"no stand-in of {model_type} here")
    folder = save_standin(model_type, tmp_path / "standin")
    registry = isolated_registry([(omnicore_family_kit.plugin, "omnicore-family-kit")], builtins=True)
    with pytest.raises(ValueError, match="cannot serve it exactly") as info:
        registry.build("foundation", "generic", {"checkpoint": str(folder)})
    message = str(info.value)
    assert REFUSED[model_type] in message and "\n" not in message
