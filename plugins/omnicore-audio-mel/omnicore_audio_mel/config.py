"""The configuration of a :class:`~omnicore_audio_mel.tokenizer.MelRVQ` (its folder's ``config.json``).

No torch here: the decoder's processor reads a folder's configuration through this module alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MODEL_TYPE = "mel_rvq"
"""``config.json``'s ``model_type``: how a tool tells a MelRVQ folder from an EnCodec one."""
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WHAT_TO_PUT = (
    "a MelRVQ folder holds config.json (model_type 'mel_rvq') and model.safetensors (the tensor 'codebooks' "
    "[num_codebooks, codebook_size, stack * n_mels]), as MelRVQ.save_pretrained or `python -m omnicore_audio_mel.fit` write them"
)


class MelRVQConfig(BaseModel):
    """What a MelRVQ computes: the log-mel analysis, the frame stacking, the codebooks' shape, and the
    Griffin-Lim synthesis. Frames per second: ``sample_rate / (hop * stack)``.

    The defaults are the digits example's speech representation (``examples/digits/mel``, chosen by
    the grid of ``examples/digits/README.md``): the spoken-digit judge's analysis (8 kHz, n_fft 256,
    hop 80, 40 mels, -80 dB floor), 8 mel frames per code frame (12.5 frames/s), 8 codebooks of 256.

    Raises:
        pydantic.ValidationError: on unknown keys, a value out of range, ``n_fft < hop``, or
            ``fmax`` above the Nyquist frequency (the field is named).
    """

    model_config = ConfigDict(extra="forbid")

    model_type: Literal["mel_rvq"] = Field(MODEL_TYPE, description="Always 'mel_rvq' (tells this folder from an EnCodec one).")
    sample_rate: int = Field(8000, gt=0, description="Hz; clips are resampled to it before encoding, and decoding returns it.")
    n_fft: int = Field(256, gt=1, description="STFT size in samples (Hann window of the same length).")
    hop: int = Field(80, gt=0, description="STFT hop in samples: one mel frame per hop.")
    n_mels: int = Field(40, gt=0, description="Mel bands (Slaney scale and norm, as librosa's and transformers' defaults).")
    fmin: float = Field(20.0, ge=0, description="Lowest mel band edge in Hz.")
    fmax: float | None = Field(None, gt=0, description="Highest mel band edge in Hz; None: sample_rate / 2.")
    stack: int = Field(8, gt=0, description="Mel frames per code frame: one code frame covers stack * hop samples.")
    num_codebooks: int = Field(8, gt=0, description="K: residual codebooks; codebook k codes what codebooks 0..k-1 left.")
    codebook_size: int = Field(256, gt=1, description="C: entries per codebook.")
    floor_db: float = Field(-80.0, lt=0, description="dB below the clip's loudest mel bin where the log-mel is floored.")
    griffin_lim_iters: int = Field(32, gt=0, description="Griffin-Lim iterations when decoding (librosa.griffinlim, momentum 0.99).")
    loudness_dbfs: float = Field(
        -20.0,
        lt=0,
        description=(
            "Decoded audio is scaled so that its loudest 20 ms have this RMS (dB re full scale), times the decoded "
            "log-mel's loudest bin when that lies below 0 dB (quiet codes decode quiet), then clipped to [-1, 1]."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> MelRVQConfig:
        if self.n_fft < self.hop:
            raise ValueError(f"n_fft={self.n_fft} must be at least hop={self.hop} (frames would skip samples)")
        if self.fmax is not None and self.fmax > self.sample_rate / 2:
            raise ValueError(f"fmax={self.fmax} is above the Nyquist frequency sample_rate/2={self.sample_rate / 2}")
        if self.fmin >= self.top_hz:
            raise ValueError(f"fmin={self.fmin} must lie below fmax={self.top_hz}")
        return self

    @property
    def top_hz(self) -> float:
        """``fmax``, or ``sample_rate / 2`` when it is None."""
        return float(self.fmax if self.fmax is not None else self.sample_rate / 2)

    @property
    def frame_dim(self) -> int:
        """D = ``stack * n_mels``: the length of one code frame's vector (and of a codeword)."""
        return self.stack * self.n_mels

    @property
    def frames_per_second(self) -> float:
        """Code frames per second of audio: ``sample_rate / (hop * stack)``."""
        return self.sample_rate / (self.hop * self.stack)

    def num_frames(self, num_samples: int) -> int:
        """Code frames of a clip of ``num_samples`` samples: ``ceil((1 + max(n, n_fft) // hop) / stack)``
        (the centred STFT's mel frames, a clip shorter than ``n_fft`` padded to it, stacked)."""
        mel = 1 + max(int(num_samples), self.n_fft) // self.hop
        return -(-mel // self.stack)


def read_config(folder: str | Path) -> MelRVQConfig:
    """The :class:`MelRVQConfig` of ``folder/config.json`` (no weights read).

    Raises:
        ValueError: naming the folder or file: a missing folder, a file that is missing or not JSON,
            of another ``model_type``, or with a bad field (named).
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ValueError(f"MelRVQ: folder {folder} does not exist; {WHAT_TO_PUT}")
    file = folder / CONFIG_FILE
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"MelRVQ: cannot read {file}: {exc}; {WHAT_TO_PUT}") from exc
    if not isinstance(data, dict) or data.get("model_type") != MODEL_TYPE:
        got = data.get("model_type") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"MelRVQ: {file} has model_type {got!r}, not {MODEL_TYPE!r}; {WHAT_TO_PUT}")
    try:
        return MelRVQConfig.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"MelRVQ: {file}: {fields}") from exc
