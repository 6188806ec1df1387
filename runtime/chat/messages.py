"""Messages as a chat template sees them: the dicts llama.cpp's `--jinja` hands a template
(common/chat.cpp `to_json_oaicompat`), so templates written for tool calling find what they
look for, plus the few per-family adjustments llama.cpp makes (or real templates need).

    ChatMessage("assistant", "", tool_calls=(ToolCall("get_weather", '{"city": "Oslo"}', "c1"),))
    → {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}
    ChatMessage("tool", "12 °C", tool_call_id="c1", name="get_weather")
    → {"role": "tool", "content": "12 °C", "tool_call_id": "c1", "name": "get_weather"}

- `arguments` is a dict when the family wants one (`Family.arguments_as_object`), else the
  JSON text; an assistant's `reasoning` is `reasoning_content` (and `thinking` for harmony).
- Mistral's templates refuse call ids that are not 9 letters or digits: others are mapped.
- gpt-oss writes one call per message: parallel calls become consecutive messages.
- A template that hides an assistant's calls gets them another way (`CallContent`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal

from runtime.chat.families import Family
from runtime.errors import ChatTemplateError
from runtime.events import ChatMessage, ToolCall

_SHORT_ID_FAMILIES = frozenset({"mistral_nemo", "mistral"})  # their templates refuse other ids
_SHORT_ID = re.compile(r"[A-Za-z0-9]{9}")


def short_id(call_id: str | None) -> str:
    """Mistral's templates raise unless a call id is 9 letters or digits; any other id (an
    OpenAI "call_…", none at all) is mapped to one, the same for the call and its result.

        >>> short_id("abcDEF123"), short_id("call_0"), short_id("call_0") == short_id("call_0")
        ('abcDEF123', 'c557a85a0', True)
    """
    if call_id and _SHORT_ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256((call_id or "").encode()).hexdigest()[:9]


CallContent = Literal["empty", "null", "text"]


def _as_dict(message: ChatMessage | Mapping[str, Any], family: Family,
             call_content: CallContent = "empty") -> dict[str, Any]:
    """A message as llama.cpp's `--jinja` gives it to a template (module docstring).
    `call_content` is for the few templates that hide an assistant's calls that way: "null"
    sends None as the content of a call without text, "text" writes the calls into the
    content in the family's syntax (Granite 3.3's template never writes them)."""
    if not isinstance(message, ChatMessage):
        return copy.deepcopy(dict(message))
    short_ids = family.name in _SHORT_ID_FAMILIES
    content: str | None = message.content
    if message.tool_calls and call_content == "null" and not content:
        content = None
    elif message.tool_calls and call_content == "text":
        content = message.content + _calls_as_text(family, message.tool_calls)
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
        if family.reasoning == "harmony":  # gpt-oss's template reads `thinking` (and
            out["thinking"] = message.reasoning  # refuses it beside a call's content)
            if message.tool_calls:
                del out["content"]
    if message.name:
        out["name"] = message.name
    if message.tool_call_id or (short_ids and message.role == "tool"):
        out["tool_call_id"] = short_id(message.tool_call_id) if short_ids else message.tool_call_id
    if message.tool_calls:
        out["tool_calls"] = [_call_dict(call, family.arguments_as_object, short_ids)
                             for call in message.tool_calls]
    return out


def _call_dict(call: ToolCall, arguments_as_object: bool, short_ids: bool) -> dict[str, Any]:
    arguments: Any = call.arguments
    if arguments_as_object:
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            raise ChatTemplateError(
                f"the arguments of the call to {call.name!r} are not JSON: "
                f"{call.arguments[:80]!r}") from None
    out: dict[str, Any] = {"type": "function",
                           "function": {"name": call.name, "arguments": arguments}}
    if call.id or short_ids:
        out["id"] = short_id(call.id) if short_ids else call.id
    return out


def _calls_as_text(family: Family, calls: Sequence[ToolCall]) -> str:
    """`<|tool_call|>[{"name": …, "arguments": {…}}]`: Granite 3.3's syntax, the only
    family whose template needs this; others get the JSON list alone."""
    listed = []
    for call in calls:
        try:
            arguments: Any = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            arguments = call.arguments
        listed.append({"name": call.name, "arguments": arguments})
    marker = "<|tool_call|>" if family.name == "granite" else ""
    return marker + json.dumps(listed, ensure_ascii=False)


_ONE_CALL_FAMILIES = frozenset({"gpt_oss"})  # harmony: one call per message, the template
# writes `tool_calls[0]` only


def _one_call_each(messages: Sequence[ChatMessage | Mapping[str, Any]]
                   ) -> list[ChatMessage | Mapping[str, Any]]:
    """Parallel calls as consecutive assistant messages of one call each (the text and the
    reasoning stay with the first), so a template that writes one call per message loses none."""
    out: list[ChatMessage | Mapping[str, Any]] = []
    for message in messages:
        if isinstance(message, ChatMessage) and len(message.tool_calls) > 1:
            first, *rest = message.tool_calls
            out.append(replace(message, tool_calls=(first,)))
            out.extend(ChatMessage("assistant", "", tool_calls=(call,)) for call in rest)
        else:
            out.append(message)
    return out


def template_context(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The variables llama.cpp adds to every render (common/chat.cpp
    `common_chat_extra_context`), and `functions` for FireFunction's template, which
    lists the tools from it (llama.cpp's former firefunction handler passed it)."""
    now = datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"),
            "enable_thinking": True,
            "functions": json.dumps([t.get("function", t) for t in tools], indent=2,
                                    ensure_ascii=False) if tools else ""}


def template_messages(messages: Sequence[ChatMessage | Mapping[str, Any]], family: Family,
                      call_content: CallContent = "empty") -> list[dict[str, Any]]:
    """`messages` as `family`'s template wants them; mappings are passed on as they are
    (copied: a template may `append` to what it is given)."""
    if family.name in _ONE_CALL_FAMILIES:
        messages = _one_call_each(messages)
    return [_as_dict(m, family, call_content) for m in messages]
