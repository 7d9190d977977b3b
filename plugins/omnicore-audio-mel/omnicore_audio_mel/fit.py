"""Fit a MelRVQ's codebooks: residual k-means on the stacked log-mel frames of speech clips.

Codebook ``k`` is scikit-learn's ``KMeans`` (k-means++ start, Lloyd, one initialisation, seeded
with ``seed + k``) of what codebooks ``0..k-1`` left, the residuals computed with the tokenizer's own
nearest-entry rule (:meth:`MelRVQ.quantize`), so the fit's assignments are the codes ``encode`` gives.
Codebook ``k`` does not depend on ``num_codebooks``: the first ``k`` codebooks of a fit equal a fit of
``k`` codebooks (same data and seed), so a folder of K codebooks serves any smaller count too.
Nothing else is learned (the analysis and Griffin-Lim are fixed), so a fit takes seconds.

CLI::

    python -m omnicore_audio_mel.fit --audio GLOB... [--held-out GLOB...] --out DIR [--config JSON] [--seed 0]

writes ``DIR.tmp`` (``config.json`` + ``model.safetensors``) and renames it to ``DIR``; prints the
mean absolute log-mel error in dB on the held-out clips with 1..K codebooks (the ``floor_db``
padding of the last frame included).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnicore_audio_mel.config import MelRVQConfig
from omnicore_audio_mel.tokenizer import MelRVQ


def clip_frames(model: MelRVQ, clips: list[np.ndarray]) -> torch.Tensor:
    """The stacked log-mel frames ``[sum F_i, D]`` of clips (mono samples at the model's rate), in order."""
    return torch.cat([model.stack_frames(model.log_mel(c)) for c in clips])


def fit_codebooks(model: MelRVQ, frames: torch.Tensor, *, seed: int = 0, max_iter: int = 50) -> MelRVQ:
    """Fill ``model.codebooks`` in place by residual k-means on ``frames`` ``[N, D]``; returns the model.

    Raises:
        ValueError: if there are fewer frames than ``codebook_size`` (k-means needs one per entry).
    """
    from sklearn.cluster import KMeans

    size = model.config.codebook_size
    if frames.shape[0] < size:
        raise ValueError(
            f"MelRVQ fit: {frames.shape[0]} code frames are fewer than codebook_size={size}; give more audio or a smaller codebook"
        )
    residual = frames.float()
    for k in range(model.config.num_codebooks):
        km = KMeans(size, init="k-means++", n_init=1, max_iter=max_iter, random_state=seed + k).fit(residual.numpy())
        model.codebooks[k] = torch.from_numpy(km.cluster_centers_.astype(np.float32))
        residual = residual - model.codebooks[k][_nearest(model, k, residual)]
    return model


def _nearest(model: MelRVQ, k: int, residual: torch.Tensor) -> torch.Tensor:
    """Indices of codebook ``k``'s entries nearest to ``residual`` ``[N, D]`` (as :meth:`MelRVQ.quantize`)."""
    return torch.cdist(residual, model.codebooks[k], compute_mode="donot_use_mm_for_euclid_dist").argmin(dim=1)


def reconstruction_errors(model: MelRVQ, clips: list[np.ndarray]) -> list[float]:
    """Mean absolute log-mel error in dB over all code frames of ``clips`` when the first 1, 2, ..., K
    codebooks are used: entry ``k - 1`` for ``k`` codebooks (non-increasing on the fit's own frames)."""
    frames = clip_frames(model, clips)
    codes = model.quantize(frames)
    return [float((model.dequantize(codes[:, :k]) - frames).abs().mean()) for k in range(1, codes.shape[1] + 1)]


def load_clips(files: list[Path], sample_rate: int) -> list[np.ndarray]:
    """Audio files as mono float32 samples at ``sample_rate`` (soxr; :func:`omnicore.api.resample`)."""
    from omnicore.api import load_audio, resample

    return [np.clip(resample(load_audio(f), sample_rate).samples, -1.0, 1.0).astype(np.float32) for f in files]


def expand(specs: list[str]) -> list[Path]:
    """Files and globs -> files, each glob sorted.

    Raises:
        ValueError: naming a glob that matches no file, or a file that does not exist.
    """
    out = []
    for spec in specs:
        if any(ch in spec for ch in "*?["):
            found = sorted(Path(f) for f in glob.glob(spec, recursive=True) if Path(f).is_file())
            if not found:
                raise ValueError(f"no audio files match {spec!r}")
            out += found
        elif Path(spec).is_file():
            out.append(Path(spec))
        else:
            raise ValueError(f"{spec}: no such audio file")
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m omnicore_audio_mel.fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--audio", required=True, nargs="+", help="audio files or globs to fit on (WAV, FLAC, ...; any rate)")
    ap.add_argument("--held-out", nargs="*", default=[], help="files or globs to report the log-mel error on after fitting")
    ap.add_argument("--out", required=True, help="output folder (written to OUT.tmp, then renamed)")
    ap.add_argument("--config", default="{}", help="MelRVQConfig keys as JSON, or a path to a JSON file (defaults for the rest)")
    ap.add_argument("--seed", type=int, default=0, help="codebook k's k-means uses seed + k")
    ap.add_argument("--max-iter", type=int, default=50, help="Lloyd iterations per codebook at most")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    return ap


def _save(model: MelRVQ, out: Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def _errors_line(errors: list[float]) -> str:
    return "  ".join(f"{k}: {e:.2f}" for k, e in enumerate(errors, 1))


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        ap.error(f"{out} exists; pass --overwrite to replace it")
    try:
        text = Path(args.config).read_text() if os.path.isfile(args.config) else args.config
        keys: dict[str, Any] = json.loads(text)
        model = MelRVQ(MelRVQConfig.model_validate(keys))
        files, held = expand(args.audio), expand(args.held_out)
    except (ValueError, OSError) as exc:  # pydantic's ValidationError is a ValueError: it names the field
        ap.error(f"{exc}")
    c = model.config
    t0 = time.perf_counter()
    clips = load_clips(files, c.sample_rate)
    frames = clip_frames(model, clips)
    print(
        f"fitting on {len(clips)} clips at {c.sample_rate} Hz: {frames.shape[0]} code frames of {c.stack} x {c.n_mels} mels "
        f"({model.frames_per_second:g} frames/s), {c.num_codebooks} codebooks of {c.codebook_size}",
        flush=True,
    )
    fit_codebooks(model, frames, seed=args.seed, max_iter=args.max_iter)
    secs = time.perf_counter() - t0
    _save(model, out)
    print(f"fit in {secs:.1f} s; wrote {out}", flush=True)
    print(f"fit clips, log-mel L1 dB by codebooks used: {_errors_line(reconstruction_errors(model, clips))}", flush=True)
    if held:
        errors = reconstruction_errors(model, load_clips(held, c.sample_rate))
        print(f"held-out ({len(held)} clips), log-mel L1 dB by codebooks used: {_errors_line(errors)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
