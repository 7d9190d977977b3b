"""The base of decoders of discrete codes: a frozen or trainable tokenizer plus the LM adapter.

A decoder of a medium (images, audio) in omnicore is a discrete tokenizer of that medium (a VQ
autoencoder, a neural audio codec) and a small trainable *LM adapter*: ``nn.Embedding(C, H)`` that
turns codes into the foundation's input embeddings (teacher forcing) and ``nn.Linear(H, C)`` that
scores hidden states against the codebook. :class:`CodebookDecoder` is that shared skeleton; a
subclass supplies the tokenizer-specific part of the :class:`omnicore.components.Decoder` contract
(:meth:`~CodebookDecoder.encode`, :meth:`~CodebookDecoder.decode`,
:meth:`~CodebookDecoder.dummy_codes`) and the settings its saved folder records
(:meth:`~CodebookDecoder.saved_settings`).

**Several codebooks per frame (a depth decoder).** A tokenizer whose frames hold ``K`` codes each
(the codebooks of a residual VQ, as in neural audio codecs) can either flatten them into ``K`` LM
positions per frame or, with ``num_codebooks=K``, spend **one** LM position per frame:

* the frame's input embedding is the sum of its ``K`` codes' embeddings (one table of ``K * C`` rows,
  codebook ``k``'s entry ``j`` at row ``k * C + j``);
* the foundation's hidden state before the frame scores codebook 0 (:meth:`CodebookDecoder.head`);
* a small transformer, the *depth decoder*, predicts codebooks ``1..K-1`` of the frame one after
  another from that hidden state and the frame's earlier codes (:meth:`CodebookDecoder.depth_logits`
  when training, :meth:`CodebookDecoder.depth_generate` when generating).

This is the design of Sesame's CSM (https://github.com/SesameAILabs/csm; Moshi's "depth transformer",
Défossez et al. 2024, https://arxiv.org/abs/2410.00037, section 3.4.2): the depth decoder is
transformers' own ``CsmDepthDecoderForCausalLM``, built from a ``CsmDepthDecoderConfig`` of
:class:`DepthOptions`. A published CSM checkpoint's depth decoder therefore loads into it as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from omnicore.model.weights import load_extra_weights, save_extra_weights


class DepthOptions(BaseModel):
    """The depth decoder of a decoder with several codebooks per frame (module docstring): a
    ``CsmDepthDecoderConfig`` of these sizes, its ``backbone_hidden_size`` the foundation's ``H``.

    Attributes:
        layers: transformer layers (``num_hidden_layers``).
        hidden_size: the depth decoder's width (``H`` is projected to it).
        heads: attention heads; ``kv_heads``: key/value heads (grouped-query attention; None: ``heads``).
        intermediate_size: the MLP's width (None: ``4 * hidden_size``).
        rope_theta: RoPE base over the ``K`` positions of a frame.
    """

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(2, ge=1)
    hidden_size: int = 128
    heads: int = 4
    kv_heads: int | None = None
    intermediate_size: int | None = None
    rope_theta: float = 10000.0

    def csm_config(self, *, backbone_hidden_size: int, num_codebooks: int, codebook_size: int) -> Any:
        """The ``transformers.CsmDepthDecoderConfig`` of these options.

        Raises:
            ValueError: ``hidden_size`` is not a multiple of ``heads``, or ``heads`` of ``kv_heads``.
        """
        from transformers import CsmDepthDecoderConfig

        kv = self.kv_heads or self.heads
        if self.hidden_size % self.heads or self.heads % kv:
            raise ValueError(f"depth: hidden_size {self.hidden_size} must be a multiple of heads {self.heads}, and heads of kv_heads {kv}")
        return CsmDepthDecoderConfig(
            num_codebooks=num_codebooks,
            backbone_hidden_size=backbone_hidden_size,
            vocab_size=codebook_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size or 4 * self.hidden_size,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=kv,
            head_dim=self.hidden_size // self.heads,
            max_position_embeddings=num_codebooks,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
        )


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
        num_codebooks: ``K``, codes per frame that share one LM position (module docstring); 1 is
            one code per position. With ``K > 1``, ``codebook_size`` is the entries of *each*
            codebook, codes are ``[N, K]`` and a depth decoder predicts codebooks ``1..K-1``.
        depth: the depth decoder's sizes (:class:`DepthOptions`, or a dict of them; None: the
            defaults); only with ``K > 1``.
        head_bias: whether :attr:`lm_head` has a bias (CSM's has none).

    Attributes:
        processor: as given; ``codebook_size``, ``hidden_size``, ``freeze_tokenizer``,
            ``num_codebooks`` as given.
        code_embed: ``nn.Embedding(K * C, H)``, weights drawn from N(0, 0.02^2).
        lm_head: ``nn.Linear(H, C)`` (codebook 0 when ``K > 1``), weights from N(0, 0.02^2), bias zero.
        depth_decoder: ``transformers.CsmDepthDecoderForCausalLM`` (``K > 1``) or None; its weights
            start from transformers' initialisation under torch's RNG.

    Raises:
        ValueError: ``hidden_size``, ``codebook_size`` or ``num_codebooks`` is not positive, or
            ``depth`` is given with one codebook.
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
        num_codebooks: int = 1,
        depth: DepthOptions | dict[str, Any] | None = None,
        head_bias: bool = True,
    ) -> None:
        super().__init__()
        if int(hidden_size) <= 0 or int(codebook_size) <= 0 or int(num_codebooks) <= 0:
            raise ValueError(
                f"{type(self).__name__}: hidden_size, codebook_size and num_codebooks must be positive, "
                f"got {hidden_size}, {codebook_size}, {num_codebooks}"
            )
        if depth is not None and int(num_codebooks) == 1:
            raise ValueError(
                f"{type(self).__name__}: a depth decoder needs num_codebooks > 1 (one codebook has nothing to predict after it)"
            )
        self._tokenizer_attr = tokenizer_attr
        setattr(self, tokenizer_attr, tokenizer)
        self.processor = processor
        self.hidden_size = int(hidden_size)
        self.codebook_size = int(codebook_size)
        self.num_codebooks = int(num_codebooks)
        self.freeze_tokenizer = bool(freeze_tokenizer)
        self.code_embed = nn.Embedding(self.num_codebooks * self.codebook_size, self.hidden_size)
        self.lm_head = nn.Linear(self.hidden_size, self.codebook_size, bias=head_bias)
        nn.init.normal_(self.code_embed.weight, std=0.02)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        if self.lm_head.bias is not None:
            nn.init.zeros_(self.lm_head.bias)
        self.depth_decoder: nn.Module | None = None
        if self.num_codebooks > 1:
            from transformers import CsmDepthDecoderForCausalLM

            opts = depth if isinstance(depth, DepthOptions) else DepthOptions.model_validate(dict(depth or {}))
            cfg = opts.csm_config(backbone_hidden_size=self.hidden_size, num_codebooks=self.num_codebooks, codebook_size=self.codebook_size)
            self.depth_decoder = CsmDepthDecoderForCausalLM(cfg)
            self.depth_options = opts
        self.register_buffer("code_offsets", torch.arange(self.num_codebooks) * self.codebook_size, persistent=False)
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
        """Codes (long) -> input embeddings ``[N, H]`` (trainable ``nn.Embedding``): ``[N]`` with one
        codebook; ``[N, K]`` with ``K``, each frame the sum of its codes' rows (module docstring).

        Raises:
            ValueError: ``[N, K]`` codes of another ``K``.
        """
        if self.num_codebooks == 1:
            return self.code_embed(codes)
        if codes.dim() != 2 or codes.shape[1] != self.num_codebooks:
            raise ValueError(f"{type(self).__name__}.embed: codes must be [frames, {self.num_codebooks}], got {tuple(codes.shape)}")
        return self.code_embed(codes + self.code_offsets.to(codes.device)).sum(dim=1)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[N, H]`` -> codebook logits ``[N, C]`` (trainable ``nn.Linear``; codebook 0
        when ``K > 1``)."""
        return self.lm_head(hidden)

    def depth_logits(self, hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits of codebooks ``1..K-1``: ``[N, K-1, C]``.

        Frame ``i``'s row ``k - 1`` scores codebook ``k`` given ``hidden[i]`` (the foundation's hidden
        state that :meth:`head` scored codebook 0 from, ``[N, H]``) and the frame's codes
        ``codes[i, :k]`` (``codes``: ``[N, K]``; column ``K-1`` is never read).

        Raises:
            ValueError: the decoder has one codebook.
        """
        if self.depth_decoder is None:
            raise ValueError(f"{type(self).__name__}.depth_logits: one codebook per frame has no depth decoder")
        ids = torch.nn.functional.pad(codes[:, : self.num_codebooks - 1], (1, 0))  # position 0 holds the hidden state
        return self._depth(ids, hidden)

    def depth_generate(self, hidden: torch.Tensor, first: torch.Tensor, pick: Any) -> torch.Tensor:
        """Codes of whole frames ``[N, K]`` from the foundation's hidden states ``[N, H]`` and the
        codebook-0 codes ``first`` ``[N]`` chosen from :meth:`head`: codebook ``k`` is chosen by
        ``pick(logits [N, C], k) -> [N]`` (LongTensor or list) from the logits given codebooks
        ``0..k-1``, as :meth:`depth_logits` scores them; so greedy ``pick`` (argmax) gives exactly
        the argmax of :meth:`depth_logits` on the returned codes. The frame is re-run from its start
        for each codebook (``K`` is small) rather than kept in a cache.

        Raises:
            ValueError: the decoder has one codebook.
        """
        if self.depth_decoder is None:
            raise ValueError(f"{type(self).__name__}.depth_generate: one codebook per frame has no depth decoder")
        codes = first.reshape(-1, 1).long()
        for k in range(1, self.num_codebooks):
            ids = torch.nn.functional.pad(codes, (1, 0))
            logits = self._depth(ids, hidden)[:, -1]
            nxt = torch.as_tensor(pick(logits, k), dtype=torch.long, device=codes.device).reshape(-1, 1)
            codes = torch.cat([codes, nxt], dim=1)
        return codes

    def _depth(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The depth decoder's logits ``[N, t - 1, C]`` of frames ``ids`` ``[N, t]`` (position 0 a
        placeholder for ``hidden`` ``[N, H]``). The all-ones attention mask keeps transformers from
        reading the frame positions as packed sequences (it does when ``N`` equals ``t``)."""
        assert self.depth_decoder is not None
        mask = torch.ones_like(ids)
        return self.depth_decoder(input_ids=ids, attention_mask=mask, backbone_last_hidden_state=hidden, use_cache=False).logits

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The LM adapter's parameters by name: ``code_embed.weight`` ``[K * C, H]``,
        ``lm_head.weight`` ``[C, H]``, ``lm_head.bias`` ``[C]`` (when it has one) and the depth
        decoder's parameters under ``depth_decoder.`` (the tensors themselves, for saving and
        loading in place)."""
        state = {"code_embed.weight": self.code_embed.weight, "lm_head.weight": self.lm_head.weight}
        if self.lm_head.bias is not None:
            state["lm_head.bias"] = self.lm_head.bias
        if self.depth_decoder is not None:
            state.update({f"depth_decoder.{k}": v for k, v in self.depth_decoder.named_parameters()})
        return state

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
            **({"num_codebooks": self.num_codebooks, "depth": self.depth_options.model_dump()} if self.depth_decoder is not None else {}),
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
        """Target features (a collated batch) to codes, LongTensor ``[sum(num_tokens(item))]``
        (``[sum(num_tokens(item)), K]`` with ``K > 1`` codebooks), no grad.

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
        """A LongTensor of one item's codes for the dummy pass on ranks without this modality
        (``[frames, K]`` with ``K > 1`` codebooks); its length is also an item's length in generation.

        Raises:
            NotImplementedError: in the base class.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement dummy_codes()")
