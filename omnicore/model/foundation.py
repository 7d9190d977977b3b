"""The built-in foundation: any transformers causal LM, from a config dict or a checkpoint.

A checkpoint is a local folder or a Hugging Face model name (resolved to a folder of the local HF
cache by :func:`omnicore.model.build.build_omni_model`). A safetensors checkpoint whose tensors map
one to one onto the model's parameters (dense transformers models) is not read here: the model is
built with its parameters on the meta device and the keys are checked against the checkpoint's
headers (:func:`omnicore.model.loading.plan_load`); the parallel strategies shard it and each rank
then reads its own shards (:func:`omnicore.model.loading.fill_pending`). Checkpoints that the
library converts while loading (mixture-of-experts models whose experts transformers fuses into
3-D tensors) or that are not safetensors are loaded whole by ``from_pretrained``, with the same
strict key check.

Models with multi-dimensional rotary positions (mRoPE: ``model_type`` ``qwen2_vl``, ``qwen2_5_vl``,
``qwen2_5_omni_thinker``, or their ``*_text`` types) are built as the library's text model under an
LM head, without the vision or audio tower that omnicore's encoders replace
(:mod:`omnicore.model.mrope`); ``rope_parameters.mrope_section`` must sum to half the head dim (for
``qwen2_5_omni_thinker`` the text settings go under ``text_config``). Their checkpoints are read
through the strict key plan only (safetensors with ``model.layers.*`` keys: the published Qwen2-VL
layout, its ``visual.*`` listed in ``ignore_unused``, or omnicore's own export).

Tokenizers: a checkpoint folder's own tokenizer when it has one; otherwise (or with
``tokenizer: byte``) a byte-level tokenizer built with Hugging Face ``tokenizers`` (256 byte tokens,
no merges), which needs no download and round-trips any UTF-8 text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class HFCausalLMOptions(BaseModel):
    """Options of ``foundation/hf_causal_lm``: exactly one of ``config`` and ``checkpoint``."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] | None = Field(
        default=None, description="transformers config kwargs with 'model_type' (e.g. llama); builds a randomly initialised model"
    )
    checkpoint: str | None = Field(
        default=None,
        description="a folder written by save_pretrained (config.json + safetensors), or a Hugging Face model name "
        "(org/name, org/name@revision) found in the local HF cache or downloaded",
    )
    init_fresh: list[str] = Field(
        default_factory=list,
        description="parameter names (fnmatch patterns or dotted prefixes, e.g. lm_head.weight) the checkpoint may lack: initialised "
        "fresh instead of failing the load",
    )
    ignore_unused: list[str] = Field(
        default_factory=list,
        description="checkpoint tensor names (patterns or prefixes, e.g. visual) the model may leave unused instead of failing the load",
    )
    tokenizer: str | None = Field(
        default=None, description="'byte', or a local tokenizer folder; default: the checkpoint's own, else 'byte'"
    )

    @model_validator(mode="after")
    def _one_source(self) -> HFCausalLMOptions:
        if (self.config is None) == (self.checkpoint is None):
            raise ValueError("set exactly one of 'config' (build from scratch) and 'checkpoint' (load a local folder)")
        if self.config is not None and "model_type" not in self.config:
            raise ValueError("'config' needs a 'model_type', e.g. llama or mistral")
        if self.config is not None and (self.init_fresh or self.ignore_unused):
            raise ValueError("'init_fresh' and 'ignore_unused' apply to a 'checkpoint'; a 'config' model is initialised fresh anyway")
        return self


