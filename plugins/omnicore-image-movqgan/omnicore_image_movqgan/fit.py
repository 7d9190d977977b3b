"""Train the MoVQ autoencoder itself (the tokenizer), before any LM training.

Loss per step, on a random batch of images in [-1, 1]:
``mse(x_hat, x) + l1_weight * l1(x_hat, x) + commit_loss``, where ``commit_loss`` is what diffusers'
``VQModel.decode`` returns from its ``VectorQuantizer`` (codebook term + 0.25 x commitment term, the
VQ-VAE losses of van den Oord et al. 2017); gradients pass the quantiser straight through.
No adversarial or perceptual loss: this is a small, CPU-friendly fit for tests and tiny demos.

Two standard codebook aids keep a small codebook in use (both as in Jukebox, Dhariwal et al. 2020):
the codebook is initialised from encoder outputs of the first batch, and codes unused for
``restart_every`` steps are re-seeded with random encoder outputs of the current batch.

CLI::

    python -m omnicore_image_movqgan.fit --images DIR_OR_GLOB --out DIR --steps N [--config JSON]

writes a plain diffusers ``VQModel`` folder to ``DIR.tmp`` and renames it to ``DIR`` when done; its
config's ``sample_size`` is set to the image size it was fitted at, which
``build({"checkpoint": DIR}, hidden_size=H)`` takes as its default ``image_size``. No LM adapter is
written (it does not exist yet: the LM is trained later).
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

import torch
import torch.nn.functional as F

from omnicore.api import warmup_cosine

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def _vq_and_pixels(model: Any, images: list, image_size: int | None) -> tuple[Any, torch.Tensor]:
    from omnicore_image_movqgan.decoder import MoVQGANDecoder

    if isinstance(model, MoVQGANDecoder):
        if image_size not in (None, model.image_size):
            raise ValueError(f"image_size {image_size} differs from the decoder's {model.image_size}")
        vq, prep = model.vq, model
    else:
        from omnicore_image_movqgan.decoder import MoVQGANDecoder as _D

        vq = model
        size = image_size or int(vq.config.sample_size)
        prep = _D(vq, hidden_size=1, image_size=size, freeze_vq=False)  # only for preprocess
    pixels = torch.stack([prep.processor.preprocess(im)["pixel_values"] for im in images])
    return vq, pixels


def fit_vq(
    model: Any,
    images: list,
    steps: int = 150,
    batch_size: int = 32,
    lr: float = 2e-3,
    seed: int = 0,
    *,
    image_size: int | None = None,
    l1_weight: float = 1.0,
    restart_every: int = 50,
    log_every: int = 0,
) -> list[float]:
    """Fit the VQ autoencoder of ``model`` to ``images``; returns the reconstruction loss per step.

    Args:
        model: a :class:`~omnicore_image_movqgan.decoder.MoVQGANDecoder` (its ``vq`` is trained,
            even if frozen for LM training; its freezing is restored afterwards) or a
            ``diffusers.VQModel`` (then images are resized to ``image_size`` or ``config.sample_size``).
        images: ``PIL.Image`` list (any mode and size; converted to RGB, resized square).
        steps: optimiser steps (Adam, cosine decay to 10% of ``lr``).
        batch_size: images per step, drawn with replacement by a ``torch.Generator(seed)``.
        lr: peak learning rate.
        seed: seeds batch sampling and codebook (re)initialisation; model init is the caller's.
        l1_weight: weight of the L1 term next to the MSE term.
        restart_every: re-seed codes unused in the last this-many steps (0 disables).
        log_every: print a line every this-many steps (0: silent).

    Returns:
        ``mse + l1_weight * l1`` of each step's batch (pixel units of the [-1, 1] range), before
        that step's update; the quantiser loss is optimised but not included.

    Raises:
        ValueError: on no images or ``steps < 1``.
    """
    if not images:
        raise ValueError("fit_vq needs at least one image")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    vq, data = _vq_and_pixels(model, images, image_size)
    p0 = next(vq.parameters())
    data = data.to(device=p0.device, dtype=p0.dtype)
    gen = torch.Generator().manual_seed(seed)
    was_training = vq.training
    old_grad = {n: p.requires_grad for n, p in vq.named_parameters()}
    vq.requires_grad_(True)
    vq.train()
    opt = torch.optim.Adam(vq.parameters(), lr=lr, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(0, steps, 0.1))  # cosine to 10%, no warm-up
    codebook = vq.quantize.embedding.weight
    usage = torch.zeros(codebook.shape[0], dtype=torch.long, device=codebook.device)
    losses: list[float] = []
    t0 = time.perf_counter()
    try:
        for step in range(steps):
            idx = torch.randint(0, data.shape[0], (batch_size,), generator=gen)
            x = data[idx]
            h = vq.encode(x).latents
            z = h.detach().permute(0, 2, 3, 1).reshape(-1, h.shape[1])
            with torch.no_grad():
                if step == 0:
                    _seed_codes(codebook, z, torch.arange(codebook.shape[0], device=codebook.device), gen)
                usage += torch.bincount(torch.cdist(z, codebook).argmin(1), minlength=codebook.shape[0])
                if restart_every and step > 0 and step % restart_every == 0:
                    dead = (usage == 0).nonzero().flatten()
                    if dead.numel():
                        _seed_codes(codebook, z, dead, gen)
                    usage.zero_()
            out = vq.decode(h)
            rec = F.mse_loss(out.sample, x) + l1_weight * F.l1_loss(out.sample, x)
            loss = rec + out.commit_loss.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(rec.detach()))
            if log_every and (step % log_every == 0 or step == steps - 1):
                print(
                    f"step {step:5d}  rec {losses[-1]:.4f}  vq {float(out.commit_loss.detach().mean()):.4f}  {time.perf_counter() - t0:.1f}s",
                    flush=True,
                )
    finally:
        for n, p in vq.named_parameters():
            p.requires_grad_(old_grad[n])
        vq.train(was_training)
        if hasattr(model, "freeze_vq") and model.freeze_vq:
            vq.eval()
    return losses


def _seed_codes(codebook: torch.Tensor, z: torch.Tensor, which: torch.Tensor, gen: torch.Generator) -> None:
    """Set rows ``which`` of the codebook to random encoder outputs ``z`` (plus 1% noise)."""
    pick = torch.randint(0, z.shape[0], (which.numel(),), generator=gen).to(z.device)
    noise = torch.randn(which.numel(), z.shape[1], generator=gen).to(z) * (0.01 * z.std() + 1e-6)
    codebook[which] = z[pick] + noise


@torch.no_grad()
def reconstruction_mse(decoder: Any, images: list, batch_size: int = 256) -> float:
    """Mean squared error, in [-1, 1] pixel units, of encode -> codes -> decode over ``images``."""
    total, count = 0.0, 0
    for i in range(0, len(images), batch_size):
        batch = decoder.processor.collate([decoder.processor.preprocess(im) for im in images[i : i + batch_size]])
        codes = decoder.encode(batch).reshape(len(batch["pixel_values"]), -1)
        rec = decoder.decode_pixels(codes).clamp(-1, 1)
        total += float(((rec - batch["pixel_values"].to(rec)) ** 2).sum())
        count += rec.numel()
    return total / count


def _list_images(spec: str) -> list[Path]:
    p = Path(spec)
    files = (
        sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES)
        if p.is_dir()
        else sorted(Path(f) for f in glob.glob(spec, recursive=True))
    )
    files = [f for f in files if f.is_file()]
    if not files:
        raise ValueError(f"no images found at {spec!r} (give a folder of image files or a glob such as 'digits/*.png')")
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m omnicore_image_movqgan.fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", required=True, help="folder (searched recursively) or glob of image files")
    ap.add_argument("--out", required=True, help="output folder (written to OUT.tmp, then renamed)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--config", default="{}", help="VQModel kwargs as JSON, or a path to a JSON file")
    ap.add_argument("--checkpoint", default=None, help="start from this VQModel folder instead of --config")
    ap.add_argument("--image-size", type=int, default=None, help="square side S in pixels (default 32 or the checkpoint's)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (1 is much faster on a busy 2-core machine)")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    args = ap.parse_args(argv)

    from omnicore.api import load_image
    from omnicore_image_movqgan.decoder import build

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        ap.error(f"{out} exists; pass --overwrite to replace it")
    cfg_text = Path(args.config).read_text() if os.path.isfile(args.config) else args.config
    config = json.loads(cfg_text)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    opts: dict[str, Any] = {"image_size": args.image_size, "freeze_vq": False}
    if args.checkpoint:
        opts["checkpoint"] = args.checkpoint
    else:
        opts["config"] = config
    dec = build(opts, hidden_size=1)
    images = [load_image(f) for f in _list_images(args.images)]
    print(f"fitting on {len(images)} images, {dec.image_size}px -> {dec.num_image_tokens} codes of {dec.codebook_size}", flush=True)
    t0 = time.perf_counter()
    fit_vq(dec, images, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed, log_every=max(1, args.steps // 20))
    secs = time.perf_counter() - t0
    mse = reconstruction_mse(dec, images[:1024])
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    dec.vq.register_to_config(sample_size=dec.image_size)  # the size build() defaults to for this folder
    dec.vq.save_pretrained(str(tmp), safe_serialization=True)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"fit {args.steps} steps in {secs:.1f}s; reconstruction MSE {mse:.4f} ([-1,1] units); wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
