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

One property of the template is measured once (:func:`inspect_template`): whether it strips the
whitespace around ``content`` (Llama 3 renders ``message['content'] | trim``), so that the message
text is stripped the same way. A template that alters content in any other way is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_OPEN, _CLOSE = "\ue000", "\ue001"
_SENTINEL_RE = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


def sentinel(k: int) -> str:
    """The string that stands for message ``k``'s content while the template renders."""
    return f"{_OPEN}{k}{_CLOSE}"


def has_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template (``tokenizer.chat_template`` set)."""
    return bool(getattr(tokenizer, "chat_template", None))


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
    messages = [{"role": r, "content": sentinel(k)} for k, r in enumerate(roles)]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    split = _SENTINEL_RE.split(text)
    pieces, order = split[0::2], [int(k) for k in split[1::2]]
    if order != sorted(set(order)):
        raise ValueError(
            f"the chat template renders message contents out of order or twice (order {order}); set data.chat_template: chatml"
        )
    return pieces, order


@dataclass(frozen=True)
class TemplateInfo:
    """What :func:`inspect_template` measured: ``lstrip``/``rstrip``: the template strips leading /
    trailing whitespace of each message's content; ``end_of_turn``: the special token that closes an
    assistant turn (the generation stop token)."""

    lstrip: bool
    rstrip: bool
    end_of_turn: str


def inspect_template(tokenizer: Any) -> TemplateInfo:
    """Probe the tokenizer's chat template with one user and one assistant message whose contents
    are a sentinel between tab characters.

    Raises:
        ValueError: naming what is unsupported: the template cannot render a user/assistant
            exchange, changes content other than by stripping whitespace, or closes the assistant
            turn with no special token (set ``data.chat_template: chatml`` for such tokenizers).
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
    specials = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    specials |= {str(a.content) for a in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(a, "special", False)}
    ids = tokenizer.encode(after, add_special_tokens=False)
    for tok in tokenizer.convert_ids_to_tokens(ids):
        if tok in specials:
            return TemplateInfo(lstrip[0], rstrip[0], tok)
    raise ValueError(
        f"the tokenizer's chat template closes an assistant turn with {after!r}, which holds no special token to stop generation at; "
        "set data.chat_template: chatml"
    )
