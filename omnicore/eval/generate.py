"""Generation for ``omnicore generate``, ``omnicore eval`` and training's samples and task accuracy.

The decoding itself is :mod:`omnicore.model.generation` (batched, left-padded, KV-cached; greedy by
default, ``generate.temperature: 0``). Here: the ``generate`` section as a :class:`Sampling`, the
prompts ``omnicore generate`` makes, answers in batches of ``generate.batch_size`` with answer ``k``
drawn with seed ``run.seed + k``, decoded media written to files, and :func:`generating`, which puts
a (possibly FSDP2-sharded) model in the state generation needs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from omnicore.config import Config, ConfigError
from omnicore.data.chat import ChatProcessor
from omnicore.data.jsonl import Message, Part, Sample
from omnicore.eval.loading import load_on_device
from omnicore.model.generation import Sampling, generate, generate_batch


def sampling_of(cfg: Config) -> Sampling:
    """The config's ``generate`` section (temperature, top_k, top_p) as a :class:`Sampling`."""
    g = cfg.generate
    return Sampling(g.temperature, g.top_k, g.top_p)


def user_prompt(text: str, media: list[Part] | None = None, where: str = "<command line>") -> Sample:
    """A one-message prompt as ``omnicore generate --prompt TEXT`` makes it: a user message of
    ``media`` (``image``/``audio`` parts) then ``text``; ``where`` names it in errors."""
    return Sample([Message("user", list(media or []) + [Part("text", text)])], where, 0)


MEDIA_FLAGS = ("image", "audio", "video")
"""The media of ``omnicore generate``'s flags (``--image``, ``--audio``, ``--video``), in the order
their parts come before the prompt's text."""


def prompt_media(n_prompts: int, media: dict[str, str | Sequence[str] | None]) -> list[list[Part]]:
    """The media parts of each of ``n_prompts`` prompts, from the repeatable media flags.

    Args:
        n_prompts: how many ``--prompt`` were given.
        media: modality (one of :data:`MEDIA_FLAGS`) -> the files of its flag, in the order given
            (one path, a list, or None / empty when the flag was not given). A flag given once goes
            with every prompt; given once per prompt, its ``k``-th file goes with prompt ``k``.

    Returns:
        ``n_prompts`` lists of :class:`Part`, each in :data:`MEDIA_FLAGS` order.

    Raises:
        ConfigError: a flag is given neither once nor once per prompt (``--image given 3 times for
            2 prompts: ...``); it names both counts and the two ways on.
    """
    out: list[list[Part]] = [[] for _ in range(n_prompts)]
    for kind in MEDIA_FLAGS:
        files = media.get(kind) or []
        files = [files] if isinstance(files, str) else list(files)
        if len(files) not in (0, 1, n_prompts):
            raise ConfigError(
                f"--{kind} given {len(files)} times for {n_prompts} prompt(s): give it once (the same {kind} with every prompt) "
                f"or once per --prompt (the k-th --{kind} goes with the k-th --prompt)"
            )
        for k in range(n_prompts if files else 0):
            out[k].append(Part(kind, files[k if len(files) > 1 else 0]))
    return out


def generate_answers(cfg: Config, model: Any, tokenizer: Any, processor: ChatProcessor, prompts: list[Any]) -> Iterator[dict[str, Any]]:
    """The answers to encoded ``prompts``, in order, as ``omnicore generate`` makes them:
    ``generate.batch_size`` per forward (:func:`generate_batch`), the ``generate`` section's
    ``max_new_tokens`` and sampling, answer ``k`` drawn with seed ``run.seed + k``, stopping at the
    processor's end-of-turn token. Yields each batch's answers as soon as it is done."""
    size = cfg.generate.batch_size
    for b in range(0, len(prompts), size):
        chunk = prompts[b : b + size]
        yield from generate_batch(
            model,
            tokenizer,
            chunk,
            max_new_tokens=cfg.generate.max_new_tokens,
            sampling=sampling_of(cfg),
            seeds=[cfg.run.seed + b + k for k in range(len(chunk))],
            stop_id=processor.end_of_turn_id,
        )


def _generate(cfg: Config, model: Any, tokenizer: Any, processor: ChatProcessor, sample: Sample) -> dict[str, Any]:
    """:func:`generate` of ``sample``'s prompt with the config's ``generate`` section and seed, stopping
    at the end-of-turn token of ``processor``'s chat format."""
    g = cfg.generate
    return generate(
        model,
        tokenizer,
        processor.encode(sample, prompt_only=True),
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_k=g.top_k,
        top_p=g.top_p,
        seed=cfg.run.seed,
        stop_id=processor.end_of_turn_id,
    )


