"""``foundation/generic``: the generic family, and ``auto``, the name that picks a family for a checkpoint.

``model.foundation: {name: auto, options: {checkpoint: ...}}`` is resolved by the core before
anything is built: the installed family whose foundation spec names the checkpoint's model type,
else this generic family (``ComponentSpec.extra["model_types"] == ("*",)``). This foundation then
serves the checkpoint through transformers' multimodal interface:

* the language model is the composite class's text decoder under its LM head (the decoder's own
  causal-LM class where transformers has one for the text config, else the decoder under a
  linear head), read from the checkpoint's decoder tensors in either layout;
* :meth:`GenericFoundation.encoders` brings one ``encoder/generic_encoder`` entry per modality the
  class has a feature method and the config a placeholder for (a video entry shares the image
  module);
* the export is the class's own ``save_pretrained`` (:func:`omnicore_family_kit.export.save_through_class`).

What the generic path cannot reproduce exactly is refused when the foundation is built, with the
reason and what would serve it (:func:`refusal`): never trained approximately.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omnicore_family_kit.foundation import WHAT, FamilyFoundation
from omnicore_family_kit.generic.options import AutoFoundationOptions
from omnicore_family_kit.generic.processor import FEATURES_BY_MODALITY, placeholder_id, read_config_json
from omnicore_family_kit.generic.rope import RULE
from omnicore_family_kit.keymap import KeyMap

logger = logging.getLogger(__name__)


ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
"""``layer_types`` of text configs whose layers keep packed samples apart (attention with the
packed mask); any other (``linear_attention``, ``conv``) carries state along the whole row."""


def refusal(config: dict[str, Any], composite: Any = None, spans: str | None = None) -> str | None:
    """Why the generic family cannot serve a checkpoint of this ``config.json`` exactly, or None.

    Checked, each with what would serve it: 3-D positions (mRoPE) that the data side cannot compute
    by the class's own ``get_rope_index`` or vision rows added inside the text model
    (:func:`rope_refusal`); a mask the class builds from ``token_type_ids`` unless they are its
    media spans (``spans``: Gemma 3's images, :func:`~omnicore_family_kit.generic.spans.span_modality`;
    PaliGemma's prefix is refused); per-layer inputs the text model takes besides the embeddings
    (Gemma 3n); a final logit soft cap or logit scale (omnicore's loss takes the head's plain
    logits); layers that carry state along the packed row (linear attention, convolutions); a
    modality whose placeholder the config names but whose feature method the class lacks.
    """
    text = config.get("text_config") or {}
    model_type = config.get("model_type")
    head = f"model type {model_type!r}"
    if text.get("final_logit_softcapping") or config.get("final_logit_softcapping"):
        return f"{head} soft-caps its final logits, which omnicore's text loss does not apply"
    scale = text.get("logit_scale", config.get("logit_scale"))
    if scale not in (None, 1, 1.0):
        return f"{head} multiplies its logits by logit_scale {scale}, which omnicore's text loss does not apply"
    kinds = set(text.get("layer_types") or config.get("layer_types") or [])
    if kinds - ATTENTION_LAYERS:
        return (
            f"{head} has {', '.join(sorted(kinds - ATTENTION_LAYERS))} layers, which carry state across the samples packed "
            "in a row on the torch path; a family plugin that restarts them at sample boundaries is needed"
        )
    if composite is None:
        return None
    base = getattr(composite, "model", composite)
    if callable(getattr(base, RULE, None)):
        why = rope_refusal(head, composite, base)
        if why:
            return why
    params = _forward_params(base)
    if "token_type_ids" in params and spans is None:
        return (
            f"{head} builds its attention mask from token_type_ids that are not its processor's image-token types (a bidirectional "
            "text prefix), which the generic family's media spans do not reproduce; it is refused rather than trained approximately"
        )
    decoder = composite.get_decoder() if callable(getattr(composite, "get_decoder", None)) else None
    if decoder is not None and "per_layer_inputs" in _forward_params(decoder):
        return f"{head}'s text model takes per-layer inputs computed from the token ids, which the generic family does not give"
    for modality, method in FEATURES_BY_MODALITY.items():
        if placeholder_id(config, modality) is not None and not callable(getattr(composite, method, None)):
            return f"{head} names a {modality} placeholder but its class has no {method}; a family plugin must encode its {modality}"
    return None


DEEPSTACK_INPUTS = frozenset({"deepstack_visual_embeds", "visual_pos_masks"})
"""Text model inputs that carry vision rows into intermediate layers (Qwen3-VL's DeepStack)."""


def rope_refusal(head: str, composite: Any, base: Any) -> str | None:
    """Why a class that rotates by 3-D positions (its base model's ``get_rope_index``) cannot be
    served, or None: its text model takes vision rows in intermediate layers (DeepStack), its
    ``get_rope_index`` is not the one of ``AutoModel``'s class for its config or reads more than
    the config from its instance (then it cannot run in a data worker without the model:
    :func:`omnicore_family_kit.generic.rope.rule_reads`), or its rotary sections are not 3."""
    from omnicore_family_kit.generic.rope import rule_class, rule_reads

    decoder = composite.get_decoder() if callable(getattr(composite, "get_decoder", None)) else None
    deepstack = sorted(DEEPSTACK_INPUTS & _forward_params(decoder)) if decoder is not None else []
    if deepstack:
        return (
            f"{head}'s text model adds vision rows inside its layers (DeepStack: {', '.join(deepstack)}), which the generic "
            "family does not give; omnicore-family-qwen3-vl serves qwen3_vl"
        )
    cls = type(base)
    if rule_class(composite.config) is not cls:
        return f"{head}: {cls.__name__} is not AutoModel's class for its config, so the data side cannot call its {RULE}"
    reads = rule_reads(cls)
    if reads:
        return (
            f"{head}: {cls.__name__}.{RULE} reads {', '.join(sorted(reads))} from the model besides its config, so the data "
            "side cannot compute positions without building the model; a family plugin must compute them"
        )
    text = composite.config.get_text_config()
    section = (getattr(text, "rope_parameters", None) or {}).get("mrope_section")
    if section is not None and len(section) != 3:
        return f"{head} rotates by {len(section)} position axes (rope_parameters.mrope_section {section}), not the 3 of {RULE}"
    return None


def _forward_params(module: Any) -> set[str]:
    """The parameter names of ``module.forward`` (empty when they cannot be read)."""
    import inspect

    try:
        return set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return set()


class GenericFoundation(FamilyFoundation):
    """The :class:`omnicore.api.Foundation` of a checkpoint served through transformers'
    multimodal interface (reads no weights until :meth:`build_model`'s plan is filled): a
    :class:`~omnicore_family_kit.foundation.FamilyFoundation` of any model type, whose key map,
    language model, encoder entries and part names are read from the composite class.

    Args:
        options: :class:`~omnicore_family_kit.generic.options.AutoFoundationOptions`.

    Attributes:
        media_span_inputs: only for a class whose image tokens attend to each other (Gemma 3:
            :class:`~omnicore_family_kit.generic.spans.MediaSpanInputs`), the attention masks of
            ``FoundationOptional.media_span_inputs``.

    Raises:
        ValueError: the folder lacks ``config.json`` or tokenizer files, or the model type cannot be
            served exactly (:func:`refusal`), naming the field and the reason.
    """

    family = "generic"
    options_model = AutoFoundationOptions

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.check_tokenizer()
        self.raw = read_config_json(self.folder)
        from omnicore_family_kit.generic.model import build_composite, fresh_config, layout_of

        self._composite = build_composite(fresh_config(self.folder))
        from omnicore_family_kit.generic.spans import MediaSpanInputs, span_modality

        spans = span_modality(self.raw, self._composite, self.folder)
        why = refusal(self.raw, self._composite, spans)
        if why:
            raise ValueError(f"{WHAT}: {self.folder}: the generic family cannot serve it exactly: {why}")
        self.layout = layout_of(self._composite)
        if spans is not None:  # FoundationOptional.media_span_inputs, only where the class attends so
            self.media_span_inputs = MediaSpanInputs(spans)

    def checkpoint_folder(self, checkpoint: str) -> Path:
        """``checkpoint`` as a folder with a ``config.json`` of any model type (what cannot be
        served is refused by :func:`refusal`).

        Raises:
            ValueError: the folder has no ``config.json``.
        """
        folder = Path(checkpoint).expanduser()
        if not (folder / "config.json").is_file():
            raise ValueError(f"{WHAT}: {str(folder)!r} has no config.json; point it at a folder written by save_pretrained")
        return folder

    def config(self) -> Any:
        """A copy of the checkpoint's config (read once per process)."""
        from omnicore_family_kit.generic.model import fresh_config

        return fresh_config(self.folder)

    def lm_keymap(self) -> KeyMap:
        """The language model's key map: its ``model.`` is the class's text decoder, ``lm_head.`` its head."""
        from omnicore_family_kit.keymap import saved_renames

        legacy = saved_renames(self._composite)
        parts = {"model.": self.layout.decoder + ".", "lm_head.": self.layout.head + "."}
        return KeyMap(parts=parts, legacy=legacy, others=self.layout.towers)

    def build_lm(self, config: Any, vocab_size: int, dtype: Any) -> Any:
        """The class's text decoder under its LM head (:func:`~omnicore_family_kit.generic.text_lm.build_text_lm`)
        on the meta device, tied as its config says; the base's :meth:`build_model` plans reading
        the checkpoint's decoder tensors in either layout (:meth:`lm_keymap`)."""
        from omnicore_family_kit.generic.text_lm import build_text_lm

        model = build_text_lm(config, self._composite.get_submodule(self.layout.decoder), vocab_size, dtype)
        model.tie_weights()
        return model

    def rope_layout(self) -> Any:
        """``omnicore.api.RopeLayout()`` when the class rotates by 3-D positions (its base model's
        ``get_rope_index``), else None. Each item's positions then come from that rule on the data
        side (``ItemLayout.positions``, :mod:`omnicore_family_kit.generic.rope`), and the text
        decoder takes ``[4, B, T]`` positions (the plain row, which keeps packed samples apart, then
        the three axes)."""
        from omnicore.api import RopeLayout

        base = getattr(self._composite, "model", self._composite)
        return RopeLayout() if callable(getattr(base, RULE, None)) else None

    def modalities(self) -> list[str]:
        """The modalities the class has a feature method for and the config a placeholder id."""
        return [
            m
            for m, method in FEATURES_BY_MODALITY.items()
            if callable(getattr(self._composite, method, None)) and placeholder_id(self.raw, m) is not None
        ]

    def encoders(self) -> dict[str, dict[str, Any]]:
        """One ``encoder/generic_encoder`` entry per modality of :meth:`modalities`; video shares the
        image module when both are served."""
        folder = str(self.folder)
        out: dict[str, dict[str, Any]] = {}
        for m in self.modalities():
            entry: dict[str, Any] = {"name": "generic_encoder", "options": {"checkpoint": folder, "modality": m}}
            if m == "video" and "image" in out:
                entry["share"] = "image"
            out[m] = entry
        return out

    def part_names(self) -> dict[str, list[str]]:
        """Part names for ``train.freeze`` / ``train.lr_multipliers``: each tower part by its name
        in the class (``vision_tower``, ``multi_modal_projector``), under the first encoder key,
        and ``language_model``."""
        mods = self.modalities()
        out: dict[str, list[str]] = {"language_model": ["lm."]}
        if mods:
            for path in self.layout.towers:
                out[path.rpartition(".")[2]] = [f"encoders.{mods[0]}.model.{path}."]
        return out

    def export_pretrained(self, model: Any, tokenizer: Any, folder: Path) -> None:
        """Write ``folder`` as the class's ``save_pretrained`` writes it, from the trained tensors of
        the encoder module and the language model, with the trained vocabulary size; then the
        source's processor files, the tokenizer and its ``generation_config.json``
        (:meth:`~omnicore_family_kit.foundation.FamilyFoundation.write_export`).

        Raises:
            ValueError: the model has not exactly one generic encoder module of this checkpoint;
                RuntimeError: the tensors do not fill the class (see ``save_through_class``).
        """
        from omnicore_family_kit.generic.encoder import GenericTower
        from omnicore_family_kit.generic.model import composite_class

        tower = self.one_module(model.encoders, GenericTower, "encoder/generic_encoder")
        config = self.export_config(model, tokenizer)
        if hasattr(config, "vocab_size") and config is not config.get_text_config():
            config.vocab_size = config.get_text_config().vocab_size
        parts = [(tower, tower.keymap), (model.lm, self.lm_keymap())]
        self.write_export(folder, model, composite_class(config), config, parts, tokenizer=tokenizer)


def build(options: dict[str, Any]) -> GenericFoundation:
    """The foundation factory of the generic family (``ComponentSpec.target`` of ``foundation/generic``)."""
    return GenericFoundation(options)
