"""Multi-dimensional rotary positions (mRoPE) of one sample, computed on the data side.

Foundations such as Qwen2-VL, Qwen2.5-VL and Qwen2.5-Omni's thinker rotate queries and keys by
three positions per token, one per axis (time, height, width; Wang et al. 2024, "Qwen2-VL", §2.1
"Multimodal Rotary Position Embedding"). The rule, per sample, starting at 0:

* a text token (and any media token of a processor without ``grid``, e.g. audio) takes the running
  index ``p`` on all three axes, and the next token ``p + 1``: audio is laid out as Qwen2.5-Omni lays
  out its audio tokens (``arange(len) + start`` on every axis), which is the text layout;
* a block of media tokens with layout ``(t, h, w)`` (:meth:`omnicore.components.Processor.grid`,
  tokens in ``t, h, w`` raster order) starting at ``s`` takes ``(s + i, s + j, s + k)`` for the
  token at ``(i, j, k)``;
* the text after a media block starts at ``max + 1`` over the block (the paper's rule, and
  Qwen2.5-Omni's ``get_rope_index`` in transformers 5.24), or, for :data:`SPATIAL_ADVANCE` model
  types, at ``s + max(h, w)``: transformers 5.24's ``get_rope_index`` of Qwen2-VL, Qwen2.5-VL
  and Qwen3-VL advances by the spatial extent only. The two agree unless ``t > max(h, w)`` (a video with more
  frame groups than its side has tokens); each model type follows its own library function, so a
  model trained here sees the positions its library gives it at inference.

Time is counted in frame groups (temporal step 1, as Qwen2-VL), unless the block's processor gives
a time interval (``Processor.time_interval``): then frame group ``i`` sits at ``floor(i *
interval)``, Qwen2.5-VL's absolute-time scaling (``tokens_per_second * second_per_grid_t``, computed
in float32 as transformers does).

A block may also come with its positions computed by its processor (:class:`FixedRows`, from
``Processor.layout``: Qwen2.5-Omni interleaves a clip's video and audio tokens in time-aligned
chunks whose positions follow no grid rule): its tokens take ``start + offset`` and the text after
it ``start + advance``, ``start`` being the position its first token would take as text.

Pure Python (no torch, no numpy): it runs in data workers for every sample.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MROPE_MODEL_TYPES = frozenset(
    {"qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_vl", "qwen3_vl_text", "qwen2_5_omni_thinker", "qwen2_5_omni_text"}
)
"""transformers model types whose text model rotates by 3-D positions (mRoPE) by the rule of this
module (the ones :mod:`omnicore.model.mrope` builds)."""

SPATIAL_ADVANCE = frozenset({"qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_vl", "qwen3_vl_text"})
"""Model types whose library rule starts the text after a media block at ``start + max(h, w)``."""

AFTER_MEDIA = ("max", "spatial")


@dataclass(frozen=True)
class FixedRows:
    """The positions of one media block as its processor computed them (``ItemLayout.positions``).

    Attributes:
        rows: ``[3][n]`` offsets (time, height, width) of the block's ``n`` tokens from ``start``,
            the position its first token would take as text.
        advance: where the text after the block resumes, as such an offset.
    """

    rows: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    advance: int


@dataclass(frozen=True)
class RopeLayout:
    """What the foundation's rotary embedding needs per token: ``dims`` position axes (3 for
    mRoPE) and where text resumes after a media block (``after_media``: ``"max"`` = one past the
    block's largest position, ``"spatial"`` = ``start + max(h, w)``; see the module docstring)."""

    dims: int = 3
    after_media: str = "max"

    def __post_init__(self) -> None:
        if self.dims != 3 or self.after_media not in AFTER_MEDIA:
            raise ValueError(f"RopeLayout: need dims 3 and after_media in {AFTER_MEDIA}; got {self}")


def rope_layout(config: Any) -> RopeLayout | None:
    """The :class:`RopeLayout` a transformers model ``config`` asks for, or None for plain 1-D
    rotary positions (every model but the mRoPE ones: nothing changes for them).

    mRoPE is recognised by the model type (:data:`MROPE_MODEL_TYPES`, of the config or its text
    config), not by an ``mrope_section`` in the rope parameters: transformers' default configs of
    these types name none (their rotary embedding then uses ``[16, 24, 24]``), and other families
    with one may follow other rules (HunYuan-VL's axes are width, height and image index, or four).
    Qwen3-VL follows this one: its text model interleaves the axes' frequencies itself, and its
    processor writes each frame group of a clip as its own block (``t = 1``, timestamps as text
    between them: ``Processor.runs``), as its ``get_rope_index`` splits ``video_grid_thw`` per
    frame group.

    Any other mRoPE foundation declares its layout itself
    (:meth:`omnicore.components.FoundationOptional.rope_layout`, which overrides this), its
    processors giving each item's positions (``ItemLayout.positions``): the generic family does
    so for every class with a ``get_rope_index``.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = {getattr(config, "model_type", None), getattr(text, "model_type", None)}
    if not types & MROPE_MODEL_TYPES:
        return None
    return RopeLayout(3, "spatial" if types & SPATIAL_ADVANCE else "max")


def _f32(x: float) -> float:
    """``x`` rounded to float32, as torch holds it (a product of two float32 values is exact in a
    Python float, so rounding it once gives torch's float32 product)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def time_rows(t: int, interval: float | None) -> list[int]:
    """Temporal offsets of ``t`` frame groups: ``0 .. t-1`` (Qwen2-VL), or with ``interval`` (positions
    per frame group: Qwen2.5-VL's ``tokens_per_second * second_per_grid_t``) ``floor(i * interval)``
    computed in float32 as transformers' ``get_vision_position_ids`` computes it."""
    if interval is None:
        return list(range(t))
    step = _f32(interval)
    return [int(_f32(float(i) * step)) for i in range(t)]


def mrope_positions(length: int, blocks: Sequence[tuple[Any, ...]], layout: RopeLayout) -> list[list[int]]:
    """The 3-D positions ``[3][length]`` (time, height, width rows) of one sample.

    Args:
        length: the sample's number of tokens.
        blocks: ``(start, (t, h, w))`` per media block with a layout, in token order: the block
            holds the ``t * h * w`` tokens from ``start``, in ``t, h, w`` raster order. Tokens in no
            block are laid out as text. A third item, the block's time interval (positions per
            frame group, :func:`time_rows`; from the processor's optional ``time_interval``), spaces
            the temporal row out by time, as Qwen2.5-VL does for video. Or ``(start, FixedRows)``:
            the block's own positions (:class:`FixedRows`).
        layout: the foundation's :class:`RopeLayout`.

    Raises:
        ValueError: a block overlaps the previous one, runs past ``length``, or has a non-positive
            extent.
    """
    rows: list[list[int]] = [[], [], []]
    at, nxt = 0, 0  # the next token index; the next text position
    for block in blocks:
        if isinstance(block[1], FixedRows):
            start, fixed = block[0], block[1]
            n = len(fixed.rows[0])
            if start < at or start + n > length or any(len(r) != n for r in fixed.rows):
                raise ValueError(f"mrope_positions: fixed block at {start} of {n} tokens does not fit tokens {at}..{length}")
            for r in rows:  # the text before the block
                r.extend(range(nxt, nxt + start - at))
            nxt += start - at
            for r, offsets in zip(rows, fixed.rows, strict=True):
                r.extend(nxt + o for o in offsets)
            nxt += fixed.advance
            at = start + n
            continue
        start, (t, h, w) = block[0], block[1]
        interval = block[2] if len(block) > 2 else None
        if min(t, h, w) < 1 or start < at or start + t * h * w > length:
            raise ValueError(f"mrope_positions: block at {start} with grid {(t, h, w)} does not fit tokens {at}..{length}")
        for r in rows:  # the text before the block
            r.extend(range(nxt, nxt + start - at))
        nxt += start - at
        rows[0].extend(nxt + i for i in time_rows(t, interval) for _ in range(h * w))
        rows[1].extend(nxt + j for _ in range(t) for j in range(h) for _ in range(w))
        rows[2].extend(nxt + k for _ in range(t * h) for k in range(w))
        nxt += max(h, w) if layout.after_media == "spatial" else max(t, h, w)
        at = start + t * h * w
    for r in rows:
        r.extend(range(nxt, nxt + length - at))
    return rows


def text_positions(length: int, start: int = 0) -> list[list[int]]:
    """``[3][length]``: a text-only run from ``start`` (the same index on every axis)."""
    row = list(range(start, start + length))
    return [row, list(row), list(row)]


def next_position(rows: list[list[int]]) -> int:
    """Where a token appended after ``rows`` (``[3][L]``, from :func:`mrope_positions`) goes: one past
    the largest position of any axis (Qwen2-VL's ``rope_deltas``: generation continues there)."""
    return max((max(r) for r in rows if r), default=-1) + 1
