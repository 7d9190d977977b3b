"""Rendering samples with the foundation tokenizer's own Jinja chat template.

The idea (sentinel rendering, in the spirit of TRL's and axolotl's masking by rendering twice and
diffing): the template is rendered once per sample with every message's ``content`` replaced by a
sentinel string ``\\ue000{k}\\ue001`` (``k`` the message's index; private-use code points that no
template touches). Splitting the rendered text at the sentinels gives the template's own text
("pieces": BOS, role headers, end-of-turn tokens, a default system prompt, the generation prompt)
between the messages. Pieces are tokenized with the tokenizer's special tokens parsed (they are the
template's control tokens); each message's parts are put between them by
:class:`omnicore.data.chat.ChatProcessor`: text through its escaping tokenizer (a user writing
``<|eot_id|>`` gets plain characters), media as placeholder runs. So no user text and no template
text are ever tokenized together, and labels need no ``{% generation %}`` markers (which Llama-3 and
Qwen templates lack, so ``return_assistant_tokens_mask`` does not work for them): an assistant
message's tokens are labels, and so are the next piece's tokens up to and including its first
special token (the end-of-turn token: ``<|eot_id|>`` for Llama 3, ``<|im_end|>`` for Qwen).

That holds only for a template that writes each message's content as given. One property is
measured once (:func:`inspect_template`): whether it strips the whitespace around ``content``
(Llama 3 renders ``message['content'] | trim``), so that the message text is stripped the same way.
Some templates change content otherwise: Qwen3's drops ``<think>...</think>`` from assistant turns
before the last user message and re-wraps the last turn's reasoning; DeepSeek-R1's drops it from
every assistant turn. The probe renders conversations whose contents hold such markers and odd
whitespace; a template whose text differs from its pieces with the contents put back
(:func:`join_pieces`) is marked (``TemplateInfo.rewrites``), and its samples are rendered whole
with the real contents (:func:`render`): the text is then ``apply_chat_template``'s, and the labels
are each assistant turn as rendered (:func:`assistant_spans`). A sample of any template whose text
differs so is rendered whole too (the processor checks every sample), so a change the probe did not
foresee is followed as well.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_OPEN, _CLOSE = "\ue000", "\ue001"
_SENTINEL_RE = re.compile(f"{_OPEN}(\\d+){_CLOSE}")

REASONING_MARKERS = (
    ("<think>", "</think>"),
    ("<thinking>", "</thinking>"),
    ("<reasoning>", "</reasoning>"),
    ("[THINK]", "[/THINK]"),
    ("\u25c1think\u25b7", "\u25c1/think\u25b7"),
    ("<seed:think>", "</seed:think>"),
)
"""Pairs that reasoning models' templates look for in assistant content (Qwen3 and DeepSeek-R1,
Claude-style, Magistral, Kimi, Seed-OSS): the probe writes each into a multi-turn conversation."""
_WHITESPACE = "\n \t\r\n"
"""Put around probe contents: a template that strips some of it (``lstrip('\\n')``) but not all (``trim``) rewrites content."""


def sentinel(k: int) -> str:
    """The string that stands for message ``k``'s content while the template renders."""
    return f"{_OPEN}{k}{_CLOSE}"


