"""``decoder/mel_rvq``: speech as MelRVQ codes for an LM, one LM position per frame.

The tokenizer (:class:`~omnicore_audio_mel.tokenizer.MelRVQ`) codes each frame of ``stack`` log-mel
frames with ``k`` residual codebooks of ``C`` entries (the first ``k`` of the folder's ``K``). The
LM sees one position per frame (:class:`omnicore.api.CodebookDecoder` with ``num_codebooks=k``): the
frame's input embedding is the sum of its ``k`` codes' embeddings, the LM head scores codebook 0 and
a small depth decoder codebooks ``1..k-1`` (CSM's and Moshi's design); with ``k = 1`` codes are one
per position and there is no depth decoder.

Data flow (R = the tokenizer's sample rate, H = the foundation's hidden size):

* :meth:`MelProcessor.preprocess`: :class:`omnicore.api.Audio` -> mono at R, padded with silence to
  ``max_seconds`` -> ``input_values`` float32 ``[R * max_seconds]``;
* :meth:`encode`: each item alone through the tokenizer -> LongTensor ``[sum F_i, k]`` (``[sum F_i]``
  with ``k = 1``), codes in ``[0, C)``;
* :meth:`decode`: one item's codes ``[F, k]`` -> the codewords' sum -> Griffin-Lim -> resampled to
  16 kHz -> :class:`omnicore.api.Audio`.

The one formula shared by the data side and the model: ``num_tokens = F = ceil((1 + max(L, n_fft)
// hop) / stack)`` for ``L`` samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnicore.api import Audio, CodebookDecoder, resample
from omnicore_audio_mel.processor import COMPONENT, OUTPUT_RATE, MelOptions, MelProcessor, build_processor, resolve
from omnicore_audio_mel.tokenizer import MelRVQ

__all__ = ["MelAudioDecoder", "MelOptions", "build", "build_processor", "init_codebooks"]


class MelAudioDecoder(CodebookDecoder):
    """omnicore :class:`~omnicore.api.Decoder` for audio around a :class:`MelRVQ` (a
    :class:`~omnicore.api.CodebookDecoder`: the LM adapter, the depth decoder and saving are the base's).

    Args:
        mel: the tokenizer (no parameters: its codebooks are fixed buffers, so its codes are fixed).
        hidden_size: H, the foundation's hidden size.
        num_codebooks: k, codes per frame (the first k of the tokenizer's K); None: K.
        max_seconds: targets are padded to this length (and generation writes this many seconds).
        long_audio: ``"refuse"`` or ``"crop"`` for longer targets.
        depth: the depth decoder's sizes (``omnicore.api.DepthOptions`` keys), with k > 1.

    Attributes:
        modality: ``"audio"``; codebook_size: C (entries of each codebook); num_codebooks: k.
        processor: the data side (:class:`~omnicore_audio_mel.processor.MelProcessor`).
        mel: the tokenizer; ``code_embed``, ``lm_head`` and ``depth_decoder``: the LM adapter.

    Raises:
        ValueError: ``num_codebooks`` above the tokenizer's K.
    """

    modality = "audio"
    component = COMPONENT

    def __init__(
        self,
        mel: MelRVQ,
        *,
        hidden_size: int,
        num_codebooks: int | None = None,
        max_seconds: float = 1.0,
        long_audio: str = "refuse",
        depth: dict[str, Any] | None = None,
    ) -> None:
        c = mel.config
        k = c.num_codebooks if num_codebooks is None else int(num_codebooks)
        if not 1 <= k <= c.num_codebooks:
            raise ValueError(f"mel_rvq decoder: num_codebooks={k}: the tokenizer has {c.num_codebooks} codebooks")
        processor = MelProcessor(c, num_codebooks=k, max_seconds=max_seconds, long_audio=long_audio)
        super().__init__(
            mel,
            processor,
            hidden_size=hidden_size,
            codebook_size=c.codebook_size,
            tokenizer_attr="mel",
            num_codebooks=k,
            depth=(depth or {}) if k > 1 else None,
        )
        self.sample_rate = c.sample_rate
        self.max_seconds = processor.max_seconds

    def encode(self, batch: dict[str, Any]) -> torch.Tensor:
        """Waveforms to codes: LongTensor ``[sum_i F_i, k]`` (``[sum_i F_i]`` with one codebook), item by item.

        Each item is encoded alone (its first ``num_samples[i]`` samples, so padding added by
        :meth:`MelProcessor.collate` never changes its codes). ``input_values`` may be ``[B, L]`` or ``[L]``.
        """
        x = batch["input_values"]
        x = x.unsqueeze(0) if x.dim() == 1 else x
        lengths = batch.get("num_samples")
        lengths = [x.shape[-1]] * x.shape[0] if lengths is None else [int(n) for n in lengths]
        with torch.no_grad():
            codes = torch.cat(
                [self.mel.quantize(self.mel.stack_frames(self.mel.log_mel(x[i, :n])), self.num_codebooks) for i, n in enumerate(lengths)]
            )
        return codes[:, 0] if self.num_codebooks == 1 else codes

    def frames_of(self, codes: torch.Tensor) -> torch.Tensor:
        """One item's codes (``[F, k]``, or ``[F]`` with one codebook) as ``[F, k]``.

        Raises:
            ValueError: on another shape, no frame, or a code outside ``[0, C)`` (the range is named).
        """
        codes = torch.as_tensor(codes).long()
        if self.num_codebooks == 1 and codes.dim() == 1:
            codes = codes.unsqueeze(1)
        if codes.dim() != 2 or codes.shape[1] != self.num_codebooks or codes.shape[0] == 0:
            raise ValueError(f"mel_rvq decoder: decode needs codes [frames, {self.num_codebooks}], got {tuple(codes.shape)}")
        if int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size:
            raise ValueError(f"mel_rvq decoder: codes must lie in [0, {self.codebook_size}); got [{int(codes.min())}, {int(codes.max())}]")
        return codes

    def decode(self, codes: torch.Tensor) -> Audio:
        """Codes of one item -> :class:`omnicore.api.Audio` at 16 kHz: float32 samples in [-1, 1],
        ``(F * stack - 1) * hop`` samples at the tokenizer's rate before resampling (MelRVQ.decode).

        Raises:
            ValueError: on a bad shape or a code outside ``[0, C)`` (:meth:`frames_of`).
        """
        wave = self.mel.decode(self.frames_of(codes)).numpy()
        out = resample(Audio(samples=np.ascontiguousarray(wave, dtype=np.float32), sample_rate=self.sample_rate), OUTPUT_RATE)
        return Audio(samples=np.clip(out.samples, -1.0, 1.0).astype(np.float32), sample_rate=OUTPUT_RATE)

    def dummy_codes(self) -> torch.Tensor:
        """One item's worth of codes, ``frames(max_samples)`` frames of entry 0 (also the generation length)."""
        frames = self.processor.frames(self.processor.max_samples)
        shape = (frames,) if self.num_codebooks == 1 else (frames, self.num_codebooks)
        return torch.zeros(shape, dtype=torch.long, device=self.device)

    def saved_settings(self) -> dict[str, Any]:
        """``max_seconds`` and ``codebooks_used`` (k), recorded by ``save_pretrained`` beside the LM
        adapter (next to the tokenizer's ``config.json`` + ``model.safetensors``, so
        ``MelRVQ.from_pretrained(path)`` loads the folder too)."""
        return {"max_seconds": self.max_seconds, "codebooks_used": self.num_codebooks}


def init_codebooks(mel: MelRVQ) -> MelRVQ:
    """Draw a from-scratch tokenizer's codebooks with torch's RNG, in place, and return it: codebook
    0 uniform over ``[floor_db, 0]`` dB (frames anywhere between silence and the loudest bin), the
    others N(0, 3^2) dB (residuals). Codes of such a tokenizer vary with the audio, but it has not
    been fit; ``python -m omnicore_audio_mel.fit`` fits one."""
    with torch.no_grad():
        books = mel.codebooks
        books[0].uniform_(mel.config.floor_db, 0.0)
        books[1:].normal_(0.0, 3.0)
    return mel


def build(options: dict[str, Any] | MelOptions, *, hidden_size: int) -> MelAudioDecoder:
    """Factory of ``decoder/mel_rvq``: ``build(options, hidden_size=H) -> MelAudioDecoder``.

    With ``checkpoint``: loads the MelRVQ from that local folder; a folder written by
    :meth:`MelAudioDecoder.save_pretrained` also restores the LM adapter (and its ``num_codebooks``,
    ``max_seconds`` and depth sizes, unless given), otherwise the adapter starts afresh. Without: a
    from-scratch MelRVQ of ``options.config`` (:func:`init_codebooks`).

    Raises:
        ValueError: on a bad checkpoint folder or config (the folder, file or field named), more
            codebooks than the tokenizer has, or an adapter saved for another size (file and shapes named).
        pydantic.ValidationError: on invalid options.
    """
    opts = options if isinstance(options, MelOptions) else MelOptions.model_validate(dict(options or {}))
    config, meta, k, max_seconds = resolve(opts)
    mel = MelRVQ.from_pretrained(opts.checkpoint) if opts.checkpoint is not None else init_codebooks(MelRVQ(config))
    dec = MelAudioDecoder(
        mel,
        hidden_size=hidden_size,
        num_codebooks=k,
        max_seconds=max_seconds,
        long_audio=opts.long_audio,
        depth=opts.depth if opts.depth is not None else (meta or {}).get("depth"),
    )
    if meta is not None:
        dec.load_adapter(opts.checkpoint)
    return dec.train()
