"""The base of decoders of discrete codes: a frozen or trainable tokenizer plus the LM adapter.

A decoder of a medium (images, audio) in omnicore is a discrete tokenizer of that medium (a VQ
autoencoder, a neural audio codec) and a small trainable *LM adapter*: ``nn.Embedding(C, H)`` that
turns codes into the foundation's input embeddings (teacher forcing) and ``nn.Linear(H, C)`` that
scores hidden states against the codebook. :class:`CodebookDecoder` is that shared skeleton; a
subclass supplies the tokenizer-specific part of the :class:`omnicore.components.Decoder` contract
(:meth:`~CodebookDecoder.encode`, :meth:`~CodebookDecoder.decode`,
:meth:`~CodebookDecoder.dummy_codes`) and the settings its saved folder records
(:meth:`~CodebookDecoder.saved_settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnicore.model.weights import load_extra_weights, save_extra_weights


class CodebookDecoder(nn.Module):
    """Base class of a :class:`omnicore.components.Decoder` over a discrete tokenizer.

    Subclasses set the class attributes ``modality`` (``"image"``, ``"audio"``) and ``component``
    (``"decoder/<name>"``, recorded in and checked against ``omnicore_extra.safetensors``), and
    implement ``encode``, ``decode`` and ``dummy_codes``. The tokenizer must have the library's
    ``save_pretrained(folder, safe_serialization=True)`` (transformers, diffusers).

    Args:
        tokenizer: the ``nn.Module`` that maps the medium to codes and back.
        processor: the data side (:class:`omnicore.components.Processor`) built from the same options.
        hidden_size: ``H``, the foundation's hidden size.
        codebook_size: ``C``, the number of distinct codes the foundation sees (for several
            codebooks flattened into one id space, their total).
        freeze_tokenizer: freeze the tokenizer (``requires_grad=False``) and keep it in eval mode
            whatever ``train()`` is asked; its codes are then fixed (:attr:`fixed_codes`).
        tokenizer_attr: the attribute the tokenizer is stored under (``"vq"``, ``"codec"``); it
            names its parameters in state dicts and checkpoints.

    Attributes:
        processor: as given; ``codebook_size``, ``hidden_size``, ``freeze_tokenizer`` as given.
        code_embed: ``nn.Embedding(C, H)``, weights drawn from N(0, 0.02^2).
        lm_head: ``nn.Linear(H, C)``, weights from N(0, 0.02^2), bias zero.

    Raises:
        ValueError: ``hidden_size`` or ``codebook_size`` is not positive.
    """

    modality: str = ""
    component: str = ""

    def __init__(
        self,
        tokenizer: nn.Module,
        processor: Any,
        *,
        hidden_size: int,
        codebook_size: int,
        freeze_tokenizer: bool = True,
        tokenizer_attr: str = "tokenizer",
    ) -> None:
        super().__init__()
        if int(hidden_size) <= 0 or int(codebook_size) <= 0:
            raise ValueError(f"{type(self).__name__}: hidden_size and codebook_size must be positive, got {hidden_size}, {codebook_size}")
        self._tokenizer_attr = tokenizer_attr
        setattr(self, tokenizer_attr, tokenizer)
        self.processor = processor
        self.hidden_size = int(hidden_size)
        self.codebook_size = int(codebook_size)
        self.freeze_tokenizer = bool(freeze_tokenizer)
        self.code_embed = nn.Embedding(self.codebook_size, self.hidden_size)
        self.lm_head = nn.Linear(self.hidden_size, self.codebook_size)
        nn.init.normal_(self.code_embed.weight, std=0.02)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        nn.init.zeros_(self.lm_head.bias)
        if self.freeze_tokenizer:
            tokenizer.requires_grad_(False)
            tokenizer.eval()

    @property
    def tokenizer(self) -> nn.Module:
        """The wrapped tokenizer module (also reachable under ``tokenizer_attr``)."""
        return getattr(self, self._tokenizer_attr)

    def train(self, mode: bool = True) -> CodebookDecoder:
        """As ``nn.Module.train``, but a frozen tokenizer stays in eval mode (its codes stay fixed)."""
        super().train(mode)
        if self.freeze_tokenizer:
            self.tokenizer.eval()
        return self

    @property
    def fixed_codes(self) -> bool:
        """True while the tokenizer is frozen (no parameter of it trains, and it is in eval mode): then
        ``encode`` is a fixed function of the features, and the core may reuse the codes of a target
        it has seen (``train.code_cache_mb``). Unfreezing or adapting the tokenizer turns it off."""
        return not self.tokenizer.training and not any(p.requires_grad for p in self.tokenizer.parameters())

    @property
    def device(self) -> torch.device:
        """The device of the LM adapter's parameters."""
        return self.code_embed.weight.device

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[N]`` (long) -> input embeddings ``[N, H]`` (trainable ``nn.Embedding``)."""
        return self.code_embed(codes)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[N, H]`` -> codebook logits ``[N, C]`` (trainable ``nn.Linear``)."""
        return self.lm_head(hidden)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The LM adapter's parameters by name: ``code_embed.weight`` ``[C, H]``, ``lm_head.weight``
        ``[C, H]``, ``lm_head.bias`` ``[C]`` (the tensors themselves, for saving and loading in place)."""
        return {"code_embed.weight": self.code_embed.weight, "lm_head.weight": self.lm_head.weight, "lm_head.bias": self.lm_head.bias}

    def saved_settings(self) -> dict[str, Any]:
        """JSON-ready settings that :meth:`save_pretrained` records beside the adapter, so that the
        factory can rebuild the same decoder from the folder (``image_size``, ``bandwidth``, ...).
        ``hidden_size`` and ``codebook_size`` are always recorded. Default: none."""
        return {}

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``path`` loadable by the subclass's factory with ``options["checkpoint"] = path``.

        Files: the tokenizer's own ``save_pretrained`` output (``config.json`` and safetensors, so
        the library's ``from_pretrained(path)`` loads it too) and ``omnicore_extra.safetensors``
        (:func:`omnicore.model.weights.save_extra_weights`: :meth:`adapter_state` with
        :meth:`saved_settings`, ``hidden_size`` and ``codebook_size``). Call it on an unsharded module.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(str(path), safe_serialization=True)
        save_extra_weights(
            path,
            self.adapter_state(),
            component=self.component,
            **self.saved_settings(),
            hidden_size=self.hidden_size,
            codebook_size=self.codebook_size,
        )

    def load_adapter(self, path: str | Path) -> dict[str, Any] | None:
        """Fill the LM adapter from ``path/omnicore_extra.safetensors`` (written by
        :meth:`save_pretrained`), in place; returns the recorded settings.

        Raises:
            ValueError: the file was written for another component, hidden size or codebook size
                (:func:`omnicore.model.weights.load_extra_weights` names the file and the shapes).
        """
        return load_extra_weights(Path(path).expanduser(), self.adapter_state(), component=self.component)

    # ---- the tokenizer-specific part: subclasses implement -------------------------------------

    def encode(self, batch: dict[str, Any]) -> torch.Tensor:
        """Target features (a collated batch) to codes, LongTensor ``[sum(num_tokens(item))]``, no grad.

        Raises:
            NotImplementedError: in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement encode(batch)")

    def decode(self, codes: torch.Tensor) -> Any:
        """Codes of one item ``[num_tokens]`` back to the medium (``PIL.Image.Image`` or ``Audio``).

        Raises:
            NotImplementedError: in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement decode(codes)")

    def dummy_codes(self) -> torch.Tensor:
        """A LongTensor of one item's codes for the dummy pass on ranks without this modality.

        Raises:
            NotImplementedError: in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement dummy_codes()")
