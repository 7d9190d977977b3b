"""Train the EnCodec codec itself (the speech tokenizer), before any LM training.

Loss per step, on a batch of random ``segment_seconds`` crops of the clips at the codec's rate:
``l1(y, x) + mel_weight * multi_resolution_mel_loss(y, x) + commit_weight * commitment``, where
``y`` is the codec's reconstruction through all ``n_q`` codebooks (gradients pass the quantiser
straight through) and ``commitment`` the mean squared distance between the encoder's latents and
their quantised values (VQ-VAE, van den Oord et al. 2017). No adversarial loss: this is a small, CPU-friendly fit.

**Two phases.** For the first ``ae_steps`` steps the quantiser is bypassed (``y`` decodes the
encoder's latents as they are): a plain autoencoder. A from-scratch SEANet spends its first
thousand or so steps on a plateau (quiet noise, held-out log-mel L1 near 1.5 on the spoken digits)
before it starts to reproduce speech; quantising from step 0 on top of that plateau collapsed the
codebooks to a few entries (17 of 256 in use, measured) and the codec never left it. Then the
codebooks are started by k-means on the encoder's latents (SoundStream, Zeghidour et al. 2021,
initialises them by k-means on the first batch; here ``kmeans_batches`` batches, 10 Lloyd
iterations, codebook ``k`` on the residuals left by codebooks ``0..k-1``) and the rest of the steps
train through the quantiser.

The codebooks are transformers' buffers, updated as EnCodec's (after SoundStream) are, by
exponential moving averages of the residuals assigned to each entry (``ema_decay``), not by
gradients; entries unused for ``restart_every`` steps are re-seeded with random residuals of the
current batch (as in Jukebox, Dhariwal et al. 2020).

CLI::

    python -m omnicore_audio_codec.fit --audio 'GLOB' --out DIR --steps N [--ae-steps M] [--config JSON]

writes a plain transformers ``EncodecModel`` folder (``save_pretrained``) to ``DIR.tmp`` and renames
it to ``DIR`` when done; ``build({"checkpoint": DIR}, hidden_size=H)`` loads it. No LM adapter is
written (it does not exist yet: the LM is trained later). Clips are resampled to the codec's rate.
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
import torch.nn.functional as F

from omnicore.api import Audio, resample, warmup_cosine
from omnicore_audio_codec.losses import clip_figures, multi_resolution_mel_loss


def _clips_tensor(clips: list[Audio], rate: int, segment: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Clips resampled to ``rate``, zero-padded to one ``[N, max(longest, segment)]`` tensor, and their lengths."""
    waves = [np.clip(resample(c, rate).samples, -1, 1) for c in clips]
    lengths = torch.tensor([len(w) for w in waves])
    out = torch.zeros(len(waves), max(segment, int(lengths.max())))
    for i, w in enumerate(waves):
        out[i, : len(w)] = torch.from_numpy(np.asarray(w, dtype=np.float32))
    return out, lengths


