"""A model's reply, split into answer, thinking and tool calls, as it streams.

    >>> from runtime.chat.families import Family
    >>> qwen = Family("hermes", tools=True, reasoning="think")
    >>> parser = ReplyParser(qwen, in_reasoning=False, tools=True)
    >>> out = parser.push("<think>\\nWeather: call the tool.\\n</think>\\n\\n<tool_")
    >>> out += parser.push('call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>')
    >>> [(d.kind, d.text or d.tool_call.arguments) for d in out + parser.close()]
    [('reasoning', 'Weather: call the tool.'), ('tool_call', '{"city":"Paris"}')]
    >>> reply = parser.finish(); reply.content, reply.tool_calls[0].name
    ('', 'get_weather')

`push` takes text split anywhere (inside a marker too) and returns what is safe to show:
text that might still turn into a marker waits for the next push. A tool call is one
delta, once it is complete. `close` ends the reply and returns the last deltas; `finish`
(which closes if needed) returns the whole `ParsedReply`. The deltas of all pushes and
`close`, put together, are exactly the whole reply parsed at once.

Thinking is recognised at the start of a reply (the family's think markers, e.g. R1's
<think>…</think>), or from the first token when the prompt already opened it
(`in_reasoning`; `starts_in_reasoning` tells from the rendered prompt). gpt-oss's harmony
channels are read by runtime.chat.harmony. With `tools=False` the parser never looks for
calls: a call the model writes anyway stays in the content as text.

Markers are matched as text: the engine must decode special tokens (<tool_call>,
<|channel|>, [TOOL_CALLS]…) into the text given to `push`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from runtime.chat.call_syntax import FORMATS, WRAPPERS, CallSyntax, Reader
from runtime.chat.call_values import ParamTypes, param_types
from runtime.chat.emitter import Emitter, ParsedReply, ReplyDelta, first_marker, held_back
from runtime.chat.families import Family
from runtime.chat.harmony import MESSAGE, HarmonyMachine

__all__ = ["ParsedReply", "ReplyDelta", "ReplyParser", "starts_in_reasoning"]


def starts_in_reasoning(family: Family, prompt: str) -> bool:
    """Whether the rendered prompt ends inside an opened thinking block, so the reply
    begins as thinking (DeepSeek R1's and Qwen3.5's templates end with "<think>\\n").

    >>> from runtime.chat.families import Family
    >>> r1 = Family("deepseek_r1", tools=True, reasoning="think")
    >>> starts_in_reasoning(r1, "<｜Assistant｜><think>\\n"), starts_in_reasoning(r1, "<think>\\n\\n</think>\\n\\n")
    (True, False)
    """
    tail = prompt.rstrip()
    if family.reasoning == "think":
        return bool(family.think_start) and tail.endswith(family.think_start)
    if family.reasoning == "harmony":
        return re.search(r"<\|channel\|>\s*analysis\s*" + re.escape(MESSAGE) + r"$", tail) is not None
    return False


class ReplyParser:
    """Streams one reply of `family`. `tool_specs` (the request's OpenAI tools, optional)
    types the values of families that write each argument bare (Qwen3-Coder, GLM)."""

    def __init__(self, family: Family, *, in_reasoning: bool, tools: bool,
                 tool_specs: Iterable[Mapping[str, Any]] = ()) -> None:
        self._emit = Emitter()
        self._closed = False
        calls = tools and family.tools
        self._machine: HarmonyMachine | _ThinkMachine
        if family.reasoning == "harmony":
            self._machine = HarmonyMachine(self._emit, in_reasoning=in_reasoning, tools=calls)
        else:
            syntax = FORMATS.get(family.name) if calls else None
            self._machine = _ThinkMachine(family, self._emit, syntax, param_types(tool_specs),
                                          in_reasoning=in_reasoning)

    def push(self, text: str) -> list[ReplyDelta]:
        """More of the reply; returns the deltas now safe to send."""
        if self._closed:
            return []
        self._machine.feed(text, final=False)
        return self._emit.take()

    def close(self) -> list[ReplyDelta]:
        """The reply ended: everything held back is decided; returns the last deltas."""
        if self._closed:
            return []
        self._closed = True
        self._machine.feed("", final=True)
        self._emit.finish()
        return self._emit.take()

    def finish(self) -> ParsedReply:
        """The whole reply (closes it first if `close` was not called). A call the reply
        ends inside is malformed: its text stays in the content."""
        self.close()
        return self._emit.parsed()


class _ThinkMachine:
    """Every family but harmony: optional thinking at the start, then the answer with the
    family's tool calls (and their sections) inside it."""

    def __init__(self, family: Family, emit: Emitter, syntax: CallSyntax | None,
                 types: ParamTypes, *, in_reasoning: bool) -> None:
        self._emit, self._syntax, self._types = emit, syntax, types
        thinks = family.reasoning == "think" and bool(family.think_start and family.think_end)
        self._start, self._end = (family.think_start, family.think_end) if thinks else ("", "")
        self._mode = "start" if thinks else "content"
        # Where a reply that does not open with think_start goes: the prompt may have opened
        # the block already (a model that opens it again anyway loses only the marker).
        self._after_start = "reasoning" if in_reasoning else "content"
        self._buf = ""
        self._segment_start = True  # where a bare-JSON call (Llama 3) may begin
        self._reader: Reader | None = None
        self._in_section = False
        self._section_raw = ""  # a section's text since its last good call (for a botched one)
        self._wrappers = WRAPPERS.get(family.name, ())
        self._quiet = self._wrappers + (syntax.strays if syntax else ())
        self._markers = (syntax.opens if syntax else ()) + self._quiet
        self._reasoning_ends = (self._end,) + (
            syntax.opens[:1] if syntax and syntax.ends_reasoning else ())

    def feed(self, text: str, final: bool) -> None:
        self._buf += text
        steps = {"start": self._step_start, "reasoning": self._step_reasoning,
                 "content": self._step_content, "call": self._step_call,
                 "section": self._step_section}
        while steps[self._mode](final):
            pass

    def _step_start(self, final: bool) -> bool:
        stripped = self._buf.lstrip()
        if stripped.startswith(self._start):
            self._buf = stripped[len(self._start):]
            self._emit.boundary()
            self._mode = "reasoning"
            return True
        if not final and self._start.startswith(stripped):
            return False
        if self._after_start == "reasoning":
            self._emit.boundary()
        self._mode = self._after_start
        return True

    def _step_reasoning(self, final: bool) -> bool:
        buf = self._buf
        found = first_marker(buf, self._reasoning_ends)
        if found is None:
            keep = 0 if final else held_back(buf, self._reasoning_ends)
            self._emit.text("reasoning", buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        stop, marker = found
        self._emit.text("reasoning", buf[:stop])
        self._emit.boundary()
        self._buf = buf[stop + len(marker):] if marker == self._end else buf[stop:]
        self._mode, self._segment_start = "content", True
        return True

    def _step_content(self, final: bool) -> bool:
        syntax, buf = self._syntax, self._buf
        if self._segment_start and syntax and syntax.at_segment_start:
            stripped = buf.lstrip()
            if stripped.startswith(syntax.at_segment_start):
                self._emit.text("content", buf[:len(buf) - len(stripped)])  # held, not shown
                return self._open_call(syntax.at_segment_start, len(buf) - len(stripped))
            if stripped or final:
                self._segment_start = False
            else:
                return False
        found = first_marker(buf, self._markers)
        if found is None:
            keep = 0 if final else held_back(buf, self._markers)
            self._text(buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        stop, marker = found
        self._text(buf[:stop])
        if marker in self._quiet:
            self._buf = buf[stop + len(marker):]
            self._emit.boundary()
            return True
        assert syntax is not None  # markers beyond the quiet ones come from the syntax
        if syntax.section and marker == syntax.section.open:
            self._emit.boundary()
            self._buf = buf[stop + len(marker):]
            self._mode, self._in_section, self._section_raw = "section", True, marker
            return True
        return self._open_call(marker, stop)

    def _open_call(self, opener: str, at: int) -> bool:
        assert self._syntax is not None
        self._buf = self._buf[at:]
        self._reader = self._syntax.reader(opener, self._types)
        self._mode = "call"
        return True

    def _step_call(self, final: bool) -> bool:
        assert self._reader is not None
        outcome = self._reader.read(self._buf, final)
        if outcome is None:
            return False
        raw, self._buf = self._buf[:outcome.end], self._buf[outcome.end:]
        self._reader = None
        if outcome.calls:
            self._emit.boundary()
            for call in outcome.calls:
                self._emit.call(call.name, call.arguments, call.id)
            self._emit.boundary()
            self._segment_start = True
            self._mode, self._section_raw = "section" if self._in_section else "content", ""
            return True
        if outcome.not_a_call:
            self._emit.raw(raw)
            self._segment_start = False
        else:
            raw = (self._section_raw if self._in_section else "") + raw
            self._emit.bad_call(outcome.malformed or "the tool call cannot be read", raw)
        self._mode, self._in_section = "content", False
        return True

    def _step_section(self, final: bool) -> bool:
        section = self._syntax.section if self._syntax else None
        assert section is not None
        buf = self._buf.lstrip()
        self._section_raw += self._buf[:len(self._buf) - len(buf)]
        self._buf = buf
        if buf.startswith(section.close):
            self._buf = buf[len(section.close):]
            self._emit.boundary()
            self._mode, self._in_section, self._segment_start = "content", False, True
            return True
        if buf.startswith(section.call_open):
            return self._open_call(section.call_open, 0)
        if not final and (section.close.startswith(buf) or section.call_open.startswith(buf)):
            return False
        # The reply ends in the section, or the section holds something that is not a call:
        # either way it is over, and if no call came since it opened, it was botched.
        if self._section_raw.strip():
            reason = ("the reply ends inside a tool call" if not buf
                      else "a tool-call section holds text that is not a call")
            self._emit.bad_call(reason, self._section_raw)
        self._mode, self._in_section, self._section_raw = "content", False, ""
        return bool(buf)

    def _text(self, text: str) -> None:
        if text.strip():
            self._segment_start = False
        self._emit.text("content", text)
