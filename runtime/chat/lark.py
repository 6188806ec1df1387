"""A small builder of llguidance Lark grammars (docs: llguidance's docs/syntax.md).

    >>> g = Lark({"<tool_call>": 151657})
    >>> g.start(g.lit("<tool_call>") + " " + g.until("</tool_call>"))
    >>> print(g.text(), end="")
    start: <[151657]> u0
    u0[lazy]: /(?s:.*)<\\/tool_call>/

Markers that are single special tokens of the model's vocabulary (`special`: text → token
id) are written as token references: a string literal would force the model to spell the
marker out of ordinary tokens, which it never does. Everything else is a string literal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# JSON whitespace the model may write at each place JSON allows it: llama.cpp's SPACE_RULE
# ("" | " " | "\n"{1,2} [ \t]{0,20}), the same bound as response_format's schemas
# (runtime/sampling/grammar.py; tests/unit/chat/test_tool_grammar.py checks they agree), so a
# grammar cannot let a model loop on whitespace.
_JSON_WHITESPACE = {"whitespace_pattern": r"(?:\x20|\x0A{1,2}[\x20\x09]{0,20})?"}
_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


def regex_escape(text: str) -> str:
    """`text` as a literal inside /.../ (Rust regex syntax; < and > stay as they are)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


class Lark:
    """Rules under construction; `text()` is the grammar, with `start` first."""

    def __init__(self, special: Mapping[str, int] | None = None) -> None:
        self._special = {k: v for k, v in (special or {}).items() if k}
        self._rules: list[str] = []
        self._start = ""
        self._names: dict[str, str] = {}
        self._count = 0

    def start(self, body: str) -> None:
        self._start = body

    def text(self) -> str:
        return "\n".join([f"start: {self._start}", *self._rules]) + "\n"

    def rule(self, body: str, prefix: str = "r", options: str = "") -> str:
        """A named rule for `body` (the same body is named once)."""
        key = options + "|" + body
        if key not in self._names:
            name = f"{prefix}{self._count}"
            self._count += 1
            self._rules.append(f"{name}{options}: {body}")
            self._names[key] = name
        return self._names[key]

    def named(self, name: str, body: str) -> str:
        """A rule with a fixed name (for recursive rules); defined once."""
        if name not in self._names.values():
            self._rules.append(f"{name}: {body}")
            self._names["=" + name] = name
        return name

    def lit(self, text: str) -> str:
        """`text` exactly: special tokens inside it as token references."""
        parts: list[str] = []
        i, plain = 0, ""
        while i < len(text):
            token = next((s for s in sorted(self._special, key=len, reverse=True)
                          if text.startswith(s, i)), None)
            if token is None:
                plain += text[i]
                i += 1
                continue
            if plain:
                parts.append(json.dumps(plain, ensure_ascii=False))
                plain = ""
            parts.append(f"<[{self._special[token]}]>")
            i += len(token)
        if plain:
            parts.append(json.dumps(plain, ensure_ascii=False))
        return " ".join(parts) if len(parts) < 2 else "(" + " ".join(parts) + ")"

    def is_special(self, text: str) -> bool:
        return text in self._special

    def json(self, schema: Mapping[str, Any]) -> str:
        """A rule matching JSON valid under `schema` (whitespace bounded, see above)."""
        body = dict(schema)
        body.setdefault("x-guidance", _JSON_WHITESPACE)
        return self.rule("%json " + json.dumps(body, ensure_ascii=False, sort_keys=False),
                         prefix="j")

    def until(self, end: str) -> str:
        """Any text, then `end` (the first `end` ends it)."""
        if self.is_special(end):
            return self.rule("/(?s:.*)/", prefix="t") + " " + self.lit(end)
        return self.rule(f"/(?s:.*){regex_escape(end)}/", prefix="u", options="[lazy]")

    def choice(self, alternatives: Sequence[str]) -> str:
        return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"

    def repeat(self, item: str, parallel: bool, separator: str = "") -> str:
        """One `item`, or (parallel) one or more with `separator` between them."""
        if not parallel:
            return item
        return f"{item} ({separator + ' ' if separator else ''}{item})*"

    def members(self, items: Sequence[tuple[str, bool]], comma: str) -> str:
        """`items` (expression, required) in order, optional ones may be left out, `comma`
        between those present: the shape of a call's argument list."""
        follow: dict[bool, str] = {False: "", True: ""}  # the rest, after a member or not
        for expression, required in reversed(items):
            after_member = follow[True]
            new = {}
            for needs_comma in (False, True):
                lead = f"{comma} " if needs_comma and comma else ""
                present = f"{lead}{expression} {after_member}".strip()
                body = present if required else (
                    f"({present})" + (f" | {follow[needs_comma]}" if follow[needs_comma] else "?"))
                new[needs_comma] = self.rule(body, prefix="m") if body else ""
            follow = new
        return follow[False]


def typed_json_kind(schema: Any) -> str:
    """How a bare value (an XML-style argument) of `schema` is written: "string" (raw
    text), "enum" (one of given strings), or "json"."""
    if not isinstance(schema, Mapping):
        return "json"
    kind = schema.get("type")
    if isinstance(schema.get("enum"), list) and schema["enum"] and all(
            isinstance(v, str) for v in schema["enum"]):
        return "enum"
    if isinstance(schema.get("const"), str):
        return "enum"
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return "string"
    return "json"


def enum_values(schema: Mapping[str, Any]) -> list[str]:
    return list(schema["enum"]) if "enum" in schema else [schema["const"]]
