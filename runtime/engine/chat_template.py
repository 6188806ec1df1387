"""Chat templates: the GGUF's `tokenizer.chat_template`, rendered the way Hugging Face does.

Same environment as transformers' `apply_chat_template`: an immutable jinja2 sandbox with
`trim_blocks`, `lstrip_blocks` and loop controls, a `tojson` that keeps non-ASCII text, and
the globals `raise_exception` and `strftime_now`; the variables are `messages` (dicts with
`role` and `content`), `add_generation_prompt`, `bos_token` and `eos_token`.

A model without a template (or with one jinja cannot compile) gets ChatML, and says so:
`source` is "fallback" and `note` explains why.

    >>> t = ChatTemplate.from_model(None, bos_token="<s>", eos_token="</s>")
    >>> t.source, t.render([ChatMessage("user", "Hi")])
    ('fallback', '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n')
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from runtime.errors import ChatTemplateError
from runtime.events import ChatMessage

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _as_dict(message: ChatMessage | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(message, ChatMessage):
        return {"role": message.role, "content": message.content}
    return dict(message)


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and the special-token texts it is rendered with."""

    text: str
    source: Literal["model", "fallback"]
    bos_token: str
    eos_token: str
    note: str | None = None
    _compiled: jinja2.Template = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Compile once per model (milliseconds), not per request.
        object.__setattr__(self, "_compiled", _environment().from_string(self.text))

    @classmethod
    def from_model(cls, template: str | None, *, bos_token: str, eos_token: str) -> ChatTemplate:
        """The model's template, or ChatML with a note when it has none or it is broken."""
        if template and template.strip():
            try:
                _environment().from_string(template)
            except jinja2.exceptions.TemplateError as exc:
                return cls(CHATML, "fallback", bos_token, eos_token,
                           note=f"the model's chat template does not compile ({exc}); using ChatML")
            return cls(template, "model", bos_token, eos_token)
        return cls(CHATML, "fallback", bos_token, eos_token,
                   note="the model has no chat template; using ChatML")

    def render(self, messages: Sequence[ChatMessage | Mapping[str, Any]], *,
               add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for `messages`. A template's own `raise_exception` (e.g. "roles
        must alternate") becomes a ChatTemplateError with its message."""
        try:
            return self._compiled.render(
                messages=[_as_dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"the chat template refused these messages: {exc}") from exc
