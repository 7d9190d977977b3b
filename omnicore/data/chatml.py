"""omnicore's ChatML (:mod:`omnicore.data.chat`) written as a Jinja chat template, for exports.

A tokenizer without a chat template of its own (the byte tokenizer, one from ``omnicore
fit-tokenizer``), or any tokenizer under ``data.chat_template: chatml``, is trained on omnicore's
ChatML. Its export carries :func:`chatml_template` as ``chat_template``, so that transformers'
``apply_chat_template`` on the export renders the text the model was trained on::

    <|im_start|>system\\n{system prompt}<|im_end|>\\n      (data.system_prompt, when the messages have no system message)
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n                                (add_generation_prompt=True)

A message's ``content`` is a string or a list of parts (``{"type": "text", "text": ...}``, or a
media part such as ``{"type": "image", ...}``). A media part is written as one copy of its item's
tokens (on the input side the encoder's placeholder between its ``wrap``; in an assistant message
the decoder's start token and one placeholder), as Hugging Face templates do; omnicore writes
``num_tokens`` placeholders per item, which a processor expands to. A part type the model has no
encoder or decoder for is refused with ``raise_exception``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_TEMPLATE = """\
{%- set system_prompt = @SYSTEM@ -%}
{%- set inputs = @INPUTS@ -%}
{%- set outputs = @OUTPUTS@ -%}
{%- if system_prompt is not none and (messages | length == 0 or messages[0]['role'] != 'system') -%}
{{- '<|im_start|>system\\n' + system_prompt + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\\n' -}}
{%- if message['content'] is string -%}
{{- message['content'] -}}
{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'text' -%}
{{- part['text'] -}}
{%- elif message['role'] == 'assistant' and part['type'] in outputs -%}
{{- outputs[part['type']] -}}
{%- elif message['role'] != 'assistant' and part['type'] in inputs -%}
{{- inputs[part['type']] -}}
{%- else -%}
{{- raise_exception('a ' + part['type'] + ' part in a ' + message['role'] + ' message: this model has no ' + part['type'] + (' decoder' if message['role'] == 'assistant' else ' encoder')) -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""


def jinja_string(text: str) -> str:
    """``text`` as a Jinja string literal that reads back as exactly ``text`` (Jinja decodes a
    literal's escapes as Python's ``unicode-escape`` does): quotes, backslashes, newlines, braces
    and any Unicode survive."""
    return '"' + text.encode("unicode_escape").decode("ascii").replace('"', "\\x22") + '"'


def chatml_template(
    system_prompt: str | None = None, inputs: Mapping[str, str] | None = None, outputs: Mapping[str, str] | None = None
) -> str:
    """The Jinja chat template (module docstring) that renders what omnicore's ChatML trains on.

    Args:
        system_prompt: ``data.system_prompt``: written as a system message before conversations
            that start without one (as :class:`~omnicore.data.chat.ChatProcessor` adds it); None: none.
        inputs: modality -> the text one media item is written as in a non-assistant message (the
            encoder's wrap and placeholder, e.g. ``"<|image_pad|>"``).
        outputs: modality -> the text one media item is written as in an assistant message (the
            decoder's start token and placeholder, e.g. ``"<|image_start|><|image_out|>"``).

    Returns:
        the template text, for ``tokenizer.chat_template``.
    """

    def table(m: Mapping[str, str] | None) -> str:
        return "{" + ", ".join(f"{jinja_string(k)}: {jinja_string(v)}" for k, v in sorted((m or {}).items())) + "}"

    values = {
        "SYSTEM": "none" if system_prompt is None else jinja_string(system_prompt),
        "INPUTS": table(inputs),
        "OUTPUTS": table(outputs),
    }
    return re.sub(r"@([A-Z]+)@", lambda m: values[m.group(1)], _TEMPLATE)  # one pass: values never re-read
