"""Fitting a byte-level BPE text tokenizer on a run's own training text (``omnicore fit-tokenizer``).

A foundation trained from scratch has no tokenizer of its own, and the default (``tokenizer:
byte``, 256 byte tokens) spends one token per character: "Which digit is this?" is 20 tokens, and
a chat-formatted sample of a tiny task is mostly its text. A byte-pair encoding fitted on the
training text (Sennrich, Haddow, Birch, "Neural Machine Translation of Rare Words with Subword
Units", ACL 2016) over bytes, as GPT-2 does (Radford et al. 2019), makes frequent words single
tokens while any text still encodes: all 256 bytes stay in the vocabulary.

The fit is Hugging Face ``tokenizers``' ``BpeTrainer`` with the ``ByteLevel`` pre-tokenizer and
decoder, the layout of :func:`omnicore.model.foundation.byte_tokenizer`, so the two are
interchangeable in ``model.foundation.options.tokenizer``. Importing this module imports neither
torch nor transformers; :func:`save_tokenizer` with a ``model_type`` does (transformers' config classes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["fit_bpe", "training_texts", "save_tokenizer"]

ROLES = ("system", "user", "assistant")
"""Role names that the chat format writes into every sample (ChatML), fitted as text too."""


def training_texts(cfg: Any, *, limit: int | None = None) -> Iterator[str]:
    """The text a run trains on: every text part of every sample of ``data.train`` / ``data.sources``
    (in file order, not shuffled), then the system prompt and the role names.

    Args:
        cfg: a validated :class:`omnicore.config.Config` (its ``data`` section and source file).
        limit: read at most this many samples per source (None: all).

    Raises:
        ValueError: a source cannot be opened (as in training: the message names the path).
        omnicore.data.jsonl.SampleError: a sample is malformed (file and line named).
    """
    from omnicore.data.sources import open_source

    base = Path(cfg.source).parent if cfg.source else Path(".")
    for source_cfg in cfg.data.source_list():
        source = open_source(source_cfg, base)
        for n, record in enumerate(source.records(epoch=0, shard=0, num_shards=1, seed=0, shuffle=False)):
            if limit is not None and n >= limit:
                break
            for message in source.to_sample(record).messages:
                for part in message.parts:
                    if part.type == "text" and part.value:
                        yield str(part.value)
    if cfg.data.system_prompt:
        yield cfg.data.system_prompt
    yield from ROLES


def fit_bpe(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` fitted on ``texts``.

    Args:
        texts: the training text, one string per piece (e.g. :func:`training_texts`).
        vocab_size: the vocabulary size to reach, the 256 byte symbols included (it stops earlier
            when no pair is left to merge); omnicore's special tokens are added later, on top.

    Returns:
        the fitted ``tokenizers.Tokenizer`` (deterministic: the same texts give the same merges).

    Raises:
        ValueError: ``vocab_size`` < 256 (every byte needs a token).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256:
        raise ValueError(f"vocab_size {vocab_size} is below 256: a byte-level BPE keeps one token per byte; choose 256 or more")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tokenizer: Any, out: str | Path, model_type: str | None = None) -> Path:
    """Write ``tokenizer`` (a ``tokenizers.Tokenizer``) as a folder that ``AutoTokenizer.from_pretrained``
    and ``model.foundation.options.tokenizer`` load, and return the folder.

    With ``model_type`` (the foundation config's), the folder is written next to that model type's
    config and read back through ``AutoTokenizer``, as :class:`~omnicore.model.foundation.HFCausalLMFoundation`
    does for the byte tokenizer, so the tokenizer class (and any special tokens it adds) is the one
    an exported model will be loaded with; the temporary ``config.json`` is not kept.
    """
    import tempfile

    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

    folder = Path(out)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    if model_type is not None:
        with tempfile.TemporaryDirectory() as tmp:
            AutoConfig.for_model(model_type).save_pretrained(tmp)
            fast.save_pretrained(tmp)
            fast = AutoTokenizer.from_pretrained(tmp)
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return folder
