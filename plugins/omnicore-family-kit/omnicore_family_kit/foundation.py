"""The base of a family's foundation: what every published family's ``foundation/<name>`` does the
same way, written once.

A family's foundation subclasses :class:`FamilyFoundation` and states what is its own as class
attributes (the model types it reads, its options, the language model's key map, the encoder
entries the checkpoint brings, its part names); it overrides a method only where it deviates (a
tokenizer with another chat template, a language model of its own class) and writes its
``export_pretrained`` with :meth:`FamilyFoundation.export_config` and
:meth:`FamilyFoundation.write_export`.

Torch and transformers are imported inside the methods that build something: importing this
module (a family's foundation module imports it) reads no weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from omnicore_family_kit.checkpoint import checkpoint_folder
from omnicore_family_kit.export import PROCESSOR_FILES
from omnicore_family_kit.keymap import KeyMap

WHAT = "model.foundation.options.checkpoint"
"""The config field every foundation's checkpoint is read from, as refusals name it."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files one of which a checkpoint's tokenizer needs (``AutoTokenizer`` reads them)."""
SOURCE_FILES = ("generation_config.json",)
"""Files of the checkpoint an export carries over unchanged (:meth:`FamilyFoundation.write_export`)."""


class FamilyFoundation:
    """The :class:`omnicore.api.Foundation` of a published model family's checkpoint (reads no
    weights until :meth:`build_model`'s plan is filled).

    A subclass states:

    * ``family``: the foundation's name (``"llava"``), for log lines and export errors;
    * ``model_types``: the ``config.json`` ``model_type`` values it reads (its plugin's
      ``MODEL_TYPES``) and ``what_to_put``: what a valid checkpoint is, ending each refusal;
    * ``options_model``: its options (pydantic, with a ``checkpoint`` field);
    * ``lm_keys``: the language model's :class:`~omnicore_family_kit.keymap.KeyMap` (loading and
      export), or it overrides :meth:`lm_keymap`;
    * ``mrope``: True where the language model rotates by 3-D positions
      (:func:`omnicore.api.build_mrope_lm` builds it, else ``AutoModelForCausalLM`` of the text config);
    * ``encoder_entries``: ``key -> entry`` of the encoders the checkpoint brings, as written under
      ``model.encoders`` without the checkpoint (:meth:`encoders` adds it); an option whose value is
      ``...`` takes the foundation's option of that name;
    * ``part_prefixes``: ``part name -> module prefixes`` for ``train.freeze`` /
      ``train.lr_multipliers`` (:meth:`part_names`).

    It may override: :meth:`config`, :meth:`build_tokenizer` (another chat template),
    :meth:`lm_config` (the config the language model is built from), :meth:`build_lm` (a language
    model of its own class), :meth:`grow` (the rows that may exceed the checkpoint's),
    :meth:`describe` (the log line), :meth:`encoders` and :meth:`part_names` (computed ones). It
    writes ``export_pretrained(model, tokenizer, folder)`` itself (the core reads whether a
    foundation has one; ``model``: the unsharded CPU OmniModel, LoRA merged; ``tokenizer``: the
    run's; ``folder``: created): the class, its config and the parts are the family's;
    :meth:`one_module` (ValueError: the family's module missing or doubled),
    :meth:`export_config` and :meth:`write_export` (RuntimeError: the tensors do not fill the
    class) do the rest.

    Args:
        options: the foundation's options (validated by ``options_model``).

    Raises:
        ValueError: naming ``model.foundation.options.checkpoint``: the folder or its
            ``config.json`` is missing, or its model type is not one of ``model_types``.
    """

    family: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    what_to_put: ClassVar[str] = "point options.checkpoint at a folder written by save_pretrained"
    options_model: ClassVar[Any] = None
    lm_keys: ClassVar[KeyMap | None] = None
    mrope: ClassVar[bool] = False
    encoder_entries: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    part_prefixes: ClassVar[Mapping[str, Sequence[str]]] = {}

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = self.options_model.model_validate(dict(options or {}))
        self.folder = self.checkpoint_folder(self.options.checkpoint)

    def checkpoint_folder(self, checkpoint: str) -> Path:
        """``checkpoint`` as a folder of one of :attr:`model_types`
        (:func:`omnicore_family_kit.checkpoint.checkpoint_folder`)."""
        return checkpoint_folder(checkpoint, WHAT, self.model_types, self.what_to_put)

    def config(self) -> Any:
        """A fresh copy of the checkpoint's config (``AutoConfig.from_pretrained``), the caller's to change."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(self.folder), local_files_only=True)

    def check_tokenizer(self) -> None:
        """Refuse a checkpoint folder without a tokenizer.

        Raises:
            ValueError: the folder has none of :data:`TOKENIZER_FILES` (naming the field, the folder
                and the files looked for).
        """
        if not any((self.folder / f).is_file() for f in TOKENIZER_FILES):
            raise ValueError(
                f"{WHAT}: {self.folder} has no tokenizer (looked for {', '.join(TOKENIZER_FILES)}); save the checkpoint's tokenizer there"
            )

    def source_tokenizer(self) -> Any:
        """The checkpoint's tokenizer as published, with its chat template (``AutoTokenizer``).

        Raises:
            ValueError: the folder has no tokenizer (:meth:`check_tokenizer`).
        """
        from transformers import AutoTokenizer

        self.check_tokenizer()
        return AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)

    def build_tokenizer(self) -> Any:
        """The tokenizer omnicore trains with: the checkpoint's, with its chat template (:meth:`source_tokenizer`)."""
        return self.source_tokenizer()

    def lm_keymap(self) -> KeyMap:
        """The language model's key map (:attr:`lm_keys`)."""
        if self.lm_keys is None:
            raise NotImplementedError(f"{type(self).__name__} states no lm_keys and does not override lm_keymap")
        return self.lm_keys

    def lm_config(self, config: Any) -> Any:
        """The part of ``config`` the language model is built from (the whole config; a family whose
        text model sits deeper, such as a thinker, gives that part)."""
        return config

    def build_lm(self, config: Any, vocab_size: int, dtype: Any) -> Any:
        """The language model under its head on the meta device (buffers real), tied as its config
        says: :func:`omnicore.api.build_mrope_lm` of :meth:`lm_config` where :attr:`mrope`, else
        ``AutoModelForCausalLM`` of its text config with ``max(text vocab_size, vocab_size)`` rows.

        Raises:
            ValueError: (mRoPE) the text config's ``mrope_section`` does not fit its head dim.
        """
        import torch

        from omnicore.api import build_mrope_lm, on_meta

        config = self.lm_config(config)
        with on_meta():
            if self.mrope:
                model = build_mrope_lm(config, vocab_size=vocab_size, dtype=dtype)
            else:
                from transformers import AutoModelForCausalLM

                text = config.get_text_config()
                text.vocab_size = max(int(text.vocab_size), int(vocab_size))
                model = AutoModelForCausalLM.from_config(text, dtype=dtype or torch.float32)
        model.tie_weights()
        return model

    def grow(self, model: Any) -> tuple[str, ...]:
        """The parameters whose rows may exceed the checkpoint's (rows beyond it get the mean of its
        rows): the input and output embeddings (:func:`omnicore.api.embedding_names`)."""
        from omnicore.api import embedding_names

        return embedding_names(model)

    def describe(self, config: Any) -> str:
        """What the log line says of the checkpoint after its model type: its ``architectures``."""
        return ", ".join(getattr(config, "architectures", None) or []) or "no architectures in config.json"

    def build_model(self, vocab_size: int, dtype: Any = None) -> Any:
        """The language model under its head (:meth:`build_lm`), on the meta device with the plan
        that reads the checkpoint's language-model tensors after sharding (strict, through
        :meth:`lm_keymap`: every tensor of the model read, the checkpoint's other parts named).
        Logs the checkpoint's model type (``foundation <family>: <folder> is a <type> checkpoint (...)``).

        Args:
            vocab_size: input embeddings needed; the model has at least the checkpoint's rows
                (rows beyond them get the mean of its rows, :meth:`grow`).
            dtype: floating-point dtype of the parameters (default float32).

        Returns:
            the causal LM (``[B, T] -> [B, T, V]`` logits), parameters on meta, with ``omnicore_pending_load``.

        Raises:
            LoadError: (``ValueError``) the checkpoint's language-model tensors do not fit.
        """
        from omnicore.api import plan_checkpoint

        config = self.config()
        log = logging.getLogger(type(self).__module__)
        log.info("foundation %s: %s is a %s checkpoint (%s)", self.family, self.folder, config.model_type, self.describe(config))
        model = self.build_lm(config, vocab_size, dtype)
        keys = self.lm_keymap()
        model.omnicore_pending_load = plan_checkpoint(
            model, self.folder, renames=keys.renames(), other_parts=keys.other_parts(), what=WHAT, grow=self.grow(model)
        )
        return model

    def encoders(self) -> dict[str, dict[str, Any]]:
        """The encoder entries the checkpoint brings (:attr:`encoder_entries`), each reading this
        checkpoint (``options.checkpoint``), an option ``...`` replaced by the foundation's option
        of that name."""
        out: dict[str, dict[str, Any]] = {}
        for key, entry in self.encoder_entries.items():
            options = {"checkpoint": str(self.folder)}
            for name, value in dict(entry.get("options") or {}).items():
                options[name] = getattr(self.options, name) if value is ... else value
            out[key] = {**entry, "options": options}
        return out

    def part_names(self) -> dict[str, list[str]]:
        """Family part names for ``train.freeze`` / ``train.lr_multipliers`` (:attr:`part_prefixes`)."""
        return {name: list(prefixes) for name, prefixes in self.part_prefixes.items()}

    def one_module(self, modules: Mapping[str, Any], cls: type, component: str) -> Any:
        """The one module of ``cls`` among ``modules`` (``model.encoders``, ``model.decoders``),
        shared entries counted once.

        Raises:
            ValueError: there is none, or more than one (naming ``component``, ``encoder/<name>``).
        """
        found = list({id(m): m for m in modules.values() if isinstance(m, cls)}.values())
        if len(found) != 1:
            raise ValueError(f"{self.family} export: the model needs exactly one {component} module, found {len(found)}")
        return found[0]

    def export_config(self, model: Any, tokenizer: Any, token_ids: Mapping[str, str] | None = None) -> Any:
        """The checkpoint's config as the export writes it: its text config's ``vocab_size`` the
        trained one (``model.lm``'s input embedding rows) and each ``token_ids`` attribute set to
        the tokenizer's id of its token (``{"image_token_index": "<image>"}``)."""
        config = self.config()
        config.get_text_config().vocab_size = int(model.lm.get_input_embeddings().weight.shape[0])
        for key, token in (token_ids or {}).items():
            setattr(config, key, int(tokenizer.convert_tokens_to_ids(token)))
        return config

    def write_export(
        self,
        folder: Path,
        model: Any,
        model_class: type,
        config: Any,
        parts: Iterable[tuple[Any, KeyMap]],
        *,
        tokenizer: Any,
        processor: Any = None,
        state: Mapping[str, Any] | None = None,
        files: Iterable[str] = PROCESSOR_FILES,
        copied: Iterable[str] = SOURCE_FILES,
    ) -> None:
        """Write ``folder`` with ``model_class(config).save_pretrained`` from the trained parts
        (:func:`omnicore_family_kit.export.save_through_class`, strict both ways, in the dtype of
        ``model.lm``'s embeddings), then the processor side: the source's processor ``files``
        copied where no ``processor`` is given, the ``tokenizer``, the ``processor``
        (``save_pretrained``) where given, and last the source's ``copied`` files
        (``generation_config.json``).

        Args:
            folder: the export folder (created).
            model: the unsharded CPU OmniModel (LoRA merged).
            model_class: the published class (``LlavaForConditionalGeneration``).
            config: its config as written (:meth:`export_config`).
            parts: ``(module, key map)`` of each trained part (:func:`omnicore_family_kit.export.class_state`).
            tokenizer: the run's tokenizer; None where ``processor`` writes it.
            processor: a transformers processor to write (it writes its own files); None copies ``files``.
            state: more tensors under the class's names (parts not trained, copied from the checkpoint).

        Raises:
            RuntimeError: the tensors do not fill the class (see ``save_through_class``).
        """
        from omnicore_family_kit.export import class_state, copy_extra_files, save_through_class

        folder = Path(folder)
        tensors = {**class_state(parts), **(state or {})}
        save_through_class(model_class, config, tensors, folder, dtype=model.lm.get_input_embeddings().weight.dtype)
        if processor is None:
            copy_extra_files(self.folder, folder, files)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        if processor is not None:
            processor.save_pretrained(folder)
        copy_extra_files(self.folder, folder, copied)
