"""MelRVQ: speech as residual-VQ codes of stacked log-mel frames, spoken back by Griffin-Lim.

Encoding (no learned encoder): a clip ``[L]`` at ``sample_rate`` -> power STFT (``n_fft``, Hann
window, ``hop``, centred, reflect padding) -> ``n_mels`` Slaney mel bands
(``transformers.audio_utils.mel_filter_bank``) -> dB relative to the clip's loudest bin, floored at
``floor_db`` -> ``T = 1 + L // hop`` frames, padded with the floor to a multiple of ``stack`` and
stacked ``stack`` at a time into ``F = ceil(T / stack)`` vectors of ``D = stack * n_mels`` ->
residual vector quantisation: codebook ``k`` (``[C, D]``) takes the entry nearest (Euclidean) to
what codebooks ``0..k-1`` left. The log-mel is the spoken-digit judge's own feature
(``examples/digits/judge_spoken.py``: 40 bands, n_fft 256, hop 80 at 8 kHz, floored at -80 dB).

Decoding: the sum of the codewords of a frame's codes -> ``stack`` log-mel frames -> power ->
a linear magnitude spectrogram by non-negative least squares through the mel filters
(``librosa.util.nnls``, as ``librosa.feature.inverse.mel_to_stft`` does) -> phase by Griffin-Lim
(Griffin and Lim 1984; ``librosa.griffinlim``, fast variant of Perraudin et al. 2013, momentum 0.99,
random initial phase of seed 0, so decoding is deterministic) -> ``(F * stack - 1) * hop`` samples
at a fixed loudness (``loudness_dbfs``). librosa is imported only here, when decoding (it is slow to import).

The codebooks are fitted by residual k-means (:mod:`omnicore_audio_mel.fit`); a folder holds
``config.json`` (:class:`~omnicore_audio_mel.config.MelRVQConfig`) and ``model.safetensors`` (the
tensor ``codebooks`` ``[K, C, D]``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omnicore_audio_mel.config import CONFIG_FILE, WEIGHTS_FILE, WHAT_TO_PUT, MelRVQConfig, read_config

LOUDNESS_WINDOW_S = 0.02


class MelRVQ(nn.Module):
    """The tokenizer (module docstring): ``encode(samples [L]) -> codes [F, K]``, ``decode(codes) -> samples``.

    Args:
        config: a :class:`MelRVQConfig` or its keys (validated).
        codebooks: ``[K, C, D]`` float tensor; None: zeros (to be fitted, or filled by ``from_pretrained``).

    Attributes:
        config: the validated configuration.
        mel_filters: buffer ``[n_fft // 2 + 1, n_mels]`` (derived from the config, not saved).
        codebooks: buffer ``[K, C, D]`` (saved).

    Raises:
        ValueError: if ``codebooks`` has another shape than ``[K, C, D]`` of the config.
    """

    def __init__(self, config: MelRVQConfig | dict[str, Any], codebooks: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = config if isinstance(config, MelRVQConfig) else MelRVQConfig.model_validate(config)
        c = self.config
        shape = (c.num_codebooks, c.codebook_size, c.frame_dim)
        if codebooks is None:
            codebooks = torch.zeros(shape)
        if tuple(codebooks.shape) != shape:
            raise ValueError(f"MelRVQ: codebooks of shape {tuple(codebooks.shape)}; this config needs {list(shape)} (K, C, stack * n_mels)")
        self.register_buffer("mel_filters", mel_filters(c), persistent=False)
        self.register_buffer("codebooks", codebooks.detach().float().clone())

    @property
    def frames_per_second(self) -> float:
        """Code frames per second of audio (:attr:`MelRVQConfig.frames_per_second`)."""
        return self.config.frames_per_second

    def num_frames(self, num_samples: int) -> int:
        """Code frames of a clip of ``num_samples`` samples (:meth:`MelRVQConfig.num_frames`)."""
        return self.config.num_frames(num_samples)

    # ---- analysis ----------------------------------------------------------------------------

    def log_mel(self, samples: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Mono samples ``[L]`` -> ``[1 + max(L, n_fft) // hop, n_mels]`` dB, relative to the loudest bin
        (max 0) and floored at ``floor_db``; a clip shorter than ``n_fft`` is zero-padded to it.

        Raises:
            ValueError: if ``samples`` is not 1-D or is empty.
        """
        c = self.config
        x = torch.as_tensor(np.asarray(samples, dtype=np.float32) if isinstance(samples, np.ndarray) else samples)
        if x.dim() != 1 or x.numel() == 0:
            raise ValueError(f"MelRVQ: expected mono samples of shape [num_samples], got shape {tuple(x.shape)}")
        x = x.to(device=self.codebooks.device, dtype=torch.float32)
        if x.numel() < c.n_fft:
            x = nn.functional.pad(x, (0, c.n_fft - x.numel()))
        window = torch.hann_window(c.n_fft, device=x.device)
        spec = torch.stft(x, c.n_fft, c.hop, window=window, center=True, pad_mode="reflect", return_complex=True)
        db = 10.0 * torch.log10((self.mel_filters.float().t() @ spec.abs().pow(2)).clamp_min(1e-10))
        return (db - db.max()).clamp_min(c.floor_db).t()

    def stack_frames(self, db: torch.Tensor) -> torch.Tensor:
        """Log-mel ``[T, n_mels]`` -> code frames ``[ceil(T / stack), stack * n_mels]``: padded at the end
        with ``floor_db``, each row the ``stack`` mel frames it covers, one after another."""
        s = self.config.stack
        pad = -db.shape[0] % s
        db = nn.functional.pad(db, (0, 0, 0, pad), value=self.config.floor_db)
        return db.reshape(-1, s * db.shape[1])

    def unstack_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """Code frames ``[F, stack * n_mels]`` -> log-mel ``[F * stack, n_mels]`` (the inverse of :meth:`stack_frames`)."""
        return frames.reshape(-1, self.config.n_mels)

    # ---- the codes -----------------------------------------------------------------------------

    def quantize(self, frames: torch.Tensor, num_codebooks: int | None = None) -> torch.Tensor:
        """Code frames ``[F, D]`` -> codes ``[F, k]`` (long) of the first ``k`` codebooks (default all K):
        codebook ``j`` takes the entry nearest to the residual that codebooks ``0..j-1`` left."""
        k = self.config.num_codebooks if num_codebooks is None else int(num_codebooks)
        residual = frames.to(device=self.codebooks.device, dtype=torch.float32)
        codes = []
        for book in self.codebooks[:k].float():
            idx = torch.cdist(residual, book, compute_mode="donot_use_mm_for_euclid_dist").argmin(dim=1)
            residual = residual - book[idx]
            codes.append(idx)
        return torch.stack(codes, dim=1) if codes else torch.zeros(frames.shape[0], 0, dtype=torch.long)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[F, k]`` with ``1 <= k <= K`` -> code frames ``[F, D]``: the sum of the first ``k``
        codebooks' codewords (so fewer codebooks give the coarser reconstruction).

        Raises:
            ValueError: on another shape, or a code outside ``[0, C)`` (the range is named).
        """
        c = self.config
        codes = torch.as_tensor(codes)
        if codes.dim() != 2 or codes.shape[0] == 0 or not 1 <= codes.shape[1] <= c.num_codebooks:
            raise ValueError(
                f"MelRVQ: codes must be [frames >= 1, 1..{c.num_codebooks}] (frames, codebooks), got shape {tuple(codes.shape)}"
            )
        codes = codes.long().to(self.codebooks.device)
        if int(codes.min()) < 0 or int(codes.max()) >= c.codebook_size:
            raise ValueError(f"MelRVQ: codes must lie in [0, {c.codebook_size}); got [{int(codes.min())}, {int(codes.max())}]")
        return sum(self.codebooks[k].float()[codes[:, k]] for k in range(codes.shape[1]))

    @torch.no_grad()
    def encode(self, samples: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Mono samples ``[L]`` at ``sample_rate`` -> codes LongTensor ``[num_frames(L), K]`` in ``[0, C)``.

        Raises:
            ValueError: if ``samples`` is not 1-D or is empty.
        """
        return self.quantize(self.stack_frames(self.log_mel(samples)))

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[F, k]`` (``1 <= k <= K``; fewer codebooks: a coarser clip) -> float32 samples
        ``[(F * stack - 1) * hop]`` at ``sample_rate`` in [-1, 1] (:meth:`synthesise` of the codewords' sum).

        Raises:
            ValueError: on a bad shape or a code outside ``[0, C)`` (:meth:`dequantize`).
        """
        return self.synthesise(self.unstack_frames(self.dequantize(codes)))

    # ---- synthesis -----------------------------------------------------------------------------

    def synthesise(self, db: torch.Tensor) -> torch.Tensor:
        """Log-mel ``[T, n_mels]`` (dB as :meth:`log_mel` gives, floored at ``floor_db``) -> float32 samples
        ``[(T - 1) * hop]`` in [-1, 1]: NNLS through the mel filters, Griffin-Lim, then the fixed
        loudness of ``loudness_dbfs`` (scaled down by the loudest bin when it lies below 0 dB)."""
        import librosa  # slow to import: only when decoding

        c = self.config
        db = db.detach().float().cpu().clamp_min(c.floor_db)
        power = torch.pow(10.0, db / 10.0).t().numpy().astype(np.float64)
        magnitude = np.sqrt(librosa.util.nnls(self.mel_filters.double().cpu().t().numpy(), power))
        wave = librosa.griffinlim(
            magnitude, n_iter=c.griffin_lim_iters, hop_length=c.hop, win_length=c.n_fft, n_fft=c.n_fft, window="hann", random_state=0
        )
        return torch.from_numpy(scale_loudness(wave, c.sample_rate, c.loudness_dbfs + min(float(db.max()), 0.0)))

    # ---- folders -------------------------------------------------------------------------------

    def save_pretrained(self, folder: str | Path, safe_serialization: bool = True) -> None:
        """Write ``folder/config.json`` (the config, ``model_type`` 'mel_rvq') and ``folder/model.safetensors``
        (``codebooks``); :meth:`from_pretrained` reads them back. ``safe_serialization`` is there for
        callers that pass it to transformers' models (``CodebookDecoder.save_pretrained``): always safetensors."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_FILE).write_text(json.dumps(self.config.model_dump(), indent=1) + "\n")
        save_file({"codebooks": self.codebooks.detach().cpu().contiguous()}, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> MelRVQ:
        """The MelRVQ saved in ``folder`` (:meth:`save_pretrained`), on the CPU.

        Raises:
            ValueError: naming the folder or file and what it must hold: a missing folder or file, a
                ``config.json`` that is not JSON, of another ``model_type`` or with a bad field (named), or
                weights without ``codebooks``, with other tensors, or of another shape than the config's.
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = Path(folder).expanduser()
        config = read_config(folder)
        weights = folder / WEIGHTS_FILE
        try:
            tensors = load_file(str(weights))
        except (OSError, SafetensorError) as exc:
            raise ValueError(f"MelRVQ: cannot read {weights}: {exc}; {WHAT_TO_PUT}") from exc
        if set(tensors) != {"codebooks"}:
            raise ValueError(f"MelRVQ: {weights} holds the tensors {sorted(tensors)}; it must hold exactly 'codebooks'")
        try:
            return cls(config, tensors["codebooks"])
        except ValueError as exc:
            raise ValueError(f"{exc} ({weights} against {folder / CONFIG_FILE})") from exc


def mel_filters(config: MelRVQConfig) -> torch.Tensor:
    """``[n_fft // 2 + 1, n_mels]`` float32: triangular Slaney-scale filters with Slaney norm
    (``transformers.audio_utils.mel_filter_bank``; equal to ``librosa.filters.mel``'s defaults)."""
    from transformers.audio_utils import mel_filter_bank

    fb = mel_filter_bank(
        config.n_fft // 2 + 1, config.n_mels, config.fmin, config.top_hz, config.sample_rate, norm="slaney", mel_scale="slaney"
    )
    return torch.tensor(np.asarray(fb, dtype=np.float32), device=torch.get_default_device())  # meta when built there


def scale_loudness(wave: np.ndarray, sample_rate: int, dbfs: float) -> np.ndarray:
    """``wave`` scaled so that its loudest 20 ms window has an RMS of ``dbfs`` (dB re full scale),
    clipped to [-1, 1], as float32; a silent wave stays silent."""
    x = np.asarray(wave, dtype=np.float64)
    win = max(1, round(LOUDNESS_WINDOW_S * sample_rate))
    n = max(len(x) // win, 1)
    frames = np.pad(x, (0, max(n * win - len(x), 0)))[: n * win].reshape(n, win)
    loudest = float(np.sqrt((frames**2).mean(axis=1).max()))
    gain = 10.0 ** (dbfs / 20.0) / loudest if loudest > 0 else 0.0
    return np.clip(x * gain, -1.0, 1.0).astype(np.float32)