def generate_cli(
    cfg: Config,
    *,
    prompts: list[str],
    image: str | Sequence[str] | None,
    audio: str | Sequence[str] | None,
    out_dir: str,
    checkpoint: str | None,
    export: str | None,
    num_samples: int = 1,
    speak: bool = False,
    video: str | Sequence[str] | None = None,
) -> Iterator[str]:
    """``omnicore generate``: yields lines to print: ``text: '...'`` (the generated text, quoted, so
    that text the model wrote after an image is not mistaken for an answer), then ``saved PATH``
    for each generated image. With several prompts or ``num_samples`` > 1 each answer's line starts
    with ``prompt P, sample S:`` (from 1) and its images are ``generated-pP-sS-MODALITY-I.png``
    (audio: ``.wav``, 16-bit PCM).

    ``image`` / ``audio`` / ``video`` (each one file or several) pair with the prompts as
    :func:`prompt_media` says: one file goes with every prompt, one per prompt goes with its prompt.
    Runs on :func:`eval_device`, ``generate.batch_size`` rows per forward, with the ``generate``
    section's sampling; answer ``k`` (prompt-major) draws with seed ``run.seed + k``. With ``speak`` the answers are also spoken (:func:`speak_cli`).

    Raises:
        ConfigError: ``num_samples`` < 1, or > 1 with greedy decoding (``generate.temperature: 0``
            would give identical answers), or ``run.device: cuda`` without a GPU; a media flag given
            neither once nor once per prompt (:func:`prompt_media`); see :func:`speak_cli`.
    """
    media = prompt_media(len(prompts), {"image": image, "audio": audio, "video": video})
    if num_samples < 1 or (num_samples > 1 and cfg.generate.temperature <= 0):
        raise ConfigError(f"--num-samples {num_samples}: needs 1, or more with sampling (--temperature > 0; greedy answers are all alike)")
    if speak:
        yield from speak_cli(
            cfg, prompts=prompts, image=image, audio=audio, video=video, out_dir=out_dir, export=export, num_samples=num_samples
        )
        return
    model, tokenizer, processor = load_on_device(cfg, checkpoint, export)
    encoded = [processor.encode(user_prompt(p, m), prompt_only=True) for p, m in zip(prompts, media)]
    jobs = [(p, s) for p in range(len(prompts)) for s in range(num_samples)]
    outs = generate_answers(cfg, model, tokenizer, processor, [encoded[p] for p, _ in jobs])
    for (p, s), out in zip(jobs, outs):
        multi = len(jobs) > 1
        label, stem = (f"prompt {p + 1}, sample {s + 1}: ", f"p{p + 1}-s{s + 1}-") if multi else ("", "")
        yield from _answer_lines(out, Path(out_dir), stem, label)


def speak_cli(
    cfg: Config,
    *,
    prompts: list[str],
    image: str | Sequence[str] | None,
    audio: str | Sequence[str] | None,
    out_dir: str,
    export: str | None,
    num_samples: int = 1,
    video: str | Sequence[str] | None = None,
) -> Iterator[str]:
    """``omnicore generate --speak``: each answer written and spoken by a published family whose
    foundation speaks (``FoundationOptional.speak``: Qwen2.5-Omni's talker and token2wav, through
    transformers' own generation of the exported whole model), read from ``export``. Yields the
    lines of :func:`generate_cli`, the speech saved as ``generated-STEMspeech-0.wav``; answer ``k``
    (prompt-major) seeds its speech with ``run.seed + k``. omnicore's own model is built on the meta
    device only for its processors: the family's generation reads the weights.

    Raises:
        ConfigError: no ``export``, or its foundation has no ``speak``; a media flag given neither
            once nor once per prompt (:func:`prompt_media`).
    """
    media = prompt_media(len(prompts), {"image": image, "audio": audio, "video": video})
    from omnicore.eval.loading import model_config_from_export
    from omnicore.model.build import build_foundation, build_omni_model

    if export is None:
        raise ConfigError(
            "--speak: the voice is read from an export (the family's whole model with the trained weights); pass --export EXPORT"
        )
    cfg = cfg.model_copy(update={"model": model_config_from_export(export)})
    speak = getattr(build_foundation(cfg), "speak", None)
    if not callable(speak):
        name = cfg.model.foundation.name
        raise ConfigError(
            f"--speak: foundation {name} does not speak (it has no speak()); drop --speak, or pass the export of a foundation that has one"
        )
    model, tokenizer = build_omni_model(cfg, defer_load=True)  # on meta: its processors and positions are all that is read
    processor = ChatProcessor.for_model(tokenizer, model, cfg.data)
    processors = model.encoder_processors()
    jobs = [(p, s) for p in range(len(prompts)) for s in range(num_samples)]
    for k, (p, s) in enumerate(jobs):
        encoded = processor.encode(user_prompt(prompts[p], media[p]), prompt_only=True)
        out = speak(
            encoded, processors, max_new_tokens=cfg.generate.max_new_tokens, seed=cfg.run.seed + k, stop_id=processor.end_of_turn_id
        )
        label, stem = (f"prompt {p + 1}, sample {s + 1}: ", f"p{p + 1}-s{s + 1}-") if len(jobs) > 1 else ("", "")
        yield from _answer_lines({"text": out["text"], "images": {"speech": [out["audio"]]}}, Path(out_dir), stem, label)


