"""Loading a trained model, generation (text and decoder media), and held-out accuracy.

Generation is greedy by default (``generate.temperature: 0``) and uses the foundation's KV cache.
Text tokens come from the LM head; when the model emits a decoder's ``<|m_start|>`` token, the next
``n`` positions are codes: each is chosen from ``decoder.head(hidden)`` and fed back through
``decoder.embed``, where ``n`` is the length of the decoder's ``dummy_codes()`` (one full item); then
``decoder.decode(codes)`` turns them into the medium (a PIL image).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from omnicore.config import Config, ModelConfig
from omnicore.data.chat import ChatProcessor, Encoded
from omnicore.data.jsonl import Message, Part, Sample
from omnicore.data.packing import collate


def model_config_from_export(export_dir: str | Path) -> ModelConfig:
    """The ``model:`` section written by an export, with its relative checkpoint paths made absolute."""
    import yaml

    export_dir = Path(export_dir).resolve()  # absolute: component paths must not depend on the config's folder
    path = export_dir / "omnicore.yaml"
    if not path.is_file():
        from omnicore.checkpoint.dcp import CheckpointError

        raise CheckpointError(f"{export_dir} is not an omnicore export (no omnicore.yaml)")
    section = yaml.safe_load(path.read_text())["model"]
    section["foundation"]["options"]["checkpoint"] = str(export_dir / section["foundation"]["options"]["checkpoint"])
    for kind in ("encoders", "decoders"):
        for comp in section.get(kind, {}).values():
            comp["options"]["checkpoint"] = str(export_dir / comp["options"]["checkpoint"])
    return ModelConfig.model_validate(section)


def load_trained(cfg: Config, checkpoint: str | None = None, export: str | None = None) -> tuple[Any, Any, ChatProcessor]:
    """``(model, tokenizer, processor)`` in eval mode on CPU, from an export or a DCP checkpoint.

    Without either argument, the latest checkpoint under ``run.output_dir`` is used.

    Raises:
        CheckpointError: if there is no such checkpoint or export.
    """
    from omnicore.checkpoint.dcp import latest_checkpoint, load_checkpoint
    from omnicore.model.build import build_omni_model
    from omnicore.model.lora import apply_lora, load_lora_adapter
    from omnicore.parallel.state import ParallelState

    if export is not None:
        cfg = cfg.model_copy(update={"model": model_config_from_export(export)})
        model, tokenizer = build_omni_model(cfg)
        if (Path(export) / "foundation_lora").is_dir():  # model.lora.export: adapter
            load_lora_adapter(model.lm, Path(export) / "foundation_lora")
    else:
        model, tokenizer = build_omni_model(cfg)
        apply_lora(model, cfg.model.lora)  # a LoRA run's checkpoint holds the adapter layers
        folder = Path(checkpoint) if checkpoint else latest_checkpoint(Path(cfg.run.output_dir) / "checkpoints")
        load_checkpoint(folder, model, None, None, ParallelState(0, 1, 0, torch.device("cpu")))
    model.eval()
    processor = ChatProcessor.for_model(tokenizer, model, cfg.data)
    return model, tokenizer, processor


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompt: Encoded,
    *,
    max_new_tokens: int = 8,
    temperature: float = 0.0,
    seed: int = 0,
    stop_id: int | None = None,
) -> dict[str, Any]:
    """Continue an encoded prompt (from ``ChatProcessor.encode(..., prompt_only=True)``).

    Returns ``{"text": str, "images": {modality: [PIL images]}, "token_ids": [int]}``; text stops at
    ``stop_id`` (the processor's ``end_of_turn_id``: ``<|im_end|>`` for ChatML, the chat template's
    end-of-turn token otherwise; default ``tokenizer.eos_token_id``) or after ``max_new_tokens``
    text tokens.
    """
    from transformers import DynamicCache

    mb = collate([prompt], dict(model.encoders), dict(model.decoders))
    embeds, _, _ = model.embed(mb.input_ids, mb.encoder_inputs, {}, mb.wheres)
    start_of = {tid: m for m, tid in model.token_ids["decoder_start"].items()}
    eos = tokenizer.eos_token_id if stop_id is None else stop_id
    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    pos = embeds.shape[1]
    hidden = model.lm.base_model(inputs_embeds=embeds, position_ids=mb.position_ids, cache=cache, use_cache=True).last_hidden_state[:, -1]
    out_ids: list[int] = []
    images: dict[str, list[Any]] = {}

    def feed(x: torch.Tensor) -> torch.Tensor:
        nonlocal pos
        h = model.lm.base_model(
            inputs_embeds=x.view(1, 1, -1), position_ids=torch.tensor([[pos]]), cache=cache, use_cache=True
        ).last_hidden_state[:, -1]
        pos += 1
        return h

    emb = model.lm.get_input_embeddings()
    while len(out_ids) < max_new_tokens:  # every emitted id is a text token; decoder codes are not counted
        tok = _pick(model.lm.get_output_embeddings()(hidden)[0], temperature, gen)
        out_ids.append(tok)
        if tok == eos:
            break
        hidden = feed(emb(torch.tensor([tok])))
        if tok in start_of:
            image, hidden = _generate_item(model.decoders[start_of[tok]], hidden, feed, temperature, gen)
            images.setdefault(start_of[tok], []).append(image)
    text_ids = [t for t in out_ids if t != eos]
    return {"text": tokenizer.decode(text_ids, skip_special_tokens=True), "images": images, "token_ids": out_ids}


def _generate_item(dec: Any, hidden: torch.Tensor, feed: Any, temperature: float, gen: torch.Generator) -> tuple[Any, torch.Tensor]:
    """One full decoder item (``len(dec.dummy_codes())`` codes, each fed back through
    ``dec.embed``) after its start token; returns the decoded medium and the last hidden state."""
    codes = []
    for _ in range(int(dec.dummy_codes().numel())):
        code = _pick(dec.head(hidden)[0], temperature, gen)
        codes.append(code)
        hidden = feed(dec.embed(torch.tensor([code])))
    return dec.decode(torch.tensor(codes)), hidden


def _answer(sample: Sample) -> str | None:
    last = sample.messages[-1]
    if last.role != "assistant" or any(p.type != "text" for p in last.parts):
        return None
    return "".join(p.value for p in last.parts).strip()


def evaluate(cfg: Config, *, checkpoint: str | None = None, export: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """Exact-match accuracy of generated answers on ``data.eval`` samples whose answer is text.

    Samples are grouped by their ``task`` key (or ``default``). Returns
    ``{"accuracy", "correct", "total", "seconds", "tasks": {task: {"accuracy", "correct", "total"}}}``.

    Raises:
        ConfigError: if ``data.eval`` is not set.
    """
    from omnicore.config import ConfigError
    from omnicore.data.jsonl import read_jsonl

    if not cfg.data.eval:
        raise ConfigError(f"{cfg.source}: data.eval: required for `omnicore eval` (a held-out JSONL)")
    model, tokenizer, processor = load_trained(cfg, checkpoint, export)
    samples = [s for s in read_jsonl(cfg.resolve_path(cfg.data.eval)) if _answer(s) is not None]
    samples = samples[:limit] if limit else samples
    t0 = time.perf_counter()
    tasks: dict[str, dict[str, Any]] = {}
    for s in samples:
        out = _generate(cfg, model, tokenizer, processor, s)
        r = tasks.setdefault(str(s.meta.get("task", "default")), {"correct": 0, "total": 0})
        r["total"] += 1
        r["correct"] += int(out["text"].strip() == _answer(s))
    for r in tasks.values():
        r["accuracy"] = r["correct"] / max(r["total"], 1)
    correct, total = sum(r["correct"] for r in tasks.values()), sum(r["total"] for r in tasks.values())
    return {"accuracy": correct / max(total, 1), "correct": correct, "total": total, "seconds": time.perf_counter() - t0, "tasks": tasks}


def _generate(cfg: Config, model: Any, tokenizer: Any, processor: ChatProcessor, sample: Sample) -> dict[str, Any]:
    """:func:`generate` of ``sample``'s prompt with the config's ``generate`` section and seed, stopping
    at the end-of-turn token of ``processor``'s chat format."""
    return generate(
        model,
        tokenizer,
        processor.encode(sample, prompt_only=True),
        max_new_tokens=cfg.generate.max_new_tokens,
        temperature=cfg.generate.temperature,
        seed=cfg.run.seed,
        stop_id=processor.end_of_turn_id,
    )


def generate_cli(
    cfg: Config, *, prompt: str, image: str | None, audio: str | None, out_dir: str, checkpoint: str | None, export: str | None
) -> Iterator[str]:
    """``omnicore generate``: yields lines to print: ``text: '...'`` (the generated text, quoted, so
    that text the model wrote after an image is not mistaken for an answer), then ``saved PATH``
    for each generated image."""
    model, tokenizer, processor = load_trained(cfg, checkpoint, export)
    parts = [Part(k, v) for k, v in (("image", image), ("audio", audio)) if v] + [Part("text", prompt)]
    sample = Sample([Message("user", parts)], "<command line>", 0)
    out = _generate(cfg, model, tokenizer, processor, sample)
    yield f"text: {out['text']!r}"
    folder = Path(out_dir)
    for m, imgs in out["images"].items():
        for i, img in enumerate(imgs):
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"generated-{m}-{i}.png"
            img.save(path)
            yield f"saved {path}"
