"""gpt-oss's harmony format, read as it streams: a reply is a run of messages, each a
header up to <|message|> and a body up to <|end|> (or <|call|>, <|return|>):

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"city": "Paris"}<|call|>

The analysis channel is reasoning; final (and commentary without a recipient, the preamble
gpt-oss writes before calls) is content; a message to `functions.NAME` is a call to NAME
whose body is the JSON arguments (the recipient may also sit in the role part of the
header: `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`). A
reply that is not harmony at all (no header) is content as it is.
"""

from __future__ import annotations

import re

from runtime.chat.call_values import BadCall, loads, object_arguments
from runtime.chat.emitter import DeltaKind, Emitter, first_marker, held_back

MESSAGE = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_BREAKS = ("<|start|>", "<|channel|>")  # a new message started without an end marker
_FIRST_STARTS = ("<|channel|>", " to=")  # how the reply itself may open a header
_HEADER_STARTS = (*_FIRST_STARTS, "assistant")  # and a message after <|start|>
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z0-9_-]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_MAX_HEADER = 1024


class HarmonyMachine:
    """Splits a harmony reply into the emitter's content, reasoning and calls."""

    def __init__(self, emit: Emitter, *, in_reasoning: bool, tools: bool) -> None:
        self._emit = emit
        self._tools = tools
        self._buf = ""
        self._mode = "body" if in_reasoning else "header"
        self._kind: DeltaKind = "reasoning" if in_reasoning else "content"
        self._call_name = ""
        self._header = ""
        self._starts: tuple[str, ...] = _FIRST_STARTS

    def feed(self, text: str, final: bool) -> None:
        self._buf += text
        steps = {"header": self._step_header, "body": self._step_body,
                 "between": self._step_between}
        while steps[self._mode](final):
            pass
        if final:
            self._buf = ""

    def _step_header(self, final: bool) -> bool:
        buf, starts = self._buf, self._starts
        if not any(buf.startswith(s) for s in starts):
            if not final and any(s.startswith(buf) for s in starts):
                return False
            self._mode, self._kind = "body", "content"  # not harmony: plain text
            return bool(buf)
        i = buf.find(MESSAGE, 0, _MAX_HEADER + len(MESSAGE))
        if i < 0:
            if final:  # the reply ends in a header: nothing was said
                return False
            if len(buf) <= _MAX_HEADER:
                return False
            self._mode, self._kind = "body", "content"
            return True
        header, self._buf = buf[:i], buf[i + len(MESSAGE):]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self._emit.boundary()
        self._mode = "body"
        if self._tools and recipient:
            self._kind, self._header = "tool_call", header + MESSAGE
            self._call_name = recipient.group(1).removeprefix("functions.")
        else:
            self._kind = "reasoning" if channel and channel.group(1) == "analysis" else "content"
        return True

    def _step_body(self, final: bool) -> bool:
        buf = self._buf
        found = first_marker(buf, _ENDS + _BREAKS)
        if self._kind == "tool_call":
            if found is None and not final:
                return False
            stop, marker = found if found else (len(buf), "")
            ended = marker in _ENDS
            self._call(buf[:stop], marker if ended else "", complete=found is not None)
            self._buf = buf[stop + (len(marker) if ended else 0):]
            self._mode = "between" if found else "body"
            return found is not None
        if found is None:
            keep = 0 if final else held_back(buf, _ENDS + _BREAKS)
            self._emit.text(self._kind, buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        stop, marker = found
        self._emit.text(self._kind, buf[:stop])
        self._emit.boundary()
        self._buf = buf[stop + (len(marker) if marker in _ENDS else 0):]
        self._mode = "between"
        return True

    def _step_between(self, final: bool) -> bool:
        stripped = self._buf.lstrip()
        if not stripped:
            self._buf = ""
            return False
        if stripped.startswith("<|start|>"):
            self._buf, self._mode = stripped[len("<|start|>"):], "header"
            self._starts = _HEADER_STARTS
            return True
        if stripped.startswith(_FIRST_STARTS):
            self._buf, self._mode, self._starts = stripped, "header", _FIRST_STARTS
            return True
        if not final and "<|start|>".startswith(stripped):
            return False
        self._buf, self._mode, self._kind = stripped, "body", "content"
        return True

    def _call(self, arguments: str, end: str, *, complete: bool) -> None:
        try:
            if not self._call_name:
                raise BadCall("a tool call has no function name")
            self._emit.call(self._call_name, object_arguments(loads(arguments)), None)
            self._emit.boundary()
        except BadCall as error:
            reason = str(error) if complete else "the reply ends inside a tool call"
            self._emit.bad_call(reason, self._header + arguments + end)
        self._kind = "content"
