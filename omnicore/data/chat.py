"""Chat samples to token ids with placeholder spans, and the special tokens they use.

When the foundation's tokenizer has a chat template (``tokenizer.chat_template``) and
``data.chat_template`` is ``auto``, samples are rendered with that template
(:mod:`omnicore.data.chat_template`: the template's own text between the messages, the parts below
in place of each message's content). Otherwise (the byte tokenizer, or ``data.chat_template:
chatml``) the template is ours, in the style of ChatML::

    <|im_start|>user\\n{parts}<|im_end|>\\n<|im_start|>assistant\\n{parts}<|im_end|>\\n

A media part on the *input* side (any role but assistant) becomes ``N`` copies of the encoder's
placeholder ``<|{modality}_pad|>``, where ``N = processor.num_tokens(features)`` of the encoder's
processor (:class:`omnicore.components.Processor`): the one formula that data and model share
(wrapped in the processor's ``wrap`` tokens; a processor with ``runs`` splits them into several
wrapped runs with text before each, as Qwen3-VL writes a clip's frame groups; a processor with
``layout`` writes the item's tokens itself, :class:`ItemLayout`, as Qwen2.5-Omni interleaves a
clip's video and audio placeholders). A
media part in an *assistant* message is a generation target: it becomes ``<|{modality}_start|>``
followed by ``N`` copies of ``<|{modality}_out|>``, with ``N`` from the decoder's processor (a
published family's decoder processor names its checkpoint's own two tokens, :func:`decoder_tokens`).

Labels are shifted here, on the full sequence, before any packing or sharding: ``labels[i]`` is the
target for position ``i`` (the id of token ``i + 1``) or ``-100``. Text targets are the assistant
messages' text tokens and their closing ``<|im_end|>`` (with a chat template: its end-of-turn
token; with a template that rewrites content, such as Qwen3's dropping earlier ``<think>`` blocks,
each assistant turn as the template writes it). Decoder targets are not in ``labels``: the model
scores the hidden state at the position *before* each ``<|{modality}_out|>`` token against the
decoder's codebook.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omnicore.data.chat_template import (
    TemplateInfo,
    assistant_spans,
    has_template,
    inspect_template,
    join_pieces,
    render,
    render_pieces,
)
from omnicore.data.jsonl import Sample, SampleError
from omnicore.data.media import MediaError, describe_media, load_audio, load_image, load_video, nonfinite_feature
from omnicore.data.positions import FixedRows, mrope_positions

IGNORE_INDEX = -100
"""The label of a position that is not trained (PyTorch's ``cross_entropy`` default ``ignore_index``):
prompts, placeholders and padding; losses and target counts skip it."""
IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|pad|>"


def encoder_token(modality: str) -> str:
    """Placeholder for an encoder's output embeddings, e.g. ``<|audio_pad|>``."""
    return f"<|{modality}_pad|>"


def decoder_start_token(modality: str) -> str:
    """Token that opens a generated span, e.g. ``<|image_start|>``."""
    return f"<|{modality}_start|>"


def decoder_token(modality: str) -> str:
    """Placeholder for one generated code, e.g. ``<|image_out|>``."""
    return f"<|{modality}_out|>"


def decoder_tokens(modality: str, processor: Any = None) -> tuple[str, str]:
    """``(start, placeholder)`` of one decoder modality: the token that opens a generated item and
    the token written once per code position. The processor's own ``start`` and ``placeholder``
    token strings where it has them (a published family's: CSM opens its audio with
    ``<|end_of_text|>`` and writes ``<|AUDIO|>`` per frame), else :func:`decoder_start_token` and
    :func:`decoder_token` (see :class:`omnicore.components.Processor`).

    Raises:
        ValueError: ``start`` or ``placeholder`` is not a non-empty string, or they are the same token.
    """
    start = getattr(processor, "start", None) or decoder_start_token(modality)
    placeholder = getattr(processor, "placeholder", None) or decoder_token(modality)
    for name, value in (("start", start), ("placeholder", placeholder)):
        if not isinstance(value, str):
            raise ValueError(f"the {modality} decoder processor's {name} is {value!r}; give one token string")
    if start == placeholder:
        raise ValueError(f"the {modality} decoder processor's start and placeholder are both {start!r}; they must differ")
    return start, placeholder


def media_tokens(modality: str, processor: Any = None) -> tuple[str, tuple[str, str] | None]:
    """``(placeholder, wrap)`` of one encoder modality: the processor's own ``placeholder`` token
    string (a published family's, e.g. ``<|image_pad|>``, ``<image>``, ``<|AUDIO|>``), else
    :func:`encoder_token`; and its ``wrap`` pair of token strings written around the run (e.g.
    ``("<|vision_start|>", "<|vision_end|>")``), else None (see
    :class:`omnicore.components.Processor`).

    Raises:
        ValueError: ``placeholder`` is not a non-empty string, or ``wrap`` is not two of them.
    """
    placeholder = getattr(processor, "placeholder", None) or encoder_token(modality)
    wrap = getattr(processor, "wrap", None)
    if not isinstance(placeholder, str):
        raise ValueError(f"the {modality} processor's placeholder is {placeholder!r}; give one token string, e.g. '<|{modality}_pad|>'")
    if wrap is not None:
        wrap = tuple(wrap)
        if len(wrap) != 2 or not all(isinstance(t, str) and t for t in wrap):
            raise ValueError(f"the {modality} processor's wrap is {wrap!r}; give two token strings (before, after) or None")
    return placeholder, wrap  # type: ignore[return-value]


@dataclass(frozen=True)
class ItemLayout:
    """How one encoder item is written when its processor writes it itself
    (``Processor.layout(features)``): every token of the item, the items of each modality that fill
    its placeholders, and (for an mRoPE foundation) its positions. Qwen2.5-Omni writes a clip with
    its sound track as ``<|vision_bos|><|audio_bos|>``, then 2-second chunks of ``<|VIDEO|>`` and
    ``<|AUDIO|>`` placeholders in turn, then ``<|audio_eos|><|vision_eos|>``, the audio rows coming
    from the audio encoder; its positions are time-aligned across the two (TMRoPE).

    Attributes:
        tokens: in order, each either a token string written once (``"<|vision_bos|>"``; it must be
            one token of the tokenizer) or ``(modality, count)``: ``count`` placeholders of that
            encoder modality (its processor's ``placeholder``). The item's ``wrap`` is not added:
            list it here.
        items: ``(modality, features)`` of the encoder items whose rows fill those placeholders, in
            order; per modality, their ``num_tokens`` (by that modality's processor) add up to its
            placeholders here. Replaces the item's own features in the sample's media: list them
            too (without what the other items carry), as ``("video", {...})``.
        positions: ``[3][len(tokens written)]`` rotary offsets (time, height, width) of every token
            written, from the position the first would take as text; None: laid out as text. Read
            for an mRoPE foundation only.
        advance: where the text after the item resumes, as such an offset; None: one past the
            largest offset.
    """

    tokens: tuple[str | tuple[str, int], ...]
    items: tuple[tuple[str, dict[str, Any]], ...]
    positions: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None
    advance: int | None = None


def _encoder_table(encoders: Any) -> dict[str, Any]:
    """``modality -> processor or None`` from a list of modalities or a mapping to processors."""
    return dict(encoders) if isinstance(encoders, Mapping) else {m: None for m in encoders}


def special_tokens(encoders: Any, decoder_modalities: Any) -> list[str]:
    """Every special token a model with these encoders and decoders needs, in a fixed order: ChatML's
    three, then per encoder modality (sorted) its placeholder and wrap tokens
    (:func:`media_tokens`), then per decoder modality (sorted) its start and code tokens
    (:func:`decoder_tokens`).

    ``encoders``: a list of modalities (omnicore's ``<|m_pad|>`` placeholders), or a mapping
    modality -> processor, whose ``placeholder`` / ``wrap`` are used where it has them.
    ``decoder_modalities``: likewise a list of modalities (``<|m_start|>``, ``<|m_out|>``), or a
    mapping modality -> processor, whose ``start`` / ``placeholder`` are used where it has them.
    """
    toks = [IM_START, IM_END, PAD]
    table = _encoder_table(encoders)
    for m in sorted(table):
        placeholder, wrap = media_tokens(m, table[m])
        toks += [placeholder] + (list(wrap) if wrap else [])
    decoders = _encoder_table(decoder_modalities)
    for m in sorted(decoders):
        toks += list(decoder_tokens(m, decoders[m]))
    return list(dict.fromkeys(toks))


def _token_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` in ``tokenizer``, or None when it is not one token there."""
    i = tokenizer.convert_tokens_to_ids(token)
    unk = tokenizer.unk_token_id
    return None if i is None or (unk is not None and i == unk and token != tokenizer.unk_token) else int(i)


def placeholder_ids(tokenizer: Any, encoders: Any, decoder_modalities: Any) -> dict[str, dict[str, int]]:
    """The one table of placeholder token ids, shared by the data side (:class:`ChatProcessor`)
    and the model (:class:`omnicore.model.omni.OmniModel`'s ``token_ids``).

    Args:
        encoders: encoder modalities, or a mapping modality -> processor (its ``placeholder`` and
            ``wrap`` tokens, :func:`media_tokens`).
        decoder_modalities: decoder modalities, or a mapping modality -> processor (its ``start``
            and ``placeholder`` tokens, :func:`decoder_tokens`).

    Returns:
        ``{"encoder": {modality: placeholder id}, "decoder": {modality: id of <|m_out|>},
        "decoder_start": {modality: id of <|m_start|>}}`` (a decoder processor's own tokens in
        place of ``<|m_out|>`` and ``<|m_start|>`` where it names them). The wrap tokens are
        checked here but not listed (:class:`ChatProcessor` writes them; the model never looks
        for them).

    Raises:
        ValueError: the tokenizer lacks one of these tokens (build it with
            :func:`omnicore.model.build.prepare_tokenizer`, which adds what is missing); two
            modalities share a placeholder token, or a decoder's start token is a placeholder.
    """
    table = _encoder_table(encoders)
    media = {m: media_tokens(m, p) for m, p in table.items()}
    decoders = {m: decoder_tokens(m, p) for m, p in _encoder_table(decoder_modalities).items()}
    needed = [t for m in media for t in [media[m][0], *(media[m][1] or ())]]
    needed += [t for m in decoders for t in decoders[m]]
    missing = [t for t in needed if _token_id(tokenizer, t) is None]
    if missing:
        raise ValueError(f"tokenizer lacks the special tokens {missing}; build it with omnicore.model.build.prepare_tokenizer")
    ids = functools.partial(_token_id, tokenizer)
    out: dict[str, dict[str, int]] = {
        "encoder": {m: ids(media[m][0]) for m in table},
        "decoder": {m: ids(decoders[m][1]) for m in decoders},
        "decoder_start": {m: ids(decoders[m][0]) for m in decoders},
    }
    shared = [m for m in table if list(out["encoder"].values()).count(out["encoder"][m]) > 1]
    if shared:
        raise ValueError(
            f"encoder modalities {shared} use one placeholder token; each modality needs its own (its processor's placeholder)"
        )
    placeholders = [*out["encoder"].values(), *out["decoder"].values()]
    clash = [m for m in decoders if placeholders.count(out["decoder"][m]) > 1 or out["decoder_start"][m] in placeholders]
    if clash:
        raise ValueError(
            f"decoder modalities {clash} share a placeholder token with another modality, or open their items with one; "
            "each modality needs its own placeholder, and a start token that is no placeholder"
        )
    return out


LOADERS = {"image": load_image, "audio": load_audio, "video": load_video}


def module_processors(modules: Any, kind: str) -> dict[str, Any]:
    """``modality -> processor`` of built encoder or decoder modules: each module's ``processor``
    attribute (:class:`omnicore.components.Encoder` and ``Decoder`` hold their data side there).

    Raises:
        TypeError: a module has no ``processor`` attribute (named, with what to add).
    """
    out = {}
    for modality, module in modules.items():
        proc = getattr(module, "processor", None)
        if proc is None:
            raise TypeError(
                f"{kind} {modality!r} ({type(module).__name__}) has no processor attribute: an omnicore {kind} module holds its "
                "data side (what its ComponentSpec.processor builds) as .processor"
            )
        out[modality] = proc
    return out


def encoder_processors(model: Any) -> dict[str, Any]:
    """``modality -> processor`` of a built model's encoders, the shared modalities
    (``model.encoders.<m>.share``) included: ``model.encoder_processors()`` of an
    :class:`~omnicore.model.omni.OmniModel`, else :func:`module_processors` of ``model.encoders``.

    Raises:
        TypeError: an encoder module has no ``processor`` attribute.
    """
    own = getattr(model, "encoder_processors", None)
    return own() if callable(own) else module_processors(model.encoders, "encoder")


SPECIAL_TOKEN_POLICIES = ("escape", "refuse")
"""``data.special_tokens_in_text``: what a special token string written in message text becomes.
``escape``: plain text tokens (``<|im_end|>`` in a user message is the characters ``<``, ``|``, ...,
never the control token, so data cannot forge a turn); ``refuse``: a :class:`SampleError` naming
``FILE:LINE`` and the token. Placeholder strings (``<|image_pad|>``) are refused under both."""


def control_tokens(tokenizer: Any) -> dict[str, int]:
    """Every special token string of ``tokenizer`` with its id: its named special tokens (bos, eos,
    pad, ``additional_special_tokens``) and every added token marked ``special``."""
    out: dict[str, int] = {}
    for tok in getattr(tokenizer, "all_special_tokens", []):
        out[str(tok)] = tokenizer.convert_tokens_to_ids(tok)
    for i, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            out[str(added.content)] = int(i)
    return out


@dataclass
class Encoded:
    """One sample as token ids.

    ``input_ids`` and ``labels`` have the same length ``T``; ``media`` lists ``(side, modality,
    features)`` in order of appearance (``side`` is ``"encoder"`` or ``"decoder"``).
    ``n_targets`` counts text targets plus decoder code targets.
    """

    input_ids: list[int]
    labels: list[int]
    media: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    n_targets: int = 0
    where: str = ""
    rope_position_ids: list[list[int]] | None = None
    """``[3][T]`` multi-dimensional rotary positions (:mod:`omnicore.data.positions`) when the
    processor was built for an mRoPE foundation (``rope``), else None."""
    seed: int | None = None
    """A training sample's random stream (:func:`omnicore.data.seeds.sample_seed`, set by the data
    pipeline); its media items' seeds come from it. None elsewhere (held-out, prompts)."""

    def __len__(self) -> int:
        return len(self.input_ids)


CHAT_TEMPLATE_CHOICES = ("auto", "chatml")
"""``data.chat_template``: ``auto`` = the foundation tokenizer's chat template when it has one, else
ChatML; ``chatml`` = always omnicore's ChatML."""

PROBE_CHARS_PER_TOKEN = 8
"""A sample whose text has more characters than this many per token of ``data.max_tokens`` is counted
in pieces before it is tokenized (:meth:`ChatProcessor._check_text_budget`); English text has about
4 characters per token, so samples within the budget are rarely counted twice."""

PROBE_CHARS = 2**16
"""Characters of text tokenized at once when a long text is counted in pieces (about 13 MiB of
memory with a fast tokenizer)."""


class ChatProcessor:
    """Turns :class:`~omnicore.data.jsonl.Sample` objects into :class:`Encoded` ones.

    Args:
        tokenizer: a ``PreTrainedTokenizerFast`` that already holds :func:`special_tokens`.
        encoders: modality -> the encoder's :class:`omnicore.components.Processor`
            (:func:`omnicore.model.build.build_processors`; no weights needed).
        decoders: modality -> the decoder's :class:`omnicore.components.Processor`.
        system_prompt: a system message prepended to samples that have none.
        special_tokens_in_text: ``data.special_tokens_in_text``, one of :data:`SPECIAL_TOKEN_POLICIES`.
        max_tokens: ``data.max_tokens``: a longer sample is a :class:`SampleError` naming ``FILE:LINE``,
            its length and the budget (so ``data.on_error: skip`` counts it); None: no limit here.
        chat_template: ``data.chat_template``: ``auto`` renders with the tokenizer's own chat template
            when it has one (:mod:`omnicore.data.chat_template`), else ChatML; ``chatml``: always ChatML.
        rope: the foundation's :class:`~omnicore.data.positions.RopeLayout` (``OmniModel.rope``) when
            its rotary positions are multi-dimensional: each sample then carries its own 3-D
            positions (``Encoded.rope_position_ids``), media laid out by their processors' ``grid``;
            None (every 1-D foundation): nothing is computed.

    Attributes:
        template: the measured :class:`~omnicore.data.chat_template.TemplateInfo` when samples are
            rendered with the tokenizer's template, else None (ChatML).
        end_of_turn_id: the token that closes an assistant turn (the template's, or ``<|im_end|>``):
            where generation stops.

    Raises:
        ValueError: an unknown policy or template choice, or a tokenizer without the placeholder tokens.
        ConfigError: (``data.chat_template: auto: ...``) the tokenizer's chat template is one omnicore
            cannot follow (see :func:`~omnicore.data.chat_template.inspect_template`); the message
            says to set ``data.chat_template: chatml``.
    """

    def __init__(
        self,
        tokenizer: Any,
        encoders: dict[str, Any],
        decoders: dict[str, Any],
        system_prompt: str | None = None,
        *,
        special_tokens_in_text: str = "escape",
        max_tokens: int | None = None,
        chat_template: str = "auto",
        rope: Any = None,
    ):
        if special_tokens_in_text not in SPECIAL_TOKEN_POLICIES:
            raise ValueError(f"special_tokens_in_text={special_tokens_in_text!r}; choose one of {', '.join(SPECIAL_TOKEN_POLICIES)}")
        if chat_template not in CHAT_TEMPLATE_CHOICES:
            raise ValueError(f"chat_template={chat_template!r}; choose one of {', '.join(CHAT_TEMPLATE_CHOICES)}")
        self.tokenizer = tokenizer
        self.encoders = encoders
        self.decoders = decoders
        self.system_prompt = system_prompt
        self.special_tokens_in_text = special_tokens_in_text
        self.max_tokens = max_tokens
        self.rope = rope
        self.token_ids = placeholder_ids(tokenizer, encoders, decoders)
        self.im_start, self.im_end = _token_id(tokenizer, IM_START), _token_id(tokenizer, IM_END)
        self.enc_ids, self.dec_ids, self.dec_start_ids = (self.token_ids[k] for k in ("encoder", "decoder", "decoder_start"))
        self.wrap_ids: dict[str, tuple[list[int], list[int]]] = {}
        """Per encoder modality with a ``wrap`` (:func:`media_tokens`): the ids written before and after its run."""
        for m, proc in encoders.items():
            wrap = media_tokens(m, proc)[1]
            if wrap:
                self.wrap_ids[m] = ([tokenizer.convert_tokens_to_ids(wrap[0])], [tokenizer.convert_tokens_to_ids(wrap[1])])
        self.reserved = {i for table in self.token_ids.values() for i in table.values()}
        self.reserved_strings = [t for t in special_tokens(encoders, decoders) if tokenizer.convert_tokens_to_ids(t) in self.reserved]
        self.control = control_tokens(tokenizer)
        self.control_ids = set(self.control.values()) | self.reserved
        self._escape_re = re.compile(
            "|".join([*(re.escape(t) for t in sorted(self.control, key=len, reverse=True) if t), "[\ue000-\ue003]"])
        )
        """Special token strings (longest first) and the private-use characters that mark contents:
        what :meth:`_contents` takes out of message text before the template sees it."""
        self.template: TemplateInfo | None = None
        self._pieces: dict[tuple[tuple[str, ...], bool], tuple[list[str], list[int]] | None] = {}
        """:func:`render_pieces` per (roles, generation prompt), or None where it raised: the
        pieces depend on the roles alone, so each role sequence is rendered once, not per sample."""
        if chat_template == "auto" and has_template(tokenizer):
            try:
                self.template = inspect_template(tokenizer)
            except ValueError as exc:
                from omnicore.config import ConfigError

                raise ConfigError(f"data.chat_template: auto: {exc}") from exc
        if self.template is None and (self.im_start is None or self.im_end is None):
            raise ValueError(
                f"the tokenizer lacks {IM_START} / {IM_END}, which omnicore's ChatML needs; build it with "
                "omnicore.model.build.prepare_tokenizer(..., chat_template='chatml'), or use its own chat template (data.chat_template: auto)"
            )
        self.end_of_turn_id = self.im_end if self.template is None else tokenizer.convert_tokens_to_ids(self.template.end_of_turn)
        self._pieces: dict[str, list[int]] = {}  # template text -> ids (pieces repeat across samples)

    @classmethod
    def for_model(cls, tokenizer: Any, model: Any, data: Any, *, budget: bool = False) -> ChatProcessor:
        """The processor a run uses: the processors of ``model``'s encoders and decoders (see
        :func:`module_processors`) and the config's ``data`` section (system prompt, special-token
        policy; with ``budget``, its ``max_tokens`` too, so that an over-long training sample is a
        sample error)."""
        return cls(
            tokenizer,
            encoder_processors(model),
            module_processors(model.decoders, "decoder"),
            data.system_prompt,
            special_tokens_in_text=data.special_tokens_in_text,
            max_tokens=data.max_tokens if budget else None,
            chat_template=data.chat_template,
            rope=getattr(model, "rope", None),
        )

    def _text(self, text: str, where: str) -> list[int]:
        """Token ids of user-written text, in which no special token string is ever a control token."""
        self._check_text(text, where)
        # split_special_tokens: special token strings are tokenized as the plain text they are
        ids = self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        if self.control_ids.intersection(ids):
            raise SampleError(f"{where}: this tokenizer turns text into control tokens even with split_special_tokens; cannot escape them")
        return ids

    def _check_text(self, text: str, where: str) -> None:
        """Refuse user-written text with a placeholder string, or (policy ``refuse``) a special token string."""
        for s in self.reserved_strings:
            if s in text:
                raise SampleError(f"{where}: text contains a reserved placeholder token {s}; placeholders come only from media parts")
        if self.special_tokens_in_text == "refuse":
            for s in self.control:
                if s in text:
                    raise SampleError(
                        f"{where}: text contains the special token {s} (data.special_tokens_in_text: refuse); remove it, or set "
                        "data.special_tokens_in_text: escape to train on it as plain text"
                    )

    def _media(self, kind: str, path: str | bytes, side: str, where: str) -> tuple[dict[str, Any], Any]:
        table = self.encoders if side == "encoder" else self.decoders
        comp = table.get(kind)
        if comp is None:
            have = ", ".join(sorted(table)) or "none"
            raise SampleError(f"{where}: a {kind} part on the {side} side needs a {kind} {side} in model.{side}s (configured: {have})")
        try:
            # a video processor with audio_track: true reads the clip's sound track too (Video.audio)
            media = load_video(path, audio=True) if kind == "video" and getattr(comp, "audio_track", False) else LOADERS[kind](path)
        except MediaError as exc:
            raise SampleError(f"{where}: {exc}") from exc
        try:
            features = comp.preprocess(media)
        except Exception as exc:
            raise SampleError(f"{where}: cannot preprocess {kind} {describe_media(path, None)}: {type(exc).__name__}: {exc}") from exc
        if (key := nonfinite_feature(features)) is not None:  # a bad sample, not a NaN training step
            raise SampleError(f"{where}: the {kind} {side}'s processor gave feature {key!r} of {describe_media(path, None)} a NaN or inf")
        return features, comp

    def _check_length(self, n: int, where: str) -> None:
        if self.max_tokens is not None and n > self.max_tokens:
            raise SampleError(
                f"{where}: sample has {n} tokens, more than data.max_tokens={self.max_tokens}; raise data.max_tokens or "
                "shorten the sample (data.on_error: skip drops it)"
            )

    def _check_text_budget(self, messages: list[Any], where: str) -> None:
        """Refuse, before any text is tokenized whole, a sample whose text alone has more than
        ``max_tokens`` tokens, when its text is long enough to be worth checking (over
        :data:`PROBE_CHARS_PER_TOKEN` characters per token of the budget): its text parts are counted
        in pieces of :data:`PROBE_CHARS` characters (cut at a space where one is near), stopping at the
        first piece that takes the count over the budget. Tokenizing costs about 200 bytes of memory per
        byte of text, so a 10 MiB text tokenized whole needs gigabytes only to be refused; counted in
        pieces it needs one piece's worth. Each cut may change the count by a token or two, so the
        budget is exceeded by two tokens per cut before a sample is refused here (the exact count is
        checked after tokenizing, :meth:`_check_length`)."""
        if self.max_tokens is None:
            return
        texts = [p.value for m in messages for p in m.parts if p.type == "text" and isinstance(p.value, str)]
        total = sum(len(t) for t in texts)
        if total <= PROBE_CHARS_PER_TOKEN * self.max_tokens:
            return
        n = seen = cuts = 0
        for text in texts:
            pos = 0
            while pos < len(text):
                end = min(len(text), pos + PROBE_CHARS)
                if end < len(text):
                    space = text.rfind(" ", pos + PROBE_CHARS // 2, end)
                    end = space if space > pos else end
                n += len(self.tokenizer.encode(text[pos:end], add_special_tokens=False, split_special_tokens=True))
                seen, cuts, pos = seen + end - pos, cuts + 1, end
                if n > self.max_tokens + 2 * cuts:
                    raise SampleError(
                        f"{where}: sample has more than data.max_tokens={self.max_tokens} tokens: {n} in the first {seen} of its "
                        f"{total} characters of text (counted in pieces, never tokenized whole); raise data.max_tokens or shorten "
                        "the sample (data.on_error: skip drops it)"
                    )

    def encode(self, sample: Sample, *, prompt_only: bool = False) -> Encoded:
        """Token ids, pre-shifted labels and media features for one sample.

        With ``prompt_only`` the last assistant message is dropped and the assistant header is
        appended, ready for generation (with a chat template: ``add_generation_prompt=True``).

        Raises:
            SampleError: (``FILE:LINE: ...``) for missing or unreadable media, a media type without
                a configured encoder/decoder, placeholder tokens written as text, special tokens in
                text under ``special_tokens_in_text="refuse"``, more than ``max_tokens`` tokens, or a
                conversation the tokenizer's chat template refuses to render.
        """
        where = sample.where
        messages = list(sample.messages)
        self._check_text_budget(messages, where)  # a huge text: refused before it is tokenized (or its media decoded)
        if prompt_only:
            if messages and messages[-1].role == "assistant":
                messages = messages[:-1]
        if self.system_prompt and (not messages or messages[0].role != "system"):
            from omnicore.data.jsonl import Message, Part

            messages = [Message("system", [Part("text", self.system_prompt)])] + messages
        out = _Tokens()
        if self.template is None:
            self._chatml(messages, out, where, prompt_only)
        else:
            self._templated(messages, out, where, prompt_only)
        ids, trained = out.ids, out.trained
        self._check_length(len(ids), where)
        labels = [ids[i + 1] if trained[i + 1] else IGNORE_INDEX for i in range(len(ids) - 1)] + [IGNORE_INDEX]
        n_text = sum(1 for x in labels if x != IGNORE_INDEX)
        rope = None if self.rope is None else mrope_positions(len(ids), out.blocks, self.rope)
        return Encoded(ids, labels, out.media, n_text + out.n_dec, where, rope)

    def _chatml(self, messages: list[Any], out: _Tokens, where: str, prompt_only: bool) -> None:
        """omnicore's ChatML (the module docstring's template)."""
        for msg in messages:
            assistant = msg.role == "assistant"
            out.add([self.im_start] + self._text(f"{msg.role}\n", where), False)
            self._parts(msg.parts, assistant, out, where)
            out.add([self.im_end], assistant)
            out.add(self._text("\n", where), False)
        if prompt_only:
            out.add([self.im_start] + self._text("assistant\n", where), False)

    def _templated(self, messages: list[Any], out: _Tokens, where: str, prompt_only: bool) -> None:
        """The tokenizer's chat template (see :mod:`omnicore.data.chat_template`): the template's
        pieces between the messages, each message's parts in its sentinel's place; an assistant
        message and the next piece's tokens up to its first special token (the end of turn) are
        targets. Where the template's text of this conversation is not its pieces with the contents
        put back (it rewrites content: ``TemplateInfo.rewrites``, or this sample only), the text as
        the template renders it (:meth:`_rendered`)."""
        roles = [m.role for m in messages]
        contents, inserts = self._contents(messages, where)
        try:
            text = render(self.tokenizer, roles, contents, generation_prompt=prompt_only)
        except Exception as exc:
            raise SampleError(
                f"{where}: the tokenizer's chat template cannot render this conversation: {type(exc).__name__}: {exc}"
            ) from exc
        got = None
        if self.template.rewrites is None:
            key = (tuple(roles), prompt_only)
            if key not in self._pieces:
                try:
                    self._pieces[key] = render_pieces(self.tokenizer, roles, generation_prompt=prompt_only)
                except Exception:  # contents out of order or twice: rendered whole below
                    self._pieces[key] = None
            got = self._pieces[key]
        pieces, order = got if got is not None else (None, [])
        if pieces is None or text != join_pieces(pieces, order, contents, self.template.lstrip, self.template.rstrip):
            self._rendered(messages, contents, inserts, text, out, where)
            return
        out.add(self._piece(pieces[0]), False)
        for k, piece in zip(order, pieces[1:], strict=True):
            assistant = messages[k].role == "assistant"
            self._parts(trim_parts(messages[k].parts, self.template.lstrip, self.template.rstrip), assistant, out, where)
            toks = self._piece(piece)
            closing = next((j + 1 for j, t in enumerate(toks) if t in self.control_ids), 0) if assistant else 0
            out.add(toks[:closing], True)
            out.add(toks[closing:], False)

    def _contents(self, messages: list[Any], where: str) -> tuple[list[str], list[tuple[int, Any]]]:
        """Each message's content as one string for the template: its text, with every media part and
        every special token string written in text (and any of the private-use characters that mark
        these) replaced by a marker ``\\ue002{i}\\ue003``, ``i`` indexing the returned inserts
        ``(message index, Part or escaped string)``. So the template sees the text it would see from
        a user, and no text of the sample can become a control token or a marker.

        Raises:
            SampleError: text holds a placeholder string, or a special token string under ``refuse``.
        """
        contents, inserts = [], []
        for k, msg in enumerate(messages):
            buf = []
            for part in msg.parts:
                if part.type != "text":
                    inserts.append((k, part))
                    buf.append(f"{_MARK_OPEN}{len(inserts) - 1}{_MARK_CLOSE}")
                    continue
                self._check_text(part.value, where)
                pos = 0
                for m in self._escape_re.finditer(part.value):
                    inserts.append((k, m.group()))
                    buf += [part.value[pos : m.start()], f"{_MARK_OPEN}{len(inserts) - 1}{_MARK_CLOSE}"]
                    pos = m.end()
                buf.append(part.value[pos:])
            contents.append("".join(buf))
        return contents, inserts

    def _rendered(
        self, messages: list[Any], contents: list[str], inserts: list[tuple[int, Any]], text: str, out: _Tokens, where: str
    ) -> None:
        """A sample as the template renders it (``text``, from :meth:`_contents`' contents): its
        template text and message text tokenized together with the special tokens parsed, as
        ``apply_chat_template(..., tokenize=True)`` does; each marker replaced by its media part
        (placeholders) or its escaped text. The labels are each assistant turn as rendered, its
        end-of-turn token included (:func:`~omnicore.data.chat_template.assistant_spans`). A media
        part the template drops (inside reasoning it removes) is not loaded.

        Raises:
            SampleError: the assistant turns cannot be found in the text, or the template writes a
                media part or escaped text twice.
        """
        roles = [m.role for m in messages]
        try:
            spans = assistant_spans(self.tokenizer, roles, contents, text, end_of_turn=self.template.end_of_turn, specials=self.control)
        except Exception as exc:
            raise SampleError(f"{where}: {exc}; set data.chat_template: chatml") from exc
        bounds = [(a, b) for _, a, b in spans]
        pos, used = 0, set()
        for m in [*_MARK_RE.finditer(text), None]:
            cut = len(text) if m is None else m.start()
            self._chunk(text[pos:cut], pos, bounds, out)
            if m is None:
                break
            pos, i = m.end(), int(m.group(1))
            if i >= len(inserts) or i in used:
                raise SampleError(f"{where}: the chat template writes a media part or escaped text of this sample twice")
            used.add(i)
            k, item = inserts[i]
            if isinstance(item, str):
                out.add(self._text(item, where), _inside(m.start(), bounds))
            else:
                self._parts([item], roles[k] == "assistant", out, where)

    def _chunk(self, chunk: str, base: int, bounds: list[tuple[int, int]], out: _Tokens) -> None:
        """Template-rendered text starting at ``base`` in the sample's text, tokenized whole with its
        special tokens parsed; a token is a target when it starts inside one of ``bounds``. A slow
        tokenizer (no offsets) tokenizes the parts between the bounds apart."""
        if not chunk:
            return
        if getattr(self.tokenizer, "is_fast", False):
            enc = self.tokenizer(chunk, add_special_tokens=False, return_offsets_mapping=True)
            for i, (a, _) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
                out.add([i], _inside(base + a, bounds))
            return
        cuts = sorted({0, len(chunk), *(x - base for b in bounds for x in b if 0 < x - base < len(chunk))})
        for a, b in zip(cuts, cuts[1:]):
            out.add(self.tokenizer.encode(chunk[a:b], add_special_tokens=False), _inside(base + a, bounds))

    def _piece(self, text: str) -> list[int]:
        """Token ids of template text: its special token strings are the control tokens."""
        ids = self._pieces.get(text)
        if ids is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(self._pieces) < 4096:
                self._pieces[text] = ids
        return ids

    @staticmethod
    def _grid(proc: Any, features: dict[str, Any], n: int, kind: str, where: str) -> tuple[int, int, int]:
        """``proc.grid(features)`` as three ints whose product is ``n`` (its ``num_tokens``)."""
        grid = tuple(int(x) for x in proc.grid(features))
        if len(grid) != 3 or grid[0] * grid[1] * grid[2] != n or min(grid) < 1:
            raise SampleError(f"{where}: the {kind} processor's grid {grid} does not lay out its {n} tokens as (t, h, w) with t*h*w == {n}")
        return grid  # type: ignore[return-value]

    def _parts(self, parts: list[Any], assistant: bool, out: _Tokens, where: str) -> None:
        """One message's parts: text (a target in assistant messages), encoder placeholder runs, or
        (assistant) a decoder's start token plus its code placeholders."""
        for part in parts:
            if part.type == "text":
                out.add(self._text(part.value, where), assistant)
            elif assistant:
                features, dec = self._media(part.type, part.value, "decoder", where)
                n = int(dec.num_tokens(features))
                out.add([self.dec_start_ids[part.type]], True)
                out.add([self.dec_ids[part.type]] * n, False)  # scored by the decoder head, not in labels
                out.media.append(("decoder", part.type, features))
                out.n_dec += n * int(getattr(dec, "codes_per_token", 1))  # K codes a frame with a depth decoder
            else:
                features, enc = self._media(part.type, part.value, "encoder", where)
                if callable(getattr(enc, "layout", None)):
                    try:
                        layout = enc.layout(features)
                    except Exception as exc:
                        raise SampleError(
                            f"{where}: the {part.type} processor cannot lay out its item: {type(exc).__name__}: {exc}"
                        ) from exc
                    self._layout(part.type, layout, out, where)
                    continue
                n = int(enc.num_tokens(features))
                before, after = self.wrap_ids.get(part.type, ([], []))
                gridded = self.rope is not None and callable(getattr(enc, "grid", None))
                interval = getattr(enc, "time_interval", None) if gridded else None
                for text, count, grid in self._runs(enc, features, n, part.type, where, gridded):
                    out.add(self._piece(text) if text else [], False)
                    out.add(before, False)
                    if grid is not None:
                        block: tuple[Any, ...] = (len(out.ids), grid)
                        out.blocks.append(block + (float(interval(features)),) if callable(interval) else block)
                    out.add([self.enc_ids[part.type]] * count, False)
                    out.add(after, False)
                out.media.append(("encoder", part.type, features))

    def _layout(self, kind: str, layout: Any, out: _Tokens, where: str) -> None:
        """Write one item as its processor laid it out (:class:`ItemLayout`): its tokens, its items
        in the sample's media, and its positions as one fixed mRoPE block.

        Raises:
            SampleError: a token string that is not one token, a placeholder modality without an
                encoder, placeholder counts that differ from the items' ``num_tokens``, or positions
                of another length than the tokens.
        """
        if not isinstance(layout, ItemLayout):
            raise SampleError(f"{where}: the {kind} processor's layout() returned {type(layout).__name__}, not an omnicore.api.ItemLayout")
        start, counts = len(out.ids), dict.fromkeys(self.enc_ids, 0)
        for token in layout.tokens:
            if isinstance(token, str):
                i = _token_id(self.tokenizer, token)
                if i is None:
                    raise SampleError(f"{where}: the {kind} processor's layout writes {token!r}, which is not one token of the tokenizer")
                out.add([i], False)
                continue
            m, count = token
            if m not in self.enc_ids:
                have = ", ".join(sorted(self.enc_ids)) or "none"
                raise SampleError(
                    f"{where}: a {kind} item holds {m} placeholders, which need a {m} encoder in model.encoders (configured: {have})"
                )
            out.add([self.enc_ids[m]] * int(count), False)
            counts[m] += int(count)
        for m, placed in counts.items():
            have = sum(int(self.encoders[m].num_tokens(f)) for k, f in layout.items if k == m)
            if have != placed:
                raise SampleError(f"{where}: the {kind} processor's layout writes {placed} {m} placeholders for items of {have} tokens")
        out.media.extend(("encoder", m, f) for m, f in layout.items)
        if self.rope is not None:
            n = len(out.ids) - start
            rows = layout.positions if layout.positions is not None else (tuple(range(n)),) * 3
            if len(rows) != 3 or any(len(r) != n for r in rows):
                raise SampleError(
                    f"{where}: the {kind} processor's layout gives positions {[len(r) for r in rows]} for {n} tokens; give [3][{n}]"
                )
            advance = layout.advance if layout.advance is not None else max(max(r, default=-1) for r in rows) + 1
            out.blocks.append((start, FixedRows(tuple(tuple(int(x) for x in r) for r in rows), int(advance))))  # type: ignore[arg-type]

    def _runs(
        self, proc: Any, features: dict[str, Any], n: int, kind: str, where: str, gridded: bool
    ) -> list[tuple[str, int, tuple[int, int, int] | None]]:
        """The runs one encoder item is written as: ``(text before, placeholders, grid or None)``
        each: the processor's optional ``runs(features)`` (text between runs, one grid each), else
        one run of ``n`` placeholders with its ``grid`` (``gridded``: an mRoPE foundation and a
        processor with ``grid``)."""
        runs = getattr(proc, "runs", None)
        if not callable(runs):
            return [("", n, self._grid(proc, features, n, kind, where) if gridded else None)]
        out = []
        for text, grid in runs(features):
            t, h, w = (int(x) for x in grid)
            if min(t, h, w) < 1:
                raise SampleError(f"{where}: the {kind} processor's runs give a grid {(t, h, w)} with an empty side")
            out.append((str(text), t * h * w, (t, h, w) if gridded else None))
        if sum(c for _, c, _ in out) != n:
            raise SampleError(f"{where}: the {kind} processor's runs hold {sum(c for _, c, _ in out)} tokens, not its num_tokens {n}")
        return out


_MARK_OPEN, _MARK_CLOSE = "\ue002", "\ue003"
_MARK_RE = re.compile(f"{_MARK_OPEN}(\\d+){_MARK_CLOSE}")


def _inside(pos: int, bounds: list[tuple[int, int]]) -> bool:
    """Whether character ``pos`` lies in one of the ``[start, end)`` bounds."""
    return any(a <= pos < b for a, b in bounds)


@dataclass
class _Tokens:
    """The sample being built: ids, whether each is a text target, media in order, decoder codes."""

    ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    media: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    n_dec: int = 0
    blocks: list[tuple[Any, ...]] = field(default_factory=list)  # (start, (t, h, w)[, time interval]) of gridded media

    def add(self, tokens: list[int], train: bool) -> None:
        self.ids.extend(tokens)
        self.trained.extend([train] * len(tokens))


def trim_parts(parts: list[Any], left: bool, right: bool) -> list[Any]:
    """``parts`` with the whitespace at the start (``left``) and end (``right``) of the message's
    text stripped as Jinja's ``trim`` (``str.strip``) strips the rendered content; a text part left
    empty is dropped. Media parts stop the stripping (their placeholders are not whitespace)."""
    from omnicore.data.jsonl import Part

    parts = list(parts)
    for side, on in ((0, left), (-1, right)):
        while on and parts and parts[side].type == "text":
            value = parts[side].value.lstrip() if side == 0 else parts[side].value.rstrip()
            if value:
                parts[side] = Part("text", value)
                break
            parts.pop(side)
    return parts