def _answer_lines(out: dict[str, Any], folder: Path, stem: str, label: str) -> Iterator[str]:
    """``LABELtext: '...'``, then ``saved PATH`` per decoded item (``generated-STEMMODALITY-I.png``,
    ``.wav`` for audio: :func:`save_decoded`)."""
    yield f"{label}text: {out['text']!r}"
    for m, imgs in out["images"].items():
        for i, img in enumerate(imgs):
            folder.mkdir(parents=True, exist_ok=True)
            yield f"saved {save_decoded(img, folder / f'generated-{stem}{m}-{i}')}"


def save_decoded(medium: Any, stem: Path) -> Path:
    """Write what a decoder's ``decode`` returned to ``stem`` plus a suffix and return the path: an
    :class:`omnicore.data.media.Audio` as ``STEM.wav`` (16-bit PCM at its own ``sample_rate``, samples
    clipped to [-1, 1]; soundfile), anything else (a ``PIL.Image``) as ``STEM.png``."""
    from omnicore.data.media import Audio

    if isinstance(medium, Audio):
        import numpy as np
        import soundfile as sf

        path = stem.with_name(stem.name + ".wav")
        sf.write(str(path), np.clip(np.asarray(medium.samples, dtype=np.float32), -1.0, 1.0), int(medium.sample_rate), subtype="PCM_16")
        return path
    path = stem.with_name(stem.name + ".png")
    medium.save(path)
    return path


@contextlib.contextmanager
def generating(model: torch.nn.Module) -> Iterator[None]:
    """Run generation on ``model`` (possibly FSDP2-sharded) inside: eval mode and ``torch.no_grad``,
    the FSDP2 root's parameters all-gathered (a collective: every rank enters together) and
    resharded after; every submodule's mode restored exactly on the way out."""
    modes = [(m, m.training) for m in model.modules()]  # restored exactly: frozen parts may stay in eval mode
    root = _fsdp_root(model)
    model.eval()
    try:
        if root is not None:
            root.unshard()  # embeddings, LM head and decoders are used outside the root's forward
        with torch.no_grad():
            yield
    finally:
        if root is not None:
            root.reshard()
        for m, training in modes:
            m.training = training


def check_no_sequence_parallelism(cfg: Config, replicas: int, fields: str) -> None:
    """Generation during training cannot run where several ranks share each sequence: its attention
    would split the prompt over ranks. ``replicas`` is how many ranks read each micro-batch (> 1
    under ``parallel.sp`` > 1); ``fields`` names the config keys that asked for generation.

    Raises:
        ConfigError: ``replicas`` > 1; the message names ``fields`` and what to use instead.
    """
    if replicas > 1:
        raise ConfigError(
            f"{cfg.source}: {fields}: generation during training does not run under sequence parallelism ({replicas} ranks "
            "share each sequence); turn it off and use `omnicore generate` / `omnicore eval` on the checkpoints"
        )


def _fsdp_root(model: torch.nn.Module) -> Any:
    """``model`` when FSDP2 (``fully_shard``) wrapped it, else None."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return None
    return model if isinstance(model, FSDPModule) else None
