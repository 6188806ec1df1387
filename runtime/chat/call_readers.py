"""Readers of one tool-call block, fed the text from its opener on as it streams in
(runtime.chat.call_syntax says which family uses which). Each answers None (not decided
yet) or an `Outcome`; once it answers, more text would not change the answer.

    >>> reader = Closed("<tool_call>", "</tool_call>", lambda body: (Call(body.strip(), {}),))
    >>> reader.read("<tool_call> f", final=False) is None
    True
    >>> reader.read("<tool_call> f </tool_call> more", final=False).end
    26
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from runtime.chat.call_values import (
    BadCall,
    Call,
    json_calls,
    loads,
    object_arguments,
    pythonic_calls,
)

ENDS_INSIDE = "the reply ends inside a tool call"


@dataclass(frozen=True)
class Outcome:
    """Where a call block ends (`end`, counted from its opener) and what it held: calls, or
    why it is malformed, or (`not_a_call`) that it only looked like the start of one."""

    end: int
    calls: tuple[Call, ...] = ()
    malformed: str | None = None
    not_a_call: bool = False


class Reader(Protocol):
    def read(self, buf: str, final: bool) -> Outcome | None:
        """`buf` starts with the opener; None: not decided yet (never when `final`)."""


class JsonEnd:
    """Finds, reading incrementally, where the JSON object or array that starts at `start`
    (after whitespace) ends. Brackets and strings only: validity is json.loads' job.

    >>> scan = JsonEnd(0); scan.scan('{"a": "}"'), scan.scan('{"a": "}"} tail')
    (None, 10)
    """

    _OUTSIDE = re.compile(r'[{}\[\]"]')
    _INSIDE = re.compile(r'["\\]')

    def __init__(self, start: int) -> None:
        self.pos = start
        self.value_start = -1
        self._depth = 0
        self._in_string = False

    def scan(self, buf: str) -> int | None:
        """The end (exclusive) once the value is closed, else None. Raises BadCall when the
        first character is not { or [."""
        i, n = self.pos, len(buf)
        if self.value_start < 0:
            while i < n and buf[i] in " \t\r\n":
                i += 1
            if i == n:
                self.pos = i
                return None
            if buf[i] not in "{[":
                raise BadCall("the tool call does not hold a JSON object")
            self.value_start = i
        while i < n:
            if self._in_string:
                match = self._INSIDE.search(buf, i)
                if match is None:
                    i = n
                elif match.group() == "\\":
                    if match.start() + 1 >= n:  # the escaped character has not arrived
                        i = match.start()
                        break
                    i = match.start() + 2
                else:
                    self._in_string = False
                    i = match.end()
                continue
            match = self._OUTSIDE.search(buf, i)
            if match is None:
                i = n
                continue
            char, i = match.group(), match.end()
            if char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth <= 0:
                    self.pos = i
                    return i
        self.pos = i
        return None


Body = Callable[[str], tuple[Call, ...]]


class Closed:
    """`open` body `close`. The body ends at the first `close` after which it reads (a
    string argument may hold the closing marker's text); a body the reply ends in without
    its close still counts when it reads completely (a model may stop right before it).
    So text after a botched call waits for the end of the reply before it is decided."""

    def __init__(self, open_: str, close: str, body: Body) -> None:
        self._open, self._close, self._body = open_, close, body
        self._search_from = len(open_)
        self._first_bad: tuple[int, str] | None = None

    def read(self, buf: str, final: bool) -> Outcome | None:
        start = len(self._open)
        while (i := buf.find(self._close, self._search_from)) >= 0:
            self._search_from = i + 1
            try:
                return Outcome(i + len(self._close), calls=self._body(buf[start:i]))
            except BadCall as error:
                self._first_bad = self._first_bad or (i + len(self._close), str(error))
        if not final:
            self._search_from = max(self._search_from, start, len(buf) - len(self._close) + 1)
            return None
        try:
            return Outcome(len(buf), calls=self._body(buf[start:]))
        except BadCall:
            pass
        if self._first_bad is not None:
            return Outcome(self._first_bad[0], malformed=self._first_bad[1])
        return Outcome(len(buf), malformed=ENDS_INSIDE)


class JsonAfter:
    """`open` then one JSON value whose end ends the call, then (optional) `close`.
    `json_from`: where the value starts, when the opener's last characters belong to it."""

    def __init__(self, open_: str, body: Body, close: str = "", json_from: int | None = None):
        self._open, self._body, self._close = open_, body, close
        self._scan = JsonEnd(len(open_) if json_from is None else json_from)

    def read(self, buf: str, final: bool) -> Outcome | None:
        try:
            end = self._scan.scan(buf)
        except BadCall as error:
            return Outcome(len(self._open), malformed=str(error))
        if end is None:
            return Outcome(len(buf), malformed=ENDS_INSIDE) if final else None
        value = buf[self._scan.value_start:end]
        if self._close:
            rest = buf[end:].lstrip()
            skipped = len(buf) - end - len(rest)
            if rest.startswith(self._close):
                end += skipped + len(self._close)
            elif self._close.startswith(rest) and not final:
                return None
        try:
            return Outcome(end, calls=self._body(value))
        except BadCall as error:
            return Outcome(end, malformed=str(error))


class Mistral:
    """[TOOL_CALLS]NAME[ARGS]{...} (Small 3.2 adds [CALL_ID]ID before [ARGS]), or Nemo's
    [TOOL_CALLS][{"name": ..., "arguments": ..., "id": ...}]: either form under either family."""

    OPEN = "[TOOL_CALLS]"

    def __init__(self) -> None:
        self._json: JsonEnd | None = None
        self._nemo = False
        self._head = ""

    def read(self, buf: str, final: bool) -> Outcome | None:
        start = len(self.OPEN)
        if self._json is None:
            rest = buf[start:].lstrip()
            if not rest:
                return Outcome(len(buf), malformed=ENDS_INSIDE) if final else None
            if rest[0] in "[{":
                self._nemo, self._json = True, JsonEnd(start)
            else:
                # A name is one short line: a line break or 256 characters before [ARGS]
                # mean there is none, whether the text arrived whole or in pieces.
                i = buf.find("[ARGS]", start)
                head = buf[start:i if i >= 0 else len(buf)].lstrip()
                if "\n" in head or len(head) > 256:
                    return Outcome(start, malformed="a [TOOL_CALLS] call has no [ARGS]")
                if i < 0:
                    return Outcome(len(buf), malformed=ENDS_INSIDE) if final else None
                self._head, self._json = buf[start:i], JsonEnd(i + len("[ARGS]"))
        try:
            end = self._json.scan(buf)
        except BadCall as error:
            return Outcome(self._json.pos, malformed=str(error))
        if end is None:
            return Outcome(len(buf), malformed=ENDS_INSIDE) if final else None
        value = buf[self._json.value_start:end]
        try:
            if self._nemo:
                return Outcome(end, calls=json_calls(loads(value)))
            name, _, call_id = self._head.partition("[CALL_ID]")
            name = name.strip()
            if not name:
                raise BadCall("a tool call has no function name")
            call = Call(name, object_arguments(loads(value)), call_id.strip() or None)
            return Outcome(end, calls=(call,))
        except BadCall as error:
            return Outcome(end, malformed=str(error))


class Llama3Json:
    """A bare {"name": ..., "parameters": ...} where the answer starts. Text that only
    starts with "{" is not a call: it stays content (`not_a_call`)."""

    _KEYS = ('"name"', '"type"')

    def __init__(self) -> None:
        self._scan = JsonEnd(0)

    def read(self, buf: str, final: bool) -> Outcome | None:
        head = buf[1:].lstrip()[:6]
        if not any(key.startswith(head) if len(head) < 6 else key == head for key in self._KEYS):
            return Outcome(1, not_a_call=True)
        end = self._scan.scan(buf) if len(head) == 6 else None
        if end is None:
            if not final:
                return None
            if len(head) < 6:
                return Outcome(len(buf), not_a_call=True)
            return Outcome(len(buf), malformed=ENDS_INSIDE)
        try:
            value = loads(buf[:end])
        except BadCall as error:
            return Outcome(end, malformed=str(error))
        if not isinstance(value, dict) or not ({"parameters", "arguments", "function"} & set(value)):
            return Outcome(end, not_a_call=True)
        try:
            return Outcome(end, calls=json_calls(value))
        except BadCall as error:
            return Outcome(end, malformed=str(error))


class PythonTag:
    """<|python_tag|> then a JSON call, or a built-in tool's `name.call(key="value")`."""

    OPEN = "<|python_tag|>"
    _ENDS = ("<|eom_id|>", "<|eot_id|>")

    def __init__(self) -> None:
        self._json: JsonAfter | None = None

    def read(self, buf: str, final: bool) -> Outcome | None:
        rest = buf[len(self.OPEN):].lstrip()
        if not rest and not final:
            return None
        if rest.startswith(("{", "[")) or self._json is not None:
            self._json = self._json or JsonAfter(self.OPEN, lambda text: json_calls(loads(text)))
            return self._json.read(buf, final)
        ends = [i for i in (buf.find(end) for end in self._ENDS) if i >= 0]
        if not ends and not final:
            return None
        stop = min(ends) if ends else len(buf)
        end = stop + (len(next(e for e in self._ENDS if buf.startswith(e, stop))) if ends else 0)
        try:
            return Outcome(end, calls=pythonic_calls(buf[len(self.OPEN):stop]))
        except BadCall as error:
            return Outcome(end, malformed=str(error))
