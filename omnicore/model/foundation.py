"""The built-in foundation: any transformers causal LM, from a config dict or a local checkpoint.

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
        default=None, description="transformers config kwargs with 'model_type' (e.g. qwen2); builds a randomly initialised model"
    )
    checkpoint: str | None = Field(default=None, description="local folder written by save_pretrained (config.json + safetensors)")
    tokenizer: str | None = Field(
        default=None, description="'byte', or a local tokenizer folder; default: the checkpoint's own, else 'byte'"
    )

    @model_validator(mode="after")
    def _one_source(self) -> HFCausalLMOptions:
        if (self.config is None) == (self.checkpoint is None):
            raise ValueError("set exactly one of 'config' (build from scratch) and 'checkpoint' (load a local folder)")
        if self.config is not None and "model_type" not in self.config:
            raise ValueError("'config' needs a 'model_type', e.g. qwen2 or llama")
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

    def build_model(self, vocab_size: int) -> Any:
        """The causal LM with at least ``vocab_size`` input embeddings (resized when loading)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        if self.options.checkpoint is not None:
            model = AutoModelForCausalLM.from_pretrained(self.options.checkpoint)
            if model.get_input_embeddings().num_embeddings < vocab_size:
                model.resize_token_embeddings(vocab_size)
            return model
        kwargs = dict(self.options.config or {})
        model_type = kwargs.pop("model_type")
        kwargs["vocab_size"] = vocab_size
        config = AutoConfig.for_model(model_type, **kwargs)
        return AutoModelForCausalLM.from_config(config)


def build(options: dict[str, Any]) -> HFCausalLM:
    """Factory of ``foundation/hf_causal_lm``."""
    return HFCausalLM(options)