def _crops(data: torch.Tensor, lengths: torch.Tensor, segment: int, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """``batch_size`` random crops ``[B, segment]``: random clips, a random start within each clip's speech."""
    idx = torch.randint(0, data.shape[0], (batch_size,), generator=gen)
    room = (lengths[idx] - segment).clamp(min=0)
    starts = (torch.rand(batch_size, generator=gen) * (room + 1)).long()
    return torch.stack([data[i, s : s + segment] for i, s in zip(idx.tolist(), starts.tolist())])


def _seed_rows(embed: torch.Tensor, z: torch.Tensor, which: torch.Tensor, gen: torch.Generator) -> None:
    """Set rows ``which`` of a codebook to random vectors of ``z`` ``[N, D]`` (plus 1% noise)."""
    pick = torch.randint(0, z.shape[0], (which.numel(),), generator=gen).to(z.device)
    noise = torch.randn(which.numel(), z.shape[1], generator=gen).to(z) * (0.01 * z.std() + 1e-6)
    embed[which] = z[pick] + noise


def _seed_book(book: Any, residual: torch.Tensor, gen: torch.Generator) -> None:
    """Start one ``EncodecEuclideanCodebook`` from random rows of ``residual`` ``[N, D]`` (EMA state too)."""
    _seed_rows(book.embed, residual, torch.arange(book.embed.shape[0]), gen)
    book.embed_avg.copy_(book.embed)
    book.cluster_size.fill_(1.0)


@torch.no_grad()
def seed_codebooks(decoder: Any, waves: torch.Tensor, seed: int = 0) -> None:
    """Start the decoder's ``n_q`` codebooks from its encoder's latents of ``waves`` ``[B, L]`` (at the
    codec's rate), as :func:`fit_codec` does on its first step: codebook ``k`` gets random residuals
    left by codebooks ``0..k-1`` (plus 1% noise). An untrained encoder's latents vary little between
    frames, so without this most frames of a from-scratch codec share one code."""
    gen = torch.Generator().manual_seed(seed)
    emb = decoder.codec.encoder(waves.reshape(waves.shape[0], 1, -1).to(decoder.codec.device))
    residual = emb.permute(0, 2, 1).reshape(-1, emb.shape[1])
    for layer in decoder.codec.quantizer.layers[: decoder.num_quantizers]:
        _seed_book(layer.codebook, residual, gen)
        residual = residual - layer.codebook.embed[torch.cdist(residual, layer.codebook.embed).argmin(1)]


@torch.no_grad()
def kmeans_codebooks(books: list[Any], latents: torch.Tensor, gen: torch.Generator, iters: int = 10) -> None:
    """Start residual codebooks by k-means (Lloyd's algorithm, ``iters`` rounds) on ``latents``
    ``[N, D]``: codebook ``k`` on what codebooks ``0..k-1`` leave. Centroids start at random rows;
    an entry left empty by a round takes a random row. The EMA state follows the new entries."""
    residual = latents.detach().float()
    for book in books:
        size = book.embed.shape[0]
        centres = residual[torch.randint(0, residual.shape[0], (size,), generator=gen)]
        for _ in range(iters):
            ind = torch.cdist(residual, centres).argmin(1)
            counts = torch.bincount(ind, minlength=size).to(residual.dtype)
            sums = torch.zeros_like(centres).index_add_(0, ind, residual)
            spare = residual[torch.randint(0, residual.shape[0], (size,), generator=gen)]
            centres = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], spare)
        book.embed.copy_(centres)
        book.embed_avg.copy_(centres)
        book.cluster_size.fill_(1.0)
        residual = residual - centres[torch.cdist(residual, centres).argmin(1)]