def byte_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` over the 256 byte-level symbols (GPT-2's byte-to-unicode map)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


class HFCausalLM:
    """Builds a transformers ``AutoModelForCausalLM`` and its tokenizer from validated options."""

    def __init__(self, options: dict[str, Any]):
        self.options = HFCausalLMOptions.model_validate(options)
        ckpt = self.options.checkpoint
        if ckpt is not None and not (Path(ckpt) / "config.json").is_file():
            raise ValueError(f"foundation checkpoint {ckpt!r} has no config.json; point 'checkpoint' at a save_pretrained folder")

    def build_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        choice = self.options.tokenizer
        if choice is None:
            ckpt = self.options.checkpoint
            has_own = ckpt is not None and any((Path(ckpt) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
            choice = ckpt if has_own else "byte"
        if choice != "byte":
            return AutoTokenizer.from_pretrained(choice)
        return self._as_auto_tokenizer(byte_tokenizer())

    def _as_auto_tokenizer(self, tokenizer: Any) -> Any:
        """Round-trip a tokenizer through ``AutoTokenizer`` next to this model type's config.

        ``AutoTokenizer`` picks the tokenizer class from ``config.json``'s model type, and some
        classes add default special tokens (Qwen2 adds ``<|endoftext|>``). Building the tokenizer the
        way an exported folder will later be loaded keeps the vocabulary, and so the embedding
        matrix, identical between training and ``AutoTokenizer.from_pretrained(export)``.
        """
        import tempfile

        from transformers import AutoConfig, AutoTokenizer

        if self.options.config is None:
            return tokenizer
        with tempfile.TemporaryDirectory() as tmp:
            AutoConfig.for_model(self.options.config["model_type"]).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            return AutoTokenizer.from_pretrained(tmp)

    def build_model(self, vocab_size: int, dtype: Any = None) -> Any:
        """The causal LM with at least ``vocab_size`` input embeddings, its floating-point
        parameters in ``dtype`` (default float32).

        From a ``config``: built and initialised by transformers. From a ``checkpoint``: see the
        module docstring; a model whose parameters are still to be read carries the plan in its
        ``omnicore_pending_load`` attribute (:class:`omnicore.model.loading.PendingLoad`), which
        :func:`omnicore.model.build.build_omni_model` collects.

        Raises:
            LoadError: (a ``ValueError``) the checkpoint lacks tensors of the model, holds tensors
                it does not use, or holds tensors of other shapes; each named.
        """
        import torch
        from transformers import AutoConfig

        from omnicore.model.mrope import is_mrope_type

        dtype = dtype or torch.float32
        if self.options.checkpoint is None:
            kwargs = dict(self.options.config or {})
            config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs, vocab_size=vocab_size)
            return _new_model(config, vocab_size, dtype)
        from omnicore.model.loading import checkpoint_index

        folder = Path(self.options.checkpoint)
        config = AutoConfig.from_pretrained(folder)
        entries = checkpoint_index(folder)
        if is_mrope_type(config):
            _check_mrope_checkpoint(folder, entries)
        elif entries is None or _converted_on_load(config) or torch.get_default_device().type == "meta":
            return self._load_whole(folder, config, vocab_size, dtype)
        if torch.get_default_device().type == "meta":
            return _new_model(config, vocab_size, dtype)
        return self._build_on_meta(folder, config, entries, vocab_size, dtype)

    def _build_on_meta(self, folder: Path, config: Any, entries: dict[str, Any], vocab_size: int, dtype: Any) -> Any:
        """The model with its parameters on meta (buffers real) and the plan to fill them."""
        from accelerate import init_empty_weights

        from omnicore.model.loading import embedding_names, plan_load

        with init_empty_weights(include_buffers=False):
            model = _new_model(config, vocab_size, dtype)
        model.tie_weights()  # accelerate's meta parameters come untied (tie_word_embeddings); one tensor, as from_pretrained leaves it
        grow = embedding_names(model)
        strip = f"{model.base_model_prefix}." if model.base_model_prefix else ""
        model.omnicore_pending_load = plan_load(
            model, folder, entries, prefix="", init_fresh=self.options.init_fresh, ignore_unused=self.options.ignore_unused,
            what="options.checkpoint", grow=grow, strip="" if any(k.startswith(strip) for k in entries) else strip,
        )  # fmt: skip
        return model

    def _load_whole(self, folder: Path, config: Any, vocab_size: int, dtype: Any) -> Any:
        """``from_pretrained`` on this process (or, under a meta default device, the config's model
        with meta tensors: ``omnicore plan`` counts shapes), with the strict key check."""
        import torch
        from transformers import AutoModelForCausalLM

        from omnicore.model.loading import LoadError, matches_any

        if torch.get_default_device().type == "meta":
            config.vocab_size = max(int(config.vocab_size), vocab_size)
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
        model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, output_loading_info=True)
        missing = [k for k in info.get("missing_keys") or () if not matches_any(k, self.options.init_fresh)]
        unused = [k for k in info.get("unexpected_keys") or () if not matches_any(k, self.options.ignore_unused)]
        bad = [f"{k}: checkpoint {tuple(a)}, model {tuple(b)}" for k, a, b in info.get("mismatched_keys") or ()]
        if missing or unused or bad:
            parts = [f"lacks {sorted(missing)} (list them in init_fresh to initialise them fresh)"] if missing else []
            parts += [f"holds tensors the model does not use: {sorted(unused)} (list them in ignore_unused)"] if unused else []
            parts += [f"has tensors of other shapes: {'; '.join(bad)}"] if bad else []
            raise LoadError(
                f"model.foundation.options.checkpoint: the checkpoint {str(folder)!r} does not fit the model: {'; '.join(parts)}"
            )
        if model.get_input_embeddings().num_embeddings < vocab_size:
            model.resize_token_embeddings(vocab_size)
        return model.train()


def _new_model(config: Any, vocab_size: int, dtype: Any) -> Any:
    """A freshly initialised model of ``config`` with at least ``vocab_size`` input embeddings: an
    mRoPE model type's text model and LM head (:func:`omnicore.model.mrope.build_mrope_lm`, no
    vision tower), else ``AutoModelForCausalLM.from_config``."""
    from transformers import AutoModelForCausalLM

    from omnicore.model.mrope import build_mrope_lm, is_mrope_type

    if is_mrope_type(config):
        return build_mrope_lm(config, vocab_size, dtype)
    config.vocab_size = max(int(config.vocab_size), vocab_size)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _check_mrope_checkpoint(folder: Path, entries: dict[str, Any] | None) -> None:
    """An mRoPE checkpoint is read through the strict key plan only: safetensors whose language
    model keys are ``model.layers.*`` (the published Qwen2-VL layout, and omnicore's exports).

    Raises:
        LoadError: no safetensors, or the transformers-5 layout (``model.language_model.*``).
    """
    from omnicore.model.loading import LoadError

    if entries is None:
        raise LoadError(
            f"model.foundation.options.checkpoint: {str(folder)!r} has no safetensors; an mRoPE foundation is read from safetensors only"
        )
    if any(k.startswith("model.language_model.") for k in entries):
        raise LoadError(
            f"model.foundation.options.checkpoint: {str(folder)!r} holds transformers 5's layout (model.language_model.*); omnicore "
            "reads an mRoPE language model from the published layout (model.layers.*, lm_head.*; list the vision tower, e.g. "
            "visual, in ignore_unused) or from its own export"
        )


def _converted_on_load(config: Any) -> bool:
    """Whether transformers converts this model type's checkpoint tensors while loading (e.g. it
    fuses per-expert weights into 3-D tensors), so names do not map one to one onto parameters."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # an older transformers without conversions: names map one to one
        return False
    return bool(get_checkpoint_conversion_mapping(config.model_type))


def build(options: dict[str, Any]) -> HFCausalLM:
    """Factory of ``foundation/hf_causal_lm``."""
    return HFCausalLM(options)
