"""Sample grids: what the model draws while it trains (``samples.every``), by :class:`Sampler`.

**Sample grids.** Every ``samples.every`` steps and at the last step (also when a source with
``on_exhausted: stop`` ends the run early), the model answers each prompt of ``samples.prompts``
(a user message of that text, as ``omnicore generate --prompt TEXT`` makes it) with the ``generate``
section's ``max_new_tokens`` and sampling, prompt ``i`` drawing with seed ``run.seed + i``: the same
answers as ``omnicore generate CONFIG --prompt P0 --prompt P1 ...`` on the same weights, and with
fixed seeds, so the grids of successive steps differ only by what the model learnt. Each prompt is
one cell of one grid: the first image it produced (the first decoder modality, in
``model.decoders`` order, that it opened), or a grey cell when it produced none, labelled with
the prompt (and the modality when the model has several decoders). On rank 0 the grid is written
to ``RUN_DIR/samples/step-NNNNNNNN.png`` (the step zero-padded to 8 digits, as checkpoint folders
are named) and, at the last step, also to ``RUN_DIR/samples/final.png``; each decoder modality
``m``'s images (unlabelled, at their own size, in prompt order, prompts without one left out) go to
the loggers as ``log_images(step, "samples/<m>", images)``. Audio (a decoder whose ``decode`` returns
an :class:`omnicore.data.media.Audio`) is left out of the grid and the loggers: prompt ``k``'s first
clip of modality ``m`` is written as ``RUN_DIR/samples/step-NNNNNNNN-<m>-<k>.wav`` (and
``final-<m>-<k>.wav`` at the last step; 16-bit PCM, :func:`omnicore.eval.generate.save_decoded`). A grid
or clip that cannot be written (a full disk) is a logged warning, never a failed run.

The grid (:func:`sample_grid`): ``rows = ceil(K / 8)`` rows of ``cols = ceil(K / rows)`` cells for
``K`` prompts (at most 8 per row, rows filled evenly), in prompt order, row by row. Every image is
scaled up by the integer factor ``ceil(CELL_MIN / longest side)`` (nearest neighbour, so every
pixel stays a block of equal pixels; at least 1) and pasted at the top left of its cell; a cell is
as wide and as high as the largest scaled image, with a label strip of ``LABEL_HEIGHT`` pixels below
it (the prompt, wrapped on words into at most two lines, cut with ``...`` when longer), and
``PAD`` white pixels between and around cells::

    width  = PAD + cols * (cell width + PAD)
    height = PAD + rows * (cell height + LABEL_HEIGHT + PAD)

(ten 32x32 digits: 5 x 2 cells of 96 x 96, so a 504 x 252 PNG).

**On several processes** every rank generates the same answers (same prompts, seeds and weights),
so that every forward's collectives line up: FSDP2 (and HSDP) all-gather the root's parameters
(embeddings, LM head, decoders: :meth:`FSDPModule.unshard`) for the time of the generation and every
block's and encoder's parameters in its forward, as in training; expert parallelism's all-to-alls
run on every rank alike. Only rank 0 writes files and calls the loggers. Generation does not run
under sequence parallelism (``parallel.sp`` > 1: its attention splits each sequence over ranks),
which building the :class:`Sampler` refuses before step 1 (as the validator refuses
``eval.task_samples``: :func:`omnicore.eval.generate.check_no_sequence_parallelism`).

The model runs under ``torch.no_grad`` in eval mode, and every submodule is put back in its
previous mode after; generation draws from its own seeded generators, so the training that follows
(weights, data order, global RNG) is the same as without samples.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from omnicore.config import Config
from omnicore.data.chat import ChatProcessor, Encoded
from omnicore.data.media import Audio
from omnicore.eval.generate import check_no_sequence_parallelism, generate_answers, generating, save_decoded, user_prompt
from omnicore.parallel.state import ParallelState

logger = logging.getLogger(__name__)

CELL_MIN = 96
"""Images are scaled up (by an integer factor) until their longest side is at least this, in pixels."""
PAD = 4
"""White pixels between cells and around the grid."""
LABEL_HEIGHT = 24
"""Pixels of the label strip under each image (two lines of 12)."""
MAX_COLS = 8
"""Cells per row at most."""
_LINE = 12
_EMPTY = (220, 220, 220)


def grid_shape(n: int) -> tuple[int, int]:
    """``(cols, rows)`` of a grid of ``n`` cells: at most :data:`MAX_COLS` per row, rows filled evenly."""
    rows = max(1, math.ceil(n / MAX_COLS))
    return math.ceil(n / rows), rows


def sample_grid(images: list[Any], labels: list[str]) -> Any:
    """One labelled grid of ``images`` (PIL images, or None for an empty grey cell), laid out as the
    module docstring says; returns an RGB ``PIL.Image``.

    Raises:
        ValueError: no cells, or not one label per image.
    """
    from PIL import Image, ImageDraw, ImageFont

    if not images or len(images) != len(labels):
        raise ValueError(f"sample_grid: need at least one cell and one label per cell; got {len(images)} and {len(labels)}")
    scaled = [None if im is None else _scaled(im.convert("RGB")) for im in images]
    cw = max([CELL_MIN] if all(s is None for s in scaled) else [s.width for s in scaled if s is not None])
    ch = max([CELL_MIN] if all(s is None for s in scaled) else [s.height for s in scaled if s is not None])
    cols, rows = grid_shape(len(images))
    grid = Image.new("RGB", (PAD + cols * (cw + PAD), PAD + rows * (ch + LABEL_HEIGHT + PAD)), "white")
    draw = ImageDraw.Draw(grid)
    font = ImageFont.load_default()
    for i, (im, label) in enumerate(zip(scaled, labels)):
        x, y = PAD + (i % cols) * (cw + PAD), PAD + (i // cols) * (ch + LABEL_HEIGHT + PAD)
        if im is None:
            draw.rectangle([x, y, x + cw - 1, y + ch - 1], fill=_EMPTY)
        else:
            grid.paste(im, (x, y))
        for k, line in enumerate(_wrap(draw, font, label if im is not None else f"{label} (no image)", cw)):
            draw.text((x, y + ch + k * _LINE), line, fill="black", font=font)
    return grid


def _scaled(im: Any) -> Any:
    """``im`` scaled up by ``ceil(CELL_MIN / longest side)``, nearest neighbour (pixel blocks)."""
    from PIL import Image

    f = max(1, math.ceil(CELL_MIN / max(im.width, im.height)))
    return im if f == 1 else im.resize((im.width * f, im.height * f), Image.NEAREST)


def _wrap(draw: Any, font: Any, text: str, width: int) -> list[str]:
    """``text`` in at most two lines that fit ``width`` pixels: wrapped on spaces, the rest cut with ``...``."""
    fits = lambda s: draw.textlength(s, font=font) <= width  # noqa: E731
    lines: list[str] = []
    words = text.split()
    while words and len(lines) < 2:
        line = words.pop(0)
        while words and fits(f"{line} {words[0]}"):
            line = f"{line} {words.pop(0)}"
        lines.append(line)
    if words:  # more than two lines' worth: the rest goes on the last line, which is cut below
        lines[-1] = " ".join([lines[-1], *words])
    out = []
    for line in lines:
        if not fits(line):
            while len(line) > 1 and not fits(line + "..."):
                line = line[:-1]
            line += "..."
        out.append(line)
    return out


def sample_cells(prompts: list[str], modalities: list[str], answers: list[dict[str, Any]]) -> tuple[list[Any], list[str]]:
    """The grid's cells from the answers to ``prompts``: per prompt its first image (first modality
    in ``modalities`` order that it produced; audio is not drawn) or None, and its label."""
    images, labels = [], []
    for prompt, out in zip(prompts, answers):
        m = next((m for m in modalities if _pictures(out, m)), None)
        images.append(None if m is None else _pictures(out, m)[0])
        labels.append(prompt if m is None or len(modalities) == 1 else f"{prompt} [{m}]")
    return images, labels


class Sampler:
    """The sample grids of a training run (module docstring), built once before step 1 and asked
    after every step: ``if sampler.due(step): sampler.run(model, step)`` on every rank (generation is
    a collective under FSDP2; only rank 0 writes files and calls ``log_images``).

    Args:
        cfg: the run's config (``samples.every``, ``samples.prompts``, ``train.max_steps``,
            the ``generate`` section, ``run.seed``).
        tokenizer, processor: the run's tokenizer and chat processor.
        state: the parallel state (``is_main`` decides who writes).
        out_dir: the run folder; grids and clips go to ``OUT_DIR/samples``.
        replicas: ranks that read each micro-batch (> 1 under sequence parallelism).
        log_images: the run's loggers' ``log_images(step, name, images)`` (rank 0).
        log: status lines (``logger.info``).

    Raises:
        ConfigError: sampling is on under sequence parallelism.
        SampleError: a prompt of ``samples.prompts`` cannot be encoded (naming it), before step 1.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        tokenizer: Any,
        processor: ChatProcessor,
        state: ParallelState,
        out_dir: Path,
        replicas: int,
        log_images: Callable[[int, str, list[Any]], None],
        log: Callable[..., None],
    ) -> None:
        self.cfg, self.tokenizer, self.processor, self.state = cfg, tokenizer, processor, state
        self.every, self.prompts = cfg.samples.every, list(cfg.samples.prompts)
        self.folder, self.log_images, self.log = out_dir / "samples", log_images, log
        self.encoded: list[Encoded] = []
        if self.every:
            check_no_sequence_parallelism(cfg, replicas, "samples.every")
            where = "samples.prompts[{}]".format
            self.encoded = [processor.encode(user_prompt(p, where=where(i)), prompt_only=True) for i, p in enumerate(self.prompts)]

    def due(self, step: int, *, final: bool = False) -> bool:
        """Whether the grid is drawn after step ``step`` (1-based): every ``samples.every``
        steps, at ``train.max_steps``, and when ``final`` (the data ran out: the run ends here)."""
        last = final or step == self.cfg.train.max_steps
        return bool(self.every) and step > 0 and (step % self.every == 0 or last)

    def run(self, model: torch.nn.Module, step: int, *, final: bool = False) -> list[Path]:
        """Draw the answers of the prompts with ``model`` and, on rank 0, write the grid (and at the
        last step or when ``final``, ``final.png``), the audio clips, and hand the images to the
        loggers; every rank calls this together. Returns the files written (rank 0; ``[]``
        elsewhere)."""
        t0 = time.perf_counter()
        last = final or step == self.cfg.train.max_steps
        modalities = list(self.processor.decoders)
        with generating(model):
            answers = list(generate_answers(self.cfg, model, self.tokenizer, self.processor, self.encoded))
        if not self.state.is_main:
            return []
        images, labels = sample_cells(self.prompts, modalities, answers)
        paths = [self.folder / f"step-{step:08d}.png"] + ([self.folder / "final.png"] if last else [])
        try:
            grid = sample_grid(images, labels)
            self.folder.mkdir(parents=True, exist_ok=True)
            for path in paths:
                grid.save(path)
        except OSError as exc:  # a picture is never worth a failed run
            logger.warning("sample grid of step %d not written (%s: %s)", step, type(exc).__name__, exc)
            paths = []
        for m in modalities:
            imgs = [_array(_pictures(o, m)[0]) for o in answers if _pictures(o, m)]
            if imgs:
                self.log_images(step, f"samples/{m}", imgs)
        paths += _write_clips(self.folder, [f"step-{step:08d}"] + (["final"] if last else []), modalities, answers)
        drawn = sum(im is not None for im in images)
        took = time.perf_counter() - t0
        self.log(f"step {step}: samples {drawn}/{len(images)} drawn, {took:.1f} s" + (f"; {paths[0]}" if paths else ""))
        return paths