class EmaQuantizer:
    """Residual quantisation with EMA codebook updates over the first ``n_q`` layers of an
    ``EncodecModel.quantizer`` (module docstring); ``usage`` counts each entry's assignments."""

    def __init__(self, codec: Any, n_q: int, decay: float, gen: torch.Generator) -> None:
        self.books = [layer.codebook for layer in codec.quantizer.layers[:n_q]]
        self.decay, self.gen = decay, gen
        self.usage = [torch.zeros(b.embed.shape[0], device=b.embed.device) for b in self.books]
        self.started = False

    def __call__(self, emb: torch.Tensor, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents ``[B, D, T]`` -> (straight-through quantised latents, commitment loss)."""
        residual = emb.detach().permute(0, 2, 1).reshape(-1, emb.shape[1])
        total = torch.zeros_like(residual)
        for k, book in enumerate(self.books):
            with torch.no_grad():
                if training and not self.started:
                    _seed_book(book, residual, self.gen)
                ind = torch.cdist(residual, book.embed).argmin(1)
                q = book.embed[ind]
                if training:
                    self._ema(k, book, residual, ind)
            total, residual = total + q, residual - q
        self.started = self.started or training
        quant = total.reshape(emb.shape[0], emb.shape[2], -1).permute(0, 2, 1)
        commit = F.mse_loss(emb, quant.detach())
        return emb + (quant - emb).detach(), commit

    def _ema(self, k: int, book: Any, residual: torch.Tensor, ind: torch.Tensor) -> None:
        onehot = F.one_hot(ind, book.embed.shape[0]).to(residual.dtype)
        counts = onehot.sum(0)
        self.usage[k] += counts
        book.cluster_size.mul_(self.decay).add_(counts, alpha=1 - self.decay)
        book.embed_avg.mul_(self.decay).add_(onehot.t() @ residual, alpha=1 - self.decay)
        n = book.cluster_size.sum()
        size = (book.cluster_size + 1e-5) / (n + book.embed.shape[0] * 1e-5) * n
        book.embed.copy_(book.embed_avg / size.unsqueeze(1))

    def restart_dead(self, latents: torch.Tensor) -> int:
        """Re-seed entries unused since the last call with random latents (of the first codebook's
        input, scaled down for later ones); returns how many were re-seeded."""
        z = latents.detach().permute(0, 2, 1).reshape(-1, latents.shape[1])
        count = 0
        for k, book in enumerate(self.books):
            dead = (self.usage[k] == 0).nonzero().flatten()
            if dead.numel():
                _seed_rows(book.embed, z * (0.5**k), dead, self.gen)
                book.embed_avg[dead] = book.embed[dead]
                book.cluster_size[dead] = 1.0
                count += dead.numel()
            self.usage[k].zero_()
        return count


def fit_codec(
    model: Any,
    clips: list[Audio],
    steps: int = 150,
    batch_size: int = 16,
    lr: float = 5e-4,
    seed: int = 0,
    *,
    ae_steps: int = 0,
    kmeans_batches: int = 8,
    segment_seconds: float = 0.5,
    mel_weight: float = 1.0,
    commit_weight: float = 1.0,
    ema_decay: float = 0.95,
    restart_every: int = 25,
    log_every: int = 0,
) -> list[float]:
    """Fit the codec of ``model`` (an :class:`~omnicore_audio_codec.decoder.EncodecAudioDecoder`) to
    ``clips``; returns the reconstruction loss ``l1 + mel_weight * mel`` of each step's batch, before
    that step's update (the commitment term is optimised but not included).

    Args:
        model: the decoder; its ``codec`` is trained at its n_q (freezing restored afterwards).
        clips: :class:`omnicore.api.Audio` clips (any rate; resampled to the codec's).
        steps: optimiser steps in all (Adam, ``lr`` warmed up over ``min(50, steps // 10)`` steps,
            then cosine decay to 10% of it). 2e-3 made the latents grow 100-fold and stall.
        batch_size: crops per step, drawn with a ``torch.Generator(seed)``.
        ae_steps: the first this-many steps bypass the quantiser (module docstring); at step
            ``ae_steps`` the codebooks are started by :func:`kmeans_codebooks` on the latents of
            ``kmeans_batches`` batches. 0: quantise from the first step, the codebooks started from
            random latents of the first batch.
        segment_seconds: length of each crop (clips shorter than it are zero-padded).
        ema_decay: decay of the codebook moving averages; restart_every: re-seed unused entries
            this often (0: never); log_every: print a line every this-many steps (0: silent).

    Raises:
        ValueError: on no clips, ``steps < 1`` or ``ae_steps`` outside ``[0, steps)``.
    """
    if not clips:
        raise ValueError("fit_codec needs at least one clip")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 0 <= ae_steps < steps:
        raise ValueError(f"ae_steps must be in [0, steps={steps}), got {ae_steps}: the last steps must train through the quantiser")
    codec, rate = model.codec, model.sample_rate
    segment = max(codec.config.hop_length, round(segment_seconds * rate))
    data, lengths = _clips_tensor(clips, rate, segment)
    gen = torch.Generator().manual_seed(seed)
    quantizer = EmaQuantizer(codec, model.num_quantizers, ema_decay, gen)
    old_grad = {n: p.requires_grad for n, p in codec.named_parameters()}
    codec.requires_grad_(True)
    codec.train()
    opt = torch.optim.Adam(codec.parameters(), lr=lr, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(min(50, steps // 10), steps, 0.1))
    losses: list[float] = []
    t0 = time.perf_counter()
    try:
        for step in range(steps):
            if ae_steps and step == ae_steps:
                crops = torch.cat([_crops(data, lengths, segment, batch_size, gen) for _ in range(kmeans_batches)])
                with torch.no_grad():
                    emb = codec.encoder(crops.unsqueeze(1).to(codec.device))
                kmeans_codebooks(quantizer.books, emb.permute(0, 2, 1).reshape(-1, emb.shape[1]), gen)
                quantizer.started = True
            x = _crops(data, lengths, segment, batch_size, gen).to(codec.device)
            quantise = step >= ae_steps
            restart = bool(restart_every) and step > ae_steps and (step - ae_steps) % restart_every == 0
            rec, commit = _step(codec, quantizer if quantise else None, x, rate, (mel_weight, commit_weight), restart)
            opt.step()
            sched.step()
            losses.append(rec)
            if log_every and (step % log_every == 0 or step == steps - 1):
                phase = "quantised" if step >= ae_steps else "autoencoder"
                print(f"step {step:5d}  rec {rec:.4f}  commit {commit:.4f}  ({phase})  {time.perf_counter() - t0:.1f}s", flush=True)
    finally:
        for n, p in codec.named_parameters():
            p.requires_grad_(old_grad[n])
        model.train(model.training)  # the codec back to the decoder's mode (eval when frozen)
    return losses


def _step(
    codec: Any, quantizer: EmaQuantizer | None, x: torch.Tensor, rate: int, weights: tuple[float, float], restart: bool
) -> tuple[float, float]:
    """Forward and backward of one batch ``x`` ``[B, L]`` (gradients left in the codec's parameters);
    ``(reconstruction loss, commitment loss)`` as floats. ``weights``: (mel, commitment);
    ``quantizer`` None: the latents are decoded as they are (the autoencoder phase)."""
    emb = codec.encoder(x.unsqueeze(1))
    if quantizer is None:
        quant, commit = emb, emb.new_zeros(())
    else:
        if restart:
            quantizer.restart_dead(emb)
        quant, commit = quantizer(emb, training=True)
    y = codec.decoder(quant)[:, 0, : x.shape[1]]
    rec = F.l1_loss(y, x) + weights[0] * multi_resolution_mel_loss(y, x, rate)
    for p in codec.parameters():
        p.grad = None
    (rec + weights[1] * commit).backward()
    return float(rec.detach()), float(commit.detach())


@torch.no_grad()
def reconstruction_figures(decoder: Any, clips: list[Audio]) -> dict[str, float]:
    """Mean :func:`~omnicore_audio_codec.losses.clip_figures` (``mel_l1``, ``snr_db``) of
    encode -> codes -> decode over ``clips``, each whole (no padding) at the codec's rate."""
    rows = []
    for clip in clips:
        x = torch.from_numpy(np.clip(resample(clip, decoder.sample_rate).samples, -1, 1).astype(np.float32))
        codes = decoder.encode({"input_values": x})
        y = decoder.decode_waveform(codes)[: x.shape[0]].clamp(-1, 1).float().cpu()
        rows.append(clip_figures(y, x, decoder.sample_rate))
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def _list_audio(spec: str) -> list[Path]:
    files = sorted(Path(f) for f in glob.glob(spec, recursive=True))
    files = [f for f in files if f.is_file()]
    if not files:
        raise ValueError(
            f"no audio files match {spec!r} (give a glob such as 'recordings/*_{{5..24}}.wav' expanded by the shell, or 'dir/*.wav')"
        )
    return files


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m omnicore_audio_codec.fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--audio", required=True, nargs="+", help="audio files or globs (WAV, FLAC, ...; any rate)")
    ap.add_argument("--held-out", nargs="*", default=[], help="files or globs to report mel-L1 and SNR on after fitting")
    ap.add_argument("--out", required=True, help="output folder (written to OUT.tmp, then renamed)")
    ap.add_argument("--steps", type=int, default=150, help="optimiser steps in all")
    ap.add_argument("--ae-steps", type=int, default=0, help="of them, the first this-many bypass the quantiser (then k-means codebooks)")
    ap.add_argument("--config", default="{}", help="EncodecConfig kwargs (plus num_quantizers) as JSON, or a path to a JSON file")
    ap.add_argument("--checkpoint", default=None, help="start from this EncodecModel folder instead of --config")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--segment-seconds", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    return ap


def _files(specs: list[str]) -> list[Path]:
    return [f for spec in specs for f in (_list_audio(spec) if any(ch in spec for ch in "*?[") else [Path(spec)])]


def _save_folder(codec: Any, out: Path) -> None:
    """``codec.save_pretrained`` to ``OUT.tmp``, then renamed to ``out`` (replacing it)."""
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    codec.save_pretrained(str(tmp), safe_serialization=True)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    from omnicore.api import load_audio
    from omnicore_audio_codec.decoder import build

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        ap.error(f"{out} exists; pass --overwrite to replace it")
    cfg_text = Path(args.config).read_text() if os.path.isfile(args.config) else args.config
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    opts: dict[str, Any] = {"checkpoint": args.checkpoint} if args.checkpoint else {"config": json.loads(cfg_text)}
    dec = build({**opts, "freeze_codec": False}, hidden_size=1)
    clips = [load_audio(f) for f in _files(args.audio)]
    print(
        f"fitting on {len(clips)} clips at {dec.sample_rate} Hz: {dec.num_quantizers} codebooks of {dec.bins}, hop {dec.processor.hop_length}",
        flush=True,
    )
    t0 = time.perf_counter()
    kwargs = {
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "segment_seconds": args.segment_seconds,
        "ae_steps": args.ae_steps,
    }
    fit_codec(dec, clips, steps=args.steps, log_every=max(1, args.steps // 10), **kwargs)
    secs = time.perf_counter() - t0
    _save_folder(dec.codec, out)
    print(f"fit {args.steps} steps in {secs:.1f}s; wrote {out}", flush=True)
    if args.held_out:
        held = [load_audio(f) for f in _files(args.held_out)]
        figs = reconstruction_figures(dec.eval(), held)
        print(f"held-out ({len(held)} clips): mel_l1 {figs['mel_l1']:.3f}  snr_db {figs['snr_db']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
