"""One chat choice's text read as its template family writes it: the answer (`content`), the
thinking (`reasoning_content`) and the function calls (`tool_calls`), whole or as stream deltas.

`runtime.chat.reply.ReplyParser` does the reading; this module turns what it finds into
OpenAI's JSON and decides the `finish_reason`:

    reader = ChoiceReader(ReplyOptions(hermes, in_reasoning=False, parse_calls=True))
    reader.push('Let me look.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    → ReplyParts(content="Let me look.")            # the call's end is not seen yet
    reader.push('</tool_call>')
    → ReplyParts(tool_calls=[{"index": 0, "id": "call_…", "type": "function",
                              "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}])
    reader.finish("stop")
    → ReplyEnd(rest=ReplyParts(), reason="tool_calls", parsed=ParsedReply(...))

Finish reasons: "tool_calls" when the reply holds calls; "malformed_tool_call" when the model
started a call and botched it (its raw text is then in the content, so nothing is lost; the
well-formed calls before it stay calls);
otherwise the engine's ("stop", "length", "cancelled"). A botched call cut off by max_tokens
says "length": it was cut, not botched.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import Any

from runtime.chat.families import Family
from runtime.chat.reply import ParsedReply, ReplyDelta, ReplyParser
from runtime.events import ToolCall


@dataclass(frozen=True)
class ReplyOptions:
    """How a request's chat replies are read. `in_reasoning`: the prompt ends inside the
    family's thinking block (a template that opens `<think>` itself)."""

    family: Family
    in_reasoning: bool = False
    parse_calls: bool = False
    tools: tuple[dict[str, Any], ...] = ()  # the request's: they type bare argument values


@dataclass
class ReplyParts:
    """What one piece of a reply adds, per field."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def delta(self) -> dict[str, Any]:
        """A stream chunk's `delta` fields. `content` is left out when the piece holds only
        thinking or calls; a piece with nothing says `"content": ""` (text held back)."""
        out: dict[str, Any] = {}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.content or (not out and not self.tool_calls):
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out

    def empty(self) -> bool:
        return not (self.content or self.reasoning or self.tool_calls)


@dataclass(frozen=True)
class ReplyEnd:
    """A choice's end: what the parser still held back, the finish reason, the whole reply."""

    rest: ReplyParts
    reason: str
    parsed: ParsedReply


def tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """OpenAI's JSON of a call; with `index` as a stream delta carries it."""
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update({"id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}})
    return out


def finish_reason(engine_reason: str, parsed: ParsedReply) -> str:
    if engine_reason == "cancelled":
        return engine_reason
    if parsed.malformed is not None:
        return "malformed_tool_call" if engine_reason == "stop" else engine_reason
    if parsed.tool_calls:
        return "tool_calls"
    return engine_reason


def message_json(parsed: ParsedReply) -> dict[str, Any]:
    """The `message` of a whole reply."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:  # with a botched call after them too: those were well formed
        message["tool_calls"] = [tool_call_json(call) for call in parsed.tool_calls]
        if not parsed.content.strip():
            message["content"] = None  # as OpenAI: a reply that is only calls has no content
    return message


class ChoiceReader:
    """Reads one choice's text as it streams. `push` gives what is new per field; `finish`
    the `ReplyEnd` (what the parser held back until the end, the reason, the whole reply)."""

    def __init__(self, options: ReplyOptions) -> None:
        self._parser = ReplyParser(options.family, in_reasoning=options.in_reasoning,
                                   tools=options.parse_calls, tool_specs=options.tools)
        self._ids: dict[int, str] = {}  # the id each call was sent with, by index

    def push(self, text: str) -> ReplyParts:
        return self._parts(self._parser.push(text)) if text else ReplyParts()

    def finish(self, engine_reason: str) -> ReplyEnd:
        rest = self._parts(self._parser.close())
        parsed = self._parser.finish()
        calls = tuple(self._with_id(i, call) for i, call in enumerate(parsed.tool_calls))
        parsed = dataclasses.replace(parsed, tool_calls=calls)
        return ReplyEnd(rest, finish_reason(engine_reason, parsed), parsed)

    def _parts(self, deltas: list[ReplyDelta]) -> ReplyParts:
        parts = ReplyParts()
        for delta in deltas:
            if delta.kind == "content":
                parts.content += delta.text
            elif delta.kind == "reasoning":
                parts.reasoning += delta.text
            elif delta.tool_call is not None:
                call = self._with_id(delta.tool_index, delta.tool_call)
                parts.tool_calls.append(tool_call_json(call, delta.tool_index))
        return parts

    def _with_id(self, index: int, call: ToolCall) -> ToolCall:
        """The call with the id it was (or will be) streamed with; one is made for a call
        that has none, once."""
        if index not in self._ids:
            self._ids[index] = call.id or "call_" + uuid.uuid4().hex[:24]
        return dataclasses.replace(call, id=self._ids[index])