def _pictures(out: dict[str, Any], m: str) -> list[Any]:
    """The decoded items of modality ``m`` in one answer that are pictures (not audio)."""
    return [x for x in out["images"].get(m, []) if not isinstance(x, Audio)]


def _write_clips(folder: Path, stems: list[str], modalities: list[str], answers: list[dict[str, Any]]) -> list[Path]:
    """Prompt ``k``'s first audio clip of each modality ``m`` as ``FOLDER/STEM-<m>-<k>.wav`` per stem;
    the paths written (a clip that cannot be written is a logged warning)."""
    written = []
    for k, out in enumerate(answers):
        for m in modalities:
            clips = [x for x in out["images"].get(m, []) if isinstance(x, Audio)]
            for stem in stems if clips else []:
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                    written.append(save_decoded(clips[0], folder / f"{stem}-{m}-{k}"))
                except (OSError, RuntimeError) as exc:  # soundfile's errors are RuntimeErrors
                    logger.warning("sample clip %s-%s-%d not written (%s: %s)", stem, m, k, type(exc).__name__, exc)
    return written


def _array(image: Any) -> Any:
    """A PIL image as the numpy ``uint8`` ``[H, W, 3]`` array loggers take."""
    import numpy as np

    return np.asarray(image.convert("RGB"), dtype=np.uint8)
