"""The EnCodec audio decoder: speech as discrete codes for generation, on transformers' ``EncodecModel``.

EnCodec (Défossez et al. 2022, "High Fidelity Neural Audio Compression", https://arxiv.org/abs/2210.13438)
is a convolutional encoder/decoder (SEANet with an LSTM) around a residual vector quantizer (RVQ):
each latent frame is quantised by ``n_q`` codebooks in turn, codebook ``k`` coding what codebooks
``0..k-1`` left over. transformers implements it as ``EncodecModel``; published weights
(``facebook/encodec_24khz``) load with ``EncodecModel.from_pretrained(folder)``, and so with this plugin.

**Codebook scheme: flattening, frame by frame.** A clip of ``F`` frames has ``F x n_q`` RVQ codes.
They are laid out in one sequence, frame-major: the codes of frame ``f`` sit at positions
``f * n_q .. f * n_q + n_q - 1``, coarse codebook first. Codebook ``k`` uses its own id range: the
id of entry ``j`` of codebook ``k`` is ``k * bins + j`` (``bins`` = the codec's ``codebook_size``), so
the decoder's ``codebook_size`` (the LM head's width) is ``C = n_q * bins``, and the LM learns each
codebook's entries as tokens of their own. This is the "flattening" interleaving pattern of MusicGen
(Copet et al. 2023, "Simple and Controllable Music Generation", https://arxiv.org/abs/2306.05284,
section 2.2), the exact autoregressive factorisation of the RVQ codes; no delay pattern is used.
At a position of codebook ``k``, :meth:`EncodecAudioDecoder.decode` reads any id as
``id mod bins`` (an id of another codebook, which a sampling LM may emit, is not an error).

Data flow (R = the codec's sample rate, hop = ``hop_length``, H = the foundation's hidden size):

* :meth:`preprocess`: :class:`omnicore.api.Audio` -> mono at R, padded with silence to
  ``max_seconds`` -> ``input_values`` float32 ``[R * max_seconds]``;
* :meth:`encode`: each item alone through ``EncodecModel.encode(x, bandwidth=...)`` ->
  ``[n_q, F]`` -> offsets ``k * bins`` -> frame-major LongTensor ``[F * n_q]``, items concatenated;
* :meth:`embed` / :meth:`head`: the trainable LM adapter (``nn.Embedding(C, H)``, ``nn.Linear(H, C)``);
* :meth:`decode`: ``[F * n_q]`` -> ``EncodecModel.decode`` -> ``F * hop`` samples, clamped to
  [-1, 1], resampled to 16 kHz -> :class:`omnicore.api.Audio`.

The one formula shared by the data side and the model: ``num_tokens = ceil(samples / hop) * n_q``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omnicore.api import Audio, load_extra_weights, load_hf_pretrained, resample, save_extra_weights
from omnicore_audio_codec.processor import (
    COMPONENT,
    DEFAULT_CONFIG,
    OUTPUT_RATE,
    WHAT_TO_PUT,
    CodecProcessor,
    EncodecOptions,
    build_processor,
    make_codec_config,
    num_quantizers_at,
    processor_for,
    resolve,
)

__all__ = ["DEFAULT_CONFIG", "EncodecAudioDecoder", "EncodecOptions", "build", "build_processor", "make_codec_config"]


class EncodecAudioDecoder(nn.Module):
    """omnicore :class:`~omnicore.components.Decoder` for audio around a transformers ``EncodecModel``.

    Args:
        codec: an ``EncodecModel`` (mono, ``normalize`` false, no chunking).
        hidden_size: H, the foundation's hidden size.
        bandwidth: kbps, one of ``codec.config.target_bandwidths``; sets n_q.
        max_seconds: targets are padded to this length (and generation writes this many seconds).
        long_audio: ``"refuse"`` or ``"crop"`` for longer targets.
        freeze_codec: freeze the codec (``requires_grad=False``, kept in eval mode).

    Attributes:
        modality: ``"audio"``.
        bins: entries per codebook (the codec's ``codebook_size``); num_quantizers: n_q.
        codebook_size: C = n_q * bins (the flattened id space, module docstring).
        processor: the data side (:class:`~omnicore_audio_codec.processor.CodecProcessor`).
        codec: the wrapped ``EncodecModel``; ``code_embed`` and ``lm_head``: the LM adapter.
    """

    modality = "audio"

    def __init__(
        self,
        codec: Any,
        *,
        hidden_size: int,
        bandwidth: float | None = None,
        max_seconds: float = 1.0,
        long_audio: str = "refuse",
        freeze_codec: bool = True,
    ) -> None:
        super().__init__()
        self.codec = codec
        self.hidden_size = int(hidden_size)
        self.bandwidth, _ = num_quantizers_at(codec.config, bandwidth)
        self.processor: CodecProcessor = processor_for(codec.config, self.bandwidth, max_seconds, long_audio)
        self.num_quantizers = self.processor.num_quantizers
        self.bins = int(codec.config.codebook_size)
        self.codebook_size = self.num_quantizers * self.bins
        self.sample_rate = self.processor.sample_rate
        self.max_seconds = self.processor.max_seconds
        self.freeze_codec = bool(freeze_codec)
        self.code_embed = nn.Embedding(self.codebook_size, self.hidden_size)
        self.lm_head = nn.Linear(self.hidden_size, self.codebook_size)
        nn.init.normal_(self.code_embed.weight, std=0.02)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        nn.init.zeros_(self.lm_head.bias)
        if self.freeze_codec:
            self.codec.requires_grad_(False)
            self.codec.eval()

    def train(self, mode: bool = True) -> EncodecAudioDecoder:
        """As ``nn.Module.train``, but a frozen codec stays in eval mode."""
        super().train(mode)
        if self.freeze_codec:
            self.codec.eval()
        return self

    @property
    def fixed_codes(self) -> bool:
        """True while the codec is frozen (no parameter of it trains, and it is in eval mode): then
        :meth:`encode` is a fixed function of the features, and the core may reuse the codes of a
        target it has seen (``train.code_cache_mb``, :mod:`omnicore.model.code_cache`)."""
        return not self.codec.training and not any(p.requires_grad for p in self.codec.parameters())

    @property
    def device(self) -> torch.device:
        return self.code_embed.weight.device

    # ---- data side: the processor's ----------------------------------------------------------

    def preprocess(self, media: Any) -> dict[str, torch.Tensor]:
        """:meth:`CodecProcessor.preprocess` of :attr:`processor`."""
        return self.processor.preprocess(media)

    def num_tokens(self, features: dict[str, Any]) -> int:
        """:meth:`CodecProcessor.num_tokens` of :attr:`processor`."""
        return self.processor.num_tokens(features)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """:meth:`CodecProcessor.collate` of :attr:`processor`."""
        return self.processor.collate(items)

    # ---- tokenizer ---------------------------------------------------------------------------

    @torch.no_grad()
    def encode_rvq(self, samples: torch.Tensor) -> torch.Tensor:
        """One clip ``[L]`` (at the codec's rate) -> its RVQ codes ``[n_q, ceil(L / hop)]``, each in
        ``[0, bins)``, by ``EncodecModel.encode(x, bandwidth=self.bandwidth)``; no gradients."""
        p = next(self.codec.parameters())
        x = samples.to(device=p.device, dtype=p.dtype).reshape(1, 1, -1)
        return self.codec.encode(x, bandwidth=self.bandwidth).audio_codes[0, 0]

    def flatten(self, rvq: torch.Tensor) -> torch.Tensor:
        """RVQ codes ``[n_q, F]`` -> flattened ids ``[F * n_q]`` (frame-major, codebook ``k`` offset
        by ``k * bins``; module docstring)."""
        offsets = torch.arange(self.num_quantizers, device=rvq.device).unsqueeze(1) * self.bins
        return (rvq.long() + offsets).t().reshape(-1)

    def unflatten(self, codes: torch.Tensor) -> torch.Tensor:
        """Flattened ids ``[F * n_q]`` -> RVQ codes ``[n_q, F]`` in ``[0, bins)`` (``id mod bins``).

        Raises:
            ValueError: if the count is not a positive multiple of n_q or an id is outside [0, C).
        """
        codes = torch.as_tensor(codes).long().reshape(-1)
        if codes.numel() == 0 or codes.numel() % self.num_quantizers:
            raise ValueError(f"encodec decoder: decode needs a positive multiple of n_q={self.num_quantizers} codes, got {codes.numel()}")
        if int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size:
            raise ValueError(f"encodec decoder: codes must lie in [0, {self.codebook_size}); got [{int(codes.min())}, {int(codes.max())}]")
        return (codes % self.bins).reshape(-1, self.num_quantizers).t()

    def encode(self, batch: dict[str, Any]) -> torch.Tensor:
        """Waveforms to codes: LongTensor ``[sum_i ceil(num_samples_i / hop) * n_q]``, item by item.

        Each item is encoded alone (its first ``num_samples[i]`` samples, so padding added by
        :meth:`collate` never changes its codes). ``input_values`` may be ``[B, L]`` or ``[L]``.
        """
        x = batch["input_values"]
        x = x.unsqueeze(0) if x.dim() == 1 else x
        lengths = batch.get("num_samples")
        lengths = [x.shape[-1]] * x.shape[0] if lengths is None else [int(n) for n in lengths]
        return torch.cat([self.flatten(self.encode_rvq(x[i, :n])) for i, n in enumerate(lengths)])

    @torch.no_grad()
    def decode_waveform(self, codes: torch.Tensor) -> torch.Tensor:
        """Flattened codes of one clip ``[F * n_q]`` -> float samples ``[F * hop]`` at the codec's rate
        (unclamped): ``EncodecModel.decode`` of the RVQ codes."""
        rvq = self.unflatten(codes).to(self.codec.device)
        return self.codec.decode(rvq[None, None], [None]).audio_values.reshape(-1)

    def decode(self, codes: torch.Tensor) -> Audio:
        """Codes of one clip ``[F * n_q]`` -> :class:`omnicore.api.Audio` at 16 kHz: float32 samples in
        [-1, 1] (clamped), ``F * hop`` samples at the codec's rate before resampling.

        Raises:
            ValueError: if the count is not a positive multiple of n_q or a code is outside [0, C).
        """
        wave = self.decode_waveform(codes).clamp(-1, 1).float().cpu().numpy()
        out = resample(Audio(samples=np.ascontiguousarray(wave, dtype=np.float32), sample_rate=self.sample_rate), OUTPUT_RATE)
        return Audio(samples=np.clip(out.samples, -1.0, 1.0).astype(np.float32), sample_rate=OUTPUT_RATE)

    # ---- LM adapter --------------------------------------------------------------------------

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[N]`` (long) -> input embeddings ``[N, H]`` (trainable ``nn.Embedding``)."""
        return self.code_embed(codes)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[N, H]`` -> logits ``[N, C]`` over the flattened ids (trainable ``nn.Linear``)."""
        return self.lm_head(hidden)

    def dummy_codes(self) -> torch.Tensor:
        """One item's worth of codes, ``ceil(max_samples / hop) * n_q`` (also the generation length):
        entry 0 of each codebook, ``k * bins`` at the positions of codebook ``k``."""
        frames = self.processor.frames(self.processor.max_samples)
        return (torch.arange(self.num_quantizers, device=self.device) * self.bins).repeat(frames)

    # ---- persistence -------------------------------------------------------------------------

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``path`` loadable by ``build({"checkpoint": path}, hidden_size=H)``.

        Files: ``config.json`` + ``model.safetensors`` (``EncodecModel.save_pretrained``, so
        ``EncodecModel.from_pretrained(path)`` works on it too) and ``omnicore_extra.safetensors``
        (the LM adapter: ``code_embed.weight`` ``[C, H]``, ``lm_head.weight`` ``[C, H]``,
        ``lm_head.bias`` ``[C]``, with ``bandwidth``, ``max_seconds``, ``hidden_size`` and
        ``codebook_size`` recorded). Call it on an unsharded module.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.codec.save_pretrained(str(path), safe_serialization=True)
        save_extra_weights(
            path,
            self.adapter_state(),
            component=COMPONENT,
            bandwidth=self.bandwidth,
            max_seconds=self.max_seconds,
            hidden_size=self.hidden_size,
            codebook_size=self.codebook_size,
        )

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The LM adapter's parameters by name (the tensors themselves, for saving and loading in place)."""
        return {"code_embed.weight": self.code_embed.weight, "lm_head.weight": self.lm_head.weight, "lm_head.bias": self.lm_head.bias}


def load_codec(folder: str | Path) -> Any:
    """Load a transformers ``EncodecModel`` from a local folder (no download), strictly, with
    :func:`omnicore.api.load_hf_pretrained`.

    Raises:
        ValueError: naming the folder and what it must hold, if it is missing, has no ``config.json``
            of an EnCodec model or no weights, or lacks a tensor of the model (named).
    """
    from transformers import EncodecModel

    return load_hf_pretrained(EncodecModel, Path(folder).expanduser(), what="EnCodec", hint=WHAT_TO_PUT)


def init_codebooks(codec: Any) -> Any:
    """Draw a from-scratch codec's codebooks from N(0, 0.05^2) (torch's RNG; about the spread of an
    untrained encoder's latents), in place, and return it.

    transformers initialises them to zeros (the original fills them by k-means on the first batch),
    which would make every entry alike; :func:`omnicore_audio_codec.fit.seed_codebooks` (and the
    fit) start them from real latents instead.
    """
    with torch.no_grad():
        for layer in codec.quantizer.layers:
            layer.codebook.embed.normal_(0.0, 0.05)
            layer.codebook.embed_avg.copy_(layer.codebook.embed)
            if layer.codebook.embed.is_meta and not layer.codebook.inited.is_meta:
                # transformers makes this flag with torch.Tensor([True]), which ignores torch.device("meta")
                layer.codebook.register_buffer("inited", torch.ones_like(layer.codebook.inited, device="meta"))
    return codec


def build(options: dict[str, Any] | EncodecOptions, *, hidden_size: int) -> EncodecAudioDecoder:
    """Factory of ``decoder/encodec``: ``build(options, hidden_size=H) -> EncodecAudioDecoder``.

    With ``checkpoint``: loads the codec from that local folder (:func:`load_codec`); a folder
    written by :meth:`EncodecAudioDecoder.save_pretrained` also restores the LM adapter and its
    ``bandwidth`` and ``max_seconds`` (unless given), otherwise the adapter starts afresh. Without: a
    from-scratch codec of :func:`make_codec_config` (``options.config``), initialised by torch's RNG.

    Raises:
        ValueError: on a bad checkpoint folder or config, a bandwidth the codec lacks, or an adapter
            saved for another hidden or codebook size (file and shapes named).
        pydantic.ValidationError: on invalid options.
    """
    from transformers import EncodecModel

    opts = options if isinstance(options, EncodecOptions) else EncodecOptions.model_validate(dict(options or {}))
    cfg, meta, bandwidth, max_seconds = resolve(opts)
    codec = load_codec(opts.checkpoint) if opts.checkpoint is not None else init_codebooks(EncodecModel(cfg))
    dec = EncodecAudioDecoder(
        codec,
        hidden_size=hidden_size,
        bandwidth=bandwidth,
        max_seconds=max_seconds,
        long_audio=opts.long_audio,
        freeze_codec=opts.freeze_codec,
    )
    if meta is not None:
        load_extra_weights(Path(opts.checkpoint).expanduser(), dec.adapter_state(), component=COMPONENT)
    return dec.train()  # from_pretrained leaves the codec in eval mode; a frozen one stays so
