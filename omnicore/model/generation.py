"""Batched generation from encoded prompts: text, and decoder media through ``<|m_start|>`` codes.

Several prompts run in one forward: they are left-padded to the longest (``attention_mask`` 0 on the
padding, ``position_ids`` counted from each prompt's first real token, so every row sees the
positions it would see alone), their media placeholders are merged by :meth:`OmniModel.embed_inputs`
once for the whole batch, and the first forward (with the encoders' layer inputs, if any: DeepStack)
fills the foundation's KV cache (``transformers.DynamicCache``). Then every row advances one token per forward. With an mRoPE
foundation (``model.rope``) each row also carries its prompt's 3-D positions (from the processor,
``Encoded.rope_position_ids``), and new tokens continue one past the prompt's largest position.

Text tokens come from the LM head; when a row emits a decoder's ``<|m_start|>`` token, its next
``n`` positions are codes: each is chosen from ``decoder.head(hidden)`` and fed back through
``decoder.embed``, where ``n`` is the length of the decoder's ``dummy_codes()`` (one full item). A
decoder with ``K > 1`` codebooks per frame (``num_codebooks``) fills a whole frame per position:
codebook 0 from ``head``, then codebooks ``1..K-1`` from its depth decoder
(``decoder.depth_generate``, drawing with the row's own generator), and the frame's ``K`` codes are
embedded together;
``decoder.decode(codes)`` then turns them into the medium (a PIL image). Rows in text mode and rows
inside an item advance in the same forward. A row stops at the end-of-turn id or after
``max_new_tokens`` text tokens (an item it has opened is finished first); finished rows are fed a
zero vector, whose outputs are never read, until the whole batch is done.

Choosing each token (:class:`Sampling`): greedy (argmax) at temperature 0, else a draw from the
softmax of ``logits / temperature`` restricted to the ``top_k`` most likely and to the smallest set
whose probability reaches ``top_p``. Every row draws from its own ``torch.Generator`` seeded with
its own seed, on the CPU, so a row's answer depends neither on the batch it runs in nor on the
device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omnicore.data.chat import Encoded, encoder_processors, module_processors
from omnicore.data.packing import collate, to_device


@dataclass(frozen=True)
class Sampling:
    """How each next token (text or decoder code) is chosen.

    Args:
        temperature: 0 is greedy (argmax); otherwise the softmax temperature (> 0).
        top_k: keep only the ``top_k`` most likely tokens before drawing; 0 keeps all.
        top_p: keep only the smallest set of most likely tokens whose probability reaches ``top_p``
            (nucleus sampling, in (0, 1]); 1 keeps all.

    Raises:
        ValueError: a negative temperature or ``top_k``, or ``top_p`` outside (0, 1].
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"sampling: need temperature >= 0, top_k >= 0 and 0 < top_p <= 1; got {self}")

    @property
    def greedy(self) -> bool:
        """Whether tokens are chosen by argmax (temperature 0)."""
        return self.temperature <= 0


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The next token id from one row of logits ``[V]`` (see :class:`Sampling`); draws on the CPU
    with ``generator``."""
    if sampling.greedy:
        return int(logits.argmax())
    x = logits.detach().float().cpu() / sampling.temperature
    if sampling.top_k and sampling.top_k < x.numel():
        kth = x.topk(sampling.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if sampling.top_p < 1:
        p, order = probs.sort(descending=True)
        drop = (p.cumsum(0) - p) >= sampling.top_p  # the mass before this token already reaches top_p
        probs[order[drop]] = 0.0
    return int(torch.multinomial(probs, 1, generator=generator))


def _pick_rows(logits: torch.Tensor, rows: list[int], sampling: Sampling, gens: list[torch.Generator]) -> list[int]:
    """One id per row of ``logits [R, V]``; ``rows`` are their indices in the batch (for the generators)."""
    if sampling.greedy:
        return [int(t) for t in logits.argmax(-1).tolist()]
    return [pick(logits[j], sampling, gens[r]) for j, r in enumerate(rows)]


@dataclass
class _Row:
    """The generation state of one batch row."""

    out_ids: list[int] = field(default_factory=list)
    images: dict[str, list[Any]] = field(default_factory=dict)
    item: str | None = None  # the decoder modality whose codes are being generated
    codes: list[int] = field(default_factory=list)
    done: bool = False


def _prefill_embeds(
    model: Any, prompts: list[Encoded], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any], torch.Tensor]:
    """Left-padded input embeddings ``[B, T, H]`` (media merged), the attention mask ``[B, T]``, the
    foundation's layer inputs of the prompts' media (``OmniModel.layer_kwargs``: their
    positions re-laid on the padded ``[B, T]``; ``{}`` when no encoder gives layer rows) and the
    left-padded input ids ``[B, T]`` (-1 on the padding: for the foundation's media spans)."""
    mb = collate(prompts, encoder_processors(model), module_processors(model.decoders, "decoder"))
    embeds, _, _, layers = model.embed_inputs(mb.input_ids.to(device), to_device(mb.encoder_inputs, device), {}, mb.wheres)
    lens = [len(p) for p in prompts]
    width = max(lens)
    x = embeds.new_zeros(len(prompts), width, embeds.shape[-1])
    mask = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
    ids = torch.full((len(prompts), width), -1, dtype=torch.long, device=device)
    where = None if layers is None else torch.zeros(len(prompts), width, dtype=torch.bool, device=device)
    start = 0
    for i, n in enumerate(lens):
        x[i, width - n :] = embeds[0, start : start + n]
        mask[i, width - n :] = 1
        ids[i, width - n :] = mb.input_ids[0, start : start + n]
        if where is not None:
            where[i, width - n :] = layers.mask[0, start : start + n]
        start += n
    if layers is not None:  # row-major order over the padded rows is the packed row's order: the rows stay as they are
        layers = type(layers)(where, layers.per_layer)
    return x, mask, model.layer_kwargs(layers), ids


def _rope_prefill(model: Any, prompts: list[Encoded], mask: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """For an mRoPE foundation (``model.rope``): the prompts' 3-D positions left-padded to
    ``[3, B, T]`` (0 on the padding) and, per row, the position of the first new token ``[3, B, 1]``:
    one past the prompt's largest position on any axis (Qwen2-VL's ``rope_deltas``); each new token
    then takes the next one on all three axes. ``(None, None)`` for a 1-D foundation."""
    if getattr(model, "rope", None) is None:
        return None, None
    from omnicore.data.positions import next_position, text_positions

    b, width = mask.shape
    rope = torch.zeros(3, b, width, dtype=torch.long)
    nxt = torch.zeros(3, b, 1, dtype=torch.long)
    for i, p in enumerate(prompts):
        own = p.rope_position_ids if p.rope_position_ids is not None else text_positions(len(p))
        rope[:, i, width - len(p) :] = torch.tensor(own, dtype=torch.long)
        nxt[:, i] = next_position(own)
    return rope.to(mask.device), nxt.to(mask.device)


def _with_rope(pos: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
    """``pos [B, t]``, or with an mRoPE foundation's rows ``[3, B, t]`` the ``[4, B, t]`` it takes."""
    return pos if rope is None else torch.cat([pos.unsqueeze(0), rope], dim=0)


def _forward(model: Any, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any, **extra: Any) -> torch.Tensor:
    """The foundation on ``x [B, t, H]`` with the cache (``extra``: the prefill's layer inputs, and
    the attention masks of its media spans, which replace ``mask``); the last position's hidden
    state ``[B, H]``."""
    kwargs = {"attention_mask": mask, **extra}  # the prefill's media spans may give the masks themselves
    out = model.lm.base_model(inputs_embeds=x, position_ids=pos, cache=cache, use_cache=True, **kwargs)
    return out.last_hidden_state[:, -1]


@torch.no_grad()
def generate_batch(
    model: Any,
    tokenizer: Any,
    prompts: list[Encoded],
    *,
    max_new_tokens: int = 8,
    sampling: Sampling | None = None,
    seeds: list[int] | None = None,
    stop_id: int | None = None,
) -> list[dict[str, Any]]:
    """Continue several encoded prompts (from ``ChatProcessor.encode(..., prompt_only=True)``) together.

    Args:
        model: an :class:`~omnicore.model.omni.OmniModel` in eval mode, on the device to run on.
        tokenizer: its tokenizer (for ``eos_token_id`` and decoding the text).
        prompts: the prompts, of any lengths; media features as the processor encoded them.
        max_new_tokens: text tokens per row at most (decoder codes are not counted).
        sampling: how tokens are chosen (:class:`Sampling`; None: greedy).
        seeds: one seed per prompt for its generator (default: 0 for every row).
        stop_id: the end-of-turn id (the processor's ``end_of_turn_id``); default
            ``tokenizer.eos_token_id``.

    Returns:
        One ``{"text": str, "images": {modality: [PIL images]}, "token_ids": [int]}`` per prompt, in
        order; ``token_ids`` are the emitted text ids (the stop id included when reached).

    Raises:
        ValueError: no prompts, or ``seeds`` of another length.
    """
    from transformers import DynamicCache

    if not prompts or (seeds is not None and len(seeds) != len(prompts)):
        raise ValueError(f"generate_batch: need at least one prompt and one seed per prompt; got {len(prompts)} and {seeds}")
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id if stop_id is None else stop_id
    gens = [torch.Generator().manual_seed(s) for s in (seeds or [0] * len(prompts))]
    sampling = sampling or Sampling()
    x, mask, layer_kwargs, ids = _prefill_embeds(model, prompts, device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # each row counts from its first real token
    rope, nxt = _rope_prefill(model, prompts, mask)
    cache = DynamicCache()
    spans = model.span_kwargs(ids, pos, x, attention_mask=mask, cache=cache)
    # new tokens are text: no layer inputs after, and causal masks (each new token sees every earlier one)
    hidden = _forward(model, x, mask, _with_rope(pos, rope), cache, **layer_kwargs, **spans)
    rows = [_Row() for _ in prompts]
    last = pos[:, -1:]
    while (x := _step(model, rows, hidden, sampling, gens, max_new_tokens, eos)) is not None:
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        last = last + 1
        hidden = _forward(model, x.unsqueeze(1), mask, _with_rope(last, nxt), cache)
        nxt = None if nxt is None else nxt + 1
    return [
        {"text": tokenizer.decode([t for t in r.out_ids if t != eos], skip_special_tokens=True), "images": r.images, "token_ids": r.out_ids}
        for r in rows
    ]


def _step(
    model: Any, rows: list[_Row], hidden: torch.Tensor, sampling: Sampling, gens: list[torch.Generator], max_new: int, eos: int
) -> torch.Tensor | None:
    """Choose every unfinished row's next token from ``hidden [B, H]``; the embeddings ``[B, H]`` to
    feed next, or None when every row is done (no forward needed)."""
    x = hidden.new_zeros(hidden.shape)
    text = [i for i, r in enumerate(rows) if not r.done and r.item is None]
    items = {m: [i for i, r in enumerate(rows) if not r.done and r.item == m] for m in model.decoders}
    start_of = {tid: m for m, tid in model.token_ids["decoder_start"].items()}
    if text:
        toks = _pick_rows(model.lm.get_output_embeddings()(hidden[text]), text, sampling, gens)
        x[text] = model.lm.get_input_embeddings()(torch.tensor(toks, device=x.device)).to(x.dtype)
        for i, tok in zip(text, toks):
            r = rows[i]
            r.out_ids.append(tok)
            r.item = start_of.get(tok)  # an opened item is finished even past max_new_tokens
            r.done = tok == eos or (r.item is None and len(r.out_ids) >= max_new)
    for m, idx in items.items():
        if not idx:
            continue
        dec = model.decoders[m]
        first = torch.tensor(_pick_rows(dec.head(hidden[idx]), idx, sampling, gens), device=x.device)
        if int(getattr(dec, "num_codebooks", 1) or 1) > 1:  # the frame's other codebooks from the depth decoder
            frames = dec.depth_generate(hidden[idx], first, lambda logits, _k, idx=idx: _pick_rows(logits, idx, sampling, gens))
            codes = frames.tolist()
            x[idx] = dec.embed(frames.to(x.device)).to(x.dtype)
        else:
            codes = first.tolist()
            x[idx] = dec.embed(first).to(x.dtype)
        n = int(dec.dummy_codes().shape[0])
        for i, code in zip(idx, codes):
            r = rows[i]
            r.codes.append(code)
            if len(r.codes) == n:
                r.images.setdefault(m, []).append(dec.decode(torch.tensor(r.codes, device=x.device)))
                r.item, r.codes = None, []
                r.done = len(r.out_ids) >= max_new
    return None if all(r.done for r in rows) else x


def generate(
    model: Any,
    tokenizer: Any,
    prompt: Encoded,
    *,
    max_new_tokens: int = 8,
    temperature: float = 0.0,
    seed: int = 0,
    stop_id: int | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> dict[str, Any]:
    """Continue one encoded prompt: :func:`generate_batch` of ``[prompt]`` with seed ``seed``.

    Returns ``{"text": str, "images": {modality: [PIL images]}, "token_ids": [int]}``; text stops at
    ``stop_id`` (the processor's ``end_of_turn_id``: ``<|im_end|>`` for ChatML, the chat template's
    end-of-turn token otherwise; default ``tokenizer.eos_token_id``) or after ``max_new_tokens``
    text tokens.
    """
    sampling = Sampling(temperature, top_k, top_p)
    return generate_batch(model, tokenizer, [prompt], max_new_tokens=max_new_tokens, sampling=sampling, seeds=[seed], stop_id=stop_id)[0]
