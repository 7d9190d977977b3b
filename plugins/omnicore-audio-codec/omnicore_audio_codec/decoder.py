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

**Or one LM position per frame** (option ``codebooks: depth``): codes are ``[F, n_q]`` (entry ``j``
of every codebook is ``j``), a frame's input embedding is the sum of its codes' embeddings, the LM
head scores codebook 0 and a depth decoder the rest (:class:`omnicore.api.CodebookDecoder` with
``num_codebooks=n_q``; CSM's design). A clip then costs ``F`` LM positions instead of ``F * n_q``.

Data flow (R = the codec's sample rate, hop = ``hop_length``, H = the foundation's hidden size):

* :meth:`preprocess`: :class:`omnicore.api.Audio` -> mono at R, padded with silence to
  ``max_seconds`` -> ``input_values`` float32 ``[R * max_seconds]``;
* :meth:`encode`: each item alone through ``EncodecModel.encode(x, bandwidth=...)`` ->
  ``[n_q, F]`` -> offsets ``k * bins`` -> frame-major LongTensor ``[F * n_q]``, items concatenated;
* :meth:`embed` / :meth:`head`: the trainable LM adapter (``nn.Embedding(C, H)``, ``nn.Linear(H, C)``);
* :meth:`decode`: ``[F * n_q]`` -> ``EncodecModel.decode`` -> ``F * hop`` samples, clamped to
  [-1, 1], resampled to 16 kHz -> :class:`omnicore.api.Audio`.

The one formula shared by the data side and the model: ``num_tokens = ceil(samples / hop) * n_q``
(flat) or ``ceil(samples / hop)`` (depth).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnicore.api import Audio, CodebookDecoder, load_hf_pretrained, resample
from omnicore_audio_codec.processor import (
    COMPONENT,
    DEFAULT_CONFIG,
    OUTPUT_RATE,
    WHAT_TO_PUT,
    CodecProcessor,
    EncodecOptions,
    build_processor,
    layout_of,
    make_codec_config,
    num_quantizers_at,
    processor_for,
    resolve,
)

__all__ = ["DEFAULT_CONFIG", "EncodecAudioDecoder", "EncodecOptions", "build", "build_processor", "make_codec_config"]


class EncodecAudioDecoder(CodebookDecoder):
    """omnicore :class:`~omnicore.api.Decoder` for audio around a transformers ``EncodecModel``
    (a :class:`~omnicore.api.CodebookDecoder`: the LM adapter, freezing and saving are the base's).

    Args:
        codec: an ``EncodecModel`` (mono, ``normalize`` false, no chunking).
        hidden_size: H, the foundation's hidden size.
        bandwidth: kbps, one of ``codec.config.target_bandwidths``; sets n_q.
        max_seconds: targets are padded to this length (and generation writes this many seconds).
        long_audio: ``"refuse"`` or ``"crop"`` for longer targets.
        freeze_codec: freeze the codec (``requires_grad=False``, kept in eval mode).
        codebooks: ``"flat"`` (n_q LM positions a frame) or ``"depth"`` (one, with a depth decoder).
        depth: the depth decoder's sizes (``omnicore.api.DepthOptions`` keys), with ``"depth"``.

    Attributes:
        modality: ``"audio"``.
        bins: entries per codebook (the codec's ``codebook_size``); num_quantizers: n_q.
        codebook_size: C = n_q * bins (the flattened id space, module docstring), or ``bins`` with
            ``codebooks="depth"`` (then ``num_codebooks`` = n_q).
        processor: the data side (:class:`~omnicore_audio_codec.processor.CodecProcessor`).
        codec: the wrapped ``EncodecModel``; ``code_embed`` and ``lm_head``: the LM adapter.
    """

    modality = "audio"
    component = COMPONENT

    def __init__(
        self,
        codec: Any,
        *,
        hidden_size: int,
        bandwidth: float | None = None,
        max_seconds: float = 1.0,
        long_audio: str = "refuse",
        freeze_codec: bool = True,
        codebooks: str = "flat",
        depth: dict[str, Any] | None = None,
    ) -> None:
        bandwidth, _ = num_quantizers_at(codec.config, bandwidth)
        processor: CodecProcessor = processor_for(codec.config, bandwidth, max_seconds, long_audio, codebooks)
        bins = int(codec.config.codebook_size)
        stacked = codebooks == "depth" and processor.num_quantizers > 1  # one codebook: depth and flat are alike
        super().__init__(
            codec,
            processor,
            hidden_size=hidden_size,
            codebook_size=bins if stacked else processor.num_quantizers * bins,
            freeze_tokenizer=freeze_codec,
            tokenizer_attr="codec",
            num_codebooks=processor.num_quantizers if stacked else 1,
            depth=(depth or {}) if stacked else None,
        )
        self.codebooks = "depth" if stacked else "flat"
        self.bandwidth = bandwidth
        self.num_quantizers = processor.num_quantizers
        self.bins = bins
        self.sample_rate = processor.sample_rate
        self.max_seconds = processor.max_seconds

    @property
    def freeze_codec(self) -> bool:
        """Whether the codec is frozen (the base class's ``freeze_tokenizer``)."""
        return self.freeze_tokenizer

    # ---- tokenizer ---------------------------------------------------------------------------

    @torch.no_grad()
    def encode_rvq(self, samples: torch.Tensor) -> torch.Tensor:
        """One clip ``[L]`` (at the codec's rate) -> its RVQ codes ``[n_q, ceil(L / hop)]``, each in
        ``[0, bins)``, by ``EncodecModel.encode(x, bandwidth=self.bandwidth)``; no gradients."""
        p = next(self.codec.parameters())
        x = samples.to(device=p.device, dtype=p.dtype).reshape(1, 1, -1)
        return self.codec.encode(x, bandwidth=self.bandwidth).audio_codes[0, 0]

    def flatten(self, rvq: torch.Tensor) -> torch.Tensor:
        """RVQ codes ``[n_q, F]`` -> the LM's codes: flattened ids ``[F * n_q]`` (frame-major, codebook
        ``k`` offset by ``k * bins``; module docstring), or ``[F, n_q]`` with ``codebooks="depth"``."""
        if self.codebooks == "depth":
            return rvq.long().t().contiguous()
        offsets = torch.arange(self.num_quantizers, device=rvq.device).unsqueeze(1) * self.bins
        return (rvq.long() + offsets).t().reshape(-1)

    def unflatten(self, codes: torch.Tensor) -> torch.Tensor:
        """The LM's codes -> RVQ codes ``[n_q, F]`` in ``[0, bins)``: flattened ids ``[F * n_q]``
        (``id mod bins``), or ``[F, n_q]`` with ``codebooks="depth"``.

        Raises:
            ValueError: if the count is not a positive multiple of n_q or an id is outside [0, C).
        """
        codes = torch.as_tensor(codes).long()
        if self.codebooks == "depth":
            if codes.dim() != 2 or codes.shape[1] != self.num_quantizers or codes.shape[0] == 0:
                raise ValueError(f"encodec decoder: decode needs codes [frames, {self.num_quantizers}], got {tuple(codes.shape)}")
            if int(codes.min()) < 0 or int(codes.max()) >= self.bins:
                raise ValueError(f"encodec decoder: codes must lie in [0, {self.bins}); got [{int(codes.min())}, {int(codes.max())}]")
            return codes.t()
        codes = codes.reshape(-1)
        if codes.numel() == 0 or codes.numel() % self.num_quantizers:
            raise ValueError(f"encodec decoder: decode needs a positive multiple of n_q={self.num_quantizers} codes, got {codes.numel()}")
        if int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size:
            raise ValueError(f"encodec decoder: codes must lie in [0, {self.codebook_size}); got [{int(codes.min())}, {int(codes.max())}]")
        return (codes % self.bins).reshape(-1, self.num_quantizers).t()

    def encode(self, batch: dict[str, Any]) -> torch.Tensor:
        """Waveforms to codes: LongTensor ``[sum_i ceil(num_samples_i / hop) * n_q]``, item by item
        (``[sum_i ceil(num_samples_i / hop), n_q]`` with ``codebooks="depth"``).

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

    def dummy_codes(self) -> torch.Tensor:
        """One item's worth of codes, ``ceil(max_samples / hop) * n_q`` (also the generation length):
        entry 0 of each codebook, ``k * bins`` at the positions of codebook ``k``; zeros
        ``[frames, n_q]`` with ``codebooks="depth"``."""
        frames = self.processor.frames(self.processor.max_samples)
        if self.codebooks == "depth":
            return torch.zeros(frames, self.num_quantizers, dtype=torch.long, device=self.device)
        return (torch.arange(self.num_quantizers, device=self.device) * self.bins).repeat(frames)

    def saved_settings(self) -> dict[str, Any]:
        """``bandwidth`` and ``max_seconds``, recorded by ``save_pretrained`` beside the LM adapter
        (``config.json`` + ``model.safetensors`` from ``EncodecModel.save_pretrained``, so
        ``EncodecModel.from_pretrained(path)`` loads the folder too)."""
        return {"bandwidth": self.bandwidth, "max_seconds": self.max_seconds}


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
        codebooks=layout_of(opts, meta),
        depth=opts.depth if opts.depth is not None else (meta or {}).get("depth"),
    )
    if meta is not None:
        dec.load_adapter(opts.checkpoint)
    return dec.train()  # from_pretrained leaves the codec in eval mode; a frozen one stays so
