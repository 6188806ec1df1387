"""What a parsed reply is made of (`ReplyDelta`, `ParsedReply`) and the `Emitter` that
collects them while a reply streams.

The emitter owns the one whitespace rule every family shares: whitespace that touches a
structural block (a reasoning block, a tool call, a response wrapper) belongs to the
structure, not to the text. So `"<think>\\nPlan.\\n</think>\\n\\nAnswer"` gives reasoning
"Plan." and content "Answer", and `"Let me look.\\n<tool_call>..."` gives content "Let me
look.". Whitespace anywhere else is kept exactly, also at the very start and end of a reply
that has no structure at all. To decide, trailing whitespace is held back until the next
non-space text (emit it) or structure (drop it) arrives:

    >>> e = Emitter()
    >>> e.text("content", "Hello \\n"); [d.text for d in e.take()]
    ['Hello']
    >>> e.text("content", "world"); [d.text for d in e.take()]
    [' \\nworld']
    >>> e.boundary(); e.call("f", {"x": 1}, "call_1"); e.text("content", "\\n ok")
    >>> [(d.kind, d.text or d.tool_call) for d in e.take()][1]
    ('content', 'ok')
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass
from typing import Any, Literal

from runtime.events import ToolCall

DeltaKind = Literal["content", "reasoning", "tool_call"]
_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ReplyDelta:
    """One piece of a streamed reply: text of the answer or of the thinking, or a whole
    tool call once it is complete (`tool_index` counts the calls of the reply from 0)."""

    kind: DeltaKind
    text: str = ""
    tool_index: int = 0
    tool_call: ToolCall | None = None


@dataclass(frozen=True)
class ParsedReply:
    """A whole reply. `reasoning` is None when the model did not think (or thought nothing).
    `malformed` says why a call the model started could not be read (its
    raw text, markers included, stays in `content`); None when every call was well formed."""

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    malformed: str | None


def new_call_id() -> str:
    """An id for a call whose format carries none: "call_" and 24 random letters/digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def compact_json(value: Any) -> str:
    """Arguments as OpenAI sends them: compact JSON text, non-ASCII kept as is.

    >>> compact_json({"city": "Zürich", "days": [1, 2]})
    '{"city":"Zürich","days":[1,2]}'
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Emitter:
    """Collects a reply's deltas (`take` returns those not yet taken) and its totals."""

    def __init__(self) -> None:
        self._out: list[ReplyDelta] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self.calls: list[ToolCall] = []
        self.malformed: str | None = None
        self._pending = ""  # trailing whitespace held back, of kind self._pending_kind
        self._pending_kind: DeltaKind = "content"
        self._drop_leading = False  # the next text starts right after a structural block

    def text(self, kind: DeltaKind, text: str) -> None:
        """Content or reasoning text, split anywhere; whitespace follows the module's rule."""
        if self._pending and self._pending_kind != kind:
            self._pending = ""
        if self._drop_leading:
            text = text.lstrip()
            if not text:
                return
            self._drop_leading = False
        body = text.rstrip()
        tail = text[len(body):]
        if body:
            self._put(kind, self._pending + body)
            self._pending = ""
        self._pending += tail
        self._pending_kind = kind

    def raw(self, text: str) -> None:
        """Text that looked like structure but is not (a botched call): content, as is."""
        self._drop_leading = False
        self.text("content", text)

    def boundary(self) -> None:
        """A structural block starts or ends here: whitespace on either side is dropped."""
        self._pending = ""
        self._drop_leading = True

    def call(self, name: str, arguments: Any, call_id: str | None) -> None:
        """A complete call: `arguments` is the parsed arguments object."""
        tool_call = ToolCall(name=name, arguments=compact_json(arguments),
                             id=call_id or new_call_id())
        self._out.append(ReplyDelta("tool_call", tool_index=len(self.calls), tool_call=tool_call))
        self.calls.append(tool_call)

    def bad_call(self, reason: str, text: str) -> None:
        """A call the model started but botched: remember why, keep its text as content."""
        if self.malformed is None:
            self.malformed = reason
        self.raw(text)

    def finish(self) -> None:
        """The reply ended: held whitespace of the answer is the answer's (not thinking's)."""
        if self._pending and self._pending_kind == "content":
            self._put("content", self._pending)
        self._pending = ""

    def take(self) -> list[ReplyDelta]:
        out, self._out = self._out, []
        return out

    def parsed(self) -> ParsedReply:
        return ParsedReply(
            content="".join(self._content),
            reasoning="".join(self._reasoning) or None,
            tool_calls=tuple(self.calls),
            malformed=self.malformed,
        )

    def _put(self, kind: DeltaKind, text: str) -> None:
        (self._reasoning if kind == "reasoning" else self._content).append(text)
        self._out.append(ReplyDelta(kind, text=text))


def first_marker(buf: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    """The earliest marker in `buf` (the longest where two start at the same place).

    >>> first_marker("a</think>b<tool_call>", ("<tool_call>", "</think>"))
    (1, '</think>')
    """
    best: tuple[int, str] | None = None
    for marker in markers:
        i = buf.find(marker)
        if i >= 0 and (best is None or i < best[0] or (i == best[0] and len(marker) > len(best[1]))):
            best = (i, marker)
    return best


def held_back(buf: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `buf` might be the start of a marker (and so must
    wait for more text before they can be called text).

    >>> held_back("Hello <tool", ("<tool_call>",)), held_back("Hello", ("<tool_call>",))
    (5, 0)
    """
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(buf)), best, -1):
            if buf.endswith(marker[:k]):
                best = k
                break
    return best