def has_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template (``tokenizer.chat_template`` set)."""
    return bool(getattr(tokenizer, "chat_template", None))


def render(tokenizer: Any, roles: list[str], contents: list[str], *, generation_prompt: bool) -> str:
    """``apply_chat_template`` of messages with these roles and string contents, as text.

    Raises:
        Exception: whatever the template raises (``raise_exception`` in a Jinja template).
    """
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def render_pieces(tokenizer: Any, roles: list[str], *, generation_prompt: bool) -> tuple[list[str], list[int]]:
    """Render a conversation of these roles with sentinel contents.

    Returns:
        ``(pieces, order)``: ``len(pieces) == len(order) + 1``; the rendered text is
        ``pieces[0] + content[order[0]] + pieces[1] + ... + pieces[-1]``. ``order`` is increasing; a
        message whose content the template does not render is absent from it.

    Raises:
        ValueError: the template renders a message's content twice or out of order.
        Exception: whatever the template raises (``raise_exception`` in a Jinja template, e.g. for
            roles that do not alternate); callers turn it into a sample error.
    """
    text = render(tokenizer, roles, [sentinel(k) for k in range(len(roles))], generation_prompt=generation_prompt)
    split = _SENTINEL_RE.split(text)
    pieces, order = split[0::2], [int(k) for k in split[1::2]]
    if order != sorted(set(order)):
        raise ValueError(
            f"the chat template renders message contents out of order or twice (order {order}); set data.chat_template: chatml"
        )
    return pieces, order


def join_pieces(pieces: list[str], order: list[int], contents: list[str], lstrip: bool, rstrip: bool) -> str:
    """The text :func:`render_pieces`' pieces give with these contents put back (stripped as the
    template strips them): equal to :func:`render` of the contents for a template that writes
    content as given."""
    out = [pieces[0]]
    for k, piece in zip(order, pieces[1:], strict=True):
        c = contents[k]
        c = c.lstrip() if lstrip else c
        out += [c.rstrip() if rstrip else c, piece]
    return "".join(out)


def special_strings(tokenizer: Any) -> set[str]:
    """Every special token string of ``tokenizer``: its named special tokens and every added token
    marked ``special`` (its control tokens; a non-special added token such as Qwen3's ``<think>``
    is not one)."""
    specials = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    return specials | {str(a.content) for a in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(a, "special", False)}


def assistant_spans(
    tokenizer: Any, roles: list[str], contents: list[str], text: str, *, end_of_turn: str, specials: Iterable[str]
) -> list[tuple[int, int, int]]:
    """Where each assistant turn lies in ``text``, the template's rendering of these messages
    (:func:`render`, with or without the generation prompt): the characters the model writes when
    prompted with the conversation before that turn.

    A turn starts where ``text`` leaves the generation prompt of the messages before it
    (``apply_chat_template(messages[:k], add_generation_prompt=True)``): at its end when ``text``
    goes on from it (Qwen3: after ``<|im_start|>assistant\\n``, so a re-wrapped ``<think>`` block is
    in the turn), else where the two first differ, and not later than where ``text`` leaves the turn
    rendered with empty content (DeepSeek-R1 prompts with ``<｜Assistant｜><think>\\n`` but writes a
    turn without reasoning as ``<｜Assistant｜>`` and the answer). It ends after the first
    ``end_of_turn`` from there.

    Returns:
        ``(k, start, end)`` per assistant message ``k`` in order: ``text[start:end]`` is its turn,
        the end-of-turn token included.

    Raises:
        ValueError: naming the message: the conversation before the turn is rendered otherwise than
            in its generation prompt (the difference lies before the prompt's last special token),
            the turn holds no ``end_of_turn``, or turns overlap.
    """
    specials = [s for s in specials if s]
    spans: list[tuple[int, int, int]] = []
    done = 0
    for k, role in enumerate(roles):
        if role != "assistant":
            continue
        if k == 0:
            raise ValueError(
                "message 1 is an assistant turn with no prompt before it; start the conversation with a user (or system) message"
            )
        prompt = render(tokenizer, roles[:k], contents[:k], generation_prompt=True)
        if text.startswith(prompt):
            start = len(prompt)
        else:
            start = len(os.path.commonprefix([text, prompt]))
            try:
                empty = render(tokenizer, roles[: k + 1], [*contents[:k], ""], generation_prompt=False)
                start = min(start, len(os.path.commonprefix([text, empty])))
            except Exception:  # a template that refuses empty content: the prompt alone decides
                pass
            history = max((prompt.rfind(s) + len(s) for s in specials if s in prompt), default=0)
            if start < history:
                raise ValueError(
                    f"the chat template renders the conversation before message {k + 1} (assistant) otherwise than in its "
                    f"generation prompt ({text[start : start + 40]!r} against {prompt[start : start + 40]!r}), so the tokens to "
                    "train cannot be told apart"
                )
        end = text.find(end_of_turn, start)
        if end < 0:
            raise ValueError(f"the chat template writes message {k + 1} (assistant) with no {end_of_turn} after it")
        if start < done:
            raise ValueError(f"the chat template writes message {k + 1} (assistant) inside the turn before it")
        done = end + len(end_of_turn)
        spans.append((k, start, done))
    return spans


@dataclass(frozen=True)
class TemplateInfo:
    """What :func:`inspect_template` measured: ``lstrip``/``rstrip``: the template strips leading /
    trailing whitespace of each message's content; ``end_of_turn``: the special token that closes an
    assistant turn (the generation stop token); ``rewrites``: what the probe saw the template change
    in content besides that stripping (``"content holding <think>...</think>"``), or None when it
    writes content as given: samples of a template that rewrites are rendered whole
    (:func:`render`) and their assistant turns trained as rendered (:func:`assistant_spans`)."""

    lstrip: bool
    rstrip: bool
    end_of_turn: str
    rewrites: str | None = None


def _probes() -> list[tuple[str, list[str], list[str]]]:
    """``(what, roles, contents)`` of the conversations that show a template rewriting content:
    reasoning markers in two assistant turns (one before the last user message, one after), and
    whitespace around every message's content. Contents are words, so that a template changing
    letters shows it too (and a message that names a difference reads as text)."""
    out = []
    roles = ["user", "assistant", "user", "assistant"]
    for opening, closing in REASONING_MARKERS:
        contents = [
            "Question 1?",
            f"{opening}\nSome reasoning 1.\n{closing}\n\nAnswer 1.",
            "Question 2?",
            f"{opening}\nSome reasoning 2.\n{closing}\n\nAnswer 2.",
        ]
        out.append((f"content holding {opening}...{closing}", roles, contents))
    out.append(("whitespace around content", roles, [f"{_WHITESPACE}Text {k}.{_WHITESPACE}" for k in range(4)]))
    out.append(("a system message", ["system", *roles], [f"Text {k}." for k in range(5)]))
    return out


def _rewrites(tokenizer: Any, lstrip: bool, rstrip: bool) -> tuple[str, list[str], list[str]] | None:
    """The first probe conversation (:func:`_probes`) whose rendering, for training or as a
    generation prompt before its last turn, differs from its pieces with the contents put back; None
    when none does. A probe the template refuses to render (a system message, say) shows nothing."""
    for what, roles, contents in _probes():
        for n, prompt in ((len(roles), False), (len(roles) - 1, True)):
            try:
                text = render(tokenizer, roles[:n], contents[:n], generation_prompt=prompt)
            except Exception:
                continue
            try:
                pieces, order = render_pieces(tokenizer, roles[:n], generation_prompt=prompt)
            except Exception:
                return what, roles, contents
            if text != join_pieces(pieces, order, contents[:n], lstrip, rstrip):
                return what, roles, contents
    return None


def inspect_template(tokenizer: Any) -> TemplateInfo:
    """Probe the tokenizer's chat template: one user and one assistant message whose contents are a
    sentinel between tab characters (whitespace stripping, the end-of-turn token), then the
    conversations of :func:`_probes` (content the template rewrites). For a template that rewrites,
    the assistant turns of the probe that showed it must be found in its text
    (:func:`assistant_spans`).

    Raises:
        ValueError: naming what is unsupported: the template cannot render a user/assistant
            exchange, drops or mangles plain content, strips user and assistant content differently,
            closes the assistant turn with no special token, or rewrites content in a text whose
            assistant turns cannot be found (set ``data.chat_template: chatml`` for such tokenizers).
    """
    probe = [{"role": "user", "content": f"\t{sentinel(0)}\t"}, {"role": "assistant", "content": f"\t{sentinel(1)}\t"}]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False)
    except Exception as exc:
        raise ValueError(
            f"the tokenizer's chat template cannot render a user/assistant exchange: {exc}; set data.chat_template: chatml"
        ) from exc
    if any(sentinel(k) not in text for k in (0, 1)):
        raise ValueError("the tokenizer's chat template changes message content; set data.chat_template: chatml")
    lstrip = [f"\t{sentinel(k)}" not in text for k in (0, 1)]
    rstrip = [f"{sentinel(k)}\t" not in text for k in (0, 1)]
    if len(set(lstrip)) > 1 or len(set(rstrip)) > 1:
        raise ValueError("the tokenizer's chat template strips user and assistant content differently; set data.chat_template: chatml")
    after = text.split(sentinel(1), 1)[1].removeprefix("" if rstrip[0] else "\t")
    specials = special_strings(tokenizer)
    end = None
    for tok in tokenizer.convert_ids_to_tokens(tokenizer.encode(after, add_special_tokens=False)):
        if tok in specials:
            end = tok
            break
    if end is None:
        raise ValueError(
            f"the tokenizer's chat template closes an assistant turn with {after!r}, which holds no special token to stop "
            "generation at; set data.chat_template: chatml"
        )
    seen = _rewrites(tokenizer, lstrip[0], rstrip[0])
    if seen is None:
        return TemplateInfo(lstrip[0], rstrip[0], end)
    what, roles, contents = seen
    try:
        for n, prompt in ((len(roles), False), (len(roles) - 1, True)):
            rendered = render(tokenizer, roles[:n], contents[:n], generation_prompt=prompt)
            assistant_spans(tokenizer, roles[:n], contents[:n], rendered, end_of_turn=end, specials=specials)
    except ValueError as exc:
        raise ValueError(f"the tokenizer's chat template rewrites {what}, and {exc}; set data.chat_template: chatml") from exc
    return TemplateInfo(lstrip[0], rstrip[0], end, what)
