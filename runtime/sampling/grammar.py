"""From a `ConstraintSpec` to llguidance's grammar text, and why a spec is refused.

`check_spec` is the tokenizer-free check the server runs before the engine sees a request;
`runtime.sampling.constraint` compiles the same grammar for a model's vocabulary. Every
refusal is one line that names what is wrong and where (a JSON pointer into the schema):

    >>> check_spec(ConstraintSpec("json_schema", '{"type": "object", "properties":'
    ...                                          ' {"tags": {"type": "array", "uniqueItems": true}}}'))
    Traceback (most recent call last):
    runtime.errors.ConstraintError: unsupported keyword 'uniqueItems' at /properties/tags
    >>> check_spec(ConstraintSpec("lark", 'start: "x" start'))
    Traceback (most recent call last):
    runtime.errors.ConstraintError: the grammar cannot end: it forces the same text on forever, ...

JSON Schema choices: whitespace between tokens is bounded the way llama.cpp's
json-schema-to-grammar bounds it (one space, or one or two newlines and up to 20 spaces or
tabs of indentation), so a model cannot fill its answer with blank space; keywords llguidance
does not implement are refused (never ignored), whatever the schema's own `x-guidance` says.
`oneOf` works where its branches cannot overlap (different types); otherwise it is refused,
since reading it as `anyOf` could let through a document that matches two branches.

Objects are closed where the schema leaves them open: an object schema with `properties` and
no `additionalProperties` (nor `patternProperties`, `unevaluatedProperties`, `$ref`) gets
`additionalProperties: false`, as llama.cpp's json-schema-to-grammar and OpenAI's strict mode
do. Every document this allows is valid under the schema as sent; what it removes is a small
model's habit of adding keys of its own until max_tokens (JSONSchemaBench: 5 of 6 schemas where
llama-server stopped and Outrider ran on). A schema with `allOf` anywhere is left as it is,
since closing one branch would refuse the properties another branch adds.

    >>> _closed({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}})
    {'type': 'object', 'properties': {'a': {'type': 'object', 'properties': {}, 'additionalProperties': False}}, 'additionalProperties': False}

A grammar that forces text without end (`start: "x" start`, `root ::= "x" root`) is refused
("the grammar cannot end: ..."). One that only may go on forever (`start: ("x" | "y") start`:
no derivation ends, but none is forced) is accepted, as llguidance accepts it; its reply runs
to max_tokens and finishes with "length", since the mask never allows the end of the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

from runtime.errors import ConstraintError
from runtime.events import ConstraintSpec

_MESSAGE_LIMIT = 300

# llama.cpp's SPACE_RULE: "" | " " | "\n"{1,2} [ \t]{0,20}
_JSON_DEFAULTS: dict[str, Any] = {"whitespace_pattern": r"(?:\x20|\x0A{1,2}[\x20\x09]{0,20})?"}
_JSON_OVERRIDES: dict[str, Any] = {"lenient": False}

# Keywords whose value is a map from names to subschemas, and those whose value is data.
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                        "dependentSchemas", "dependencies"})
_DATA = frozenset({"enum", "const", "default", "examples", "required", "x-guidance"})


def check_spec(spec: ConstraintSpec) -> None:
    """Raise ConstraintError when `spec` cannot be compiled (no model's tokenizer needed: a
    grammar that forces text forever is found with a byte-level one)."""
    grammar = grammar_of(spec)
    message = llguidance.LLMatcher.validate_grammar(grammar)
    if message:
        raise ConstraintError(explain(spec, message))
    bytewise = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))
    matcher = llguidance.LLMatcher(bytewise, grammar, log_level=0)
    if matcher.is_error():
        if "unknown special token" in matcher.get_error():
            return  # it names a model's special token (<|im_end|>): checked at compile time
        raise ConstraintError(explain(spec, matcher.get_error()))
    check_forced(matcher)


class _ByteTokenizer:
    """256 byte tokens and an end token: enough for llguidance to run a grammar."""

    def __init__(self) -> None:
        self.tokens = [bytes([b]) for b in range(256)] + [b"\xff<end>"]
        self.eos_token_id = 256
        self.bos_token_id = None
        self.special_token_ids = [256]

    def __call__(self, data: bytes | str) -> list[int]:
        return list(data.encode("utf-8") if isinstance(data, str) else data)


def check_forced(matcher: llguidance.LLMatcher) -> None:
    """A grammar whose start forces text without end (`start: "x" start`) has llguidance's
    parser run out of items on its first token: find it now, not mid-reply. (A grammar that
    may go on forever without forcing it, `start: ("x" | "y") start`, is fine to run: the
    end is never allowed and the reply finishes with "length".)"""
    forced = matcher.compute_ff_tokens()
    if not forced:
        return
    probe = matcher.deep_copy()
    if probe.try_consume_tokens(forced[:1]) != 1 or probe.is_error():
        raise ConstraintError(matcher_error(probe.get_error()))


def matcher_error(text: str) -> str:
    """A matcher's error (a first line, then a dump of its state) as one line."""
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    if "Too many items" in first:
        return ("the grammar cannot end: it forces the same text on forever, or a text too "
                "long to follow")
    return one_line(f"the grammar failed: {first}")


def grammar_of(spec: ConstraintSpec) -> str:
    """llguidance's grammar text for a spec (not yet validated)."""
    if spec.trigger is not None and not spec.trigger:
        raise ConstraintError("a lazy constraint's trigger cannot be empty")
    kind = spec.kind
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(
            '{"type": "object"}', defaults=_JSON_DEFAULTS, overrides=_JSON_OVERRIDES)  # type: ignore[arg-type]
    if kind == "json_schema":
        schema = _closed(_parse_schema(spec.source))
        return llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults=_JSON_DEFAULTS, overrides=_JSON_OVERRIDES)  # type: ignore[arg-type]
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.source)
    if kind == "gbnf":
        try:
            lark = gbnf_to_lark(spec.source)
        except Exception as exc:  # GbnfToLarkError, and whatever its parser trips on
            raise ConstraintError(one_line(f"the GBNF grammar does not parse: {exc}")) from None
        return llguidance.LLMatcher.grammar_from_lark(lark)
    if kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(spec.source)
    raise ConstraintError(f"unknown constraint kind {kind!r} (json_schema, json_object, regex, "
                          f"gbnf, lark)")


_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "$ref")


def _closed(schema: Any) -> Any:
    """`schema` with its open objects closed (see the module docstring); a copy."""
    if _find_keyword(schema, ("allOf",)) is not None:
        return schema

    def close(node: Any) -> Any:
        if isinstance(node, list):
            return [close(item) for item in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _NAME_MAPS and isinstance(value, dict):  # names → schemas, not a schema
                out[key] = {name: close(sub) for name, sub in value.items()}
            elif key in _DATA:  # data, not schemas
                out[key] = value
            else:
                out[key] = close(value)
        if isinstance(out.get("properties"), dict) and not any(k in out for k in _OPEN_KEYS):
            out["additionalProperties"] = False
        return out

    return close(schema)


def _parse_schema(source: str) -> Any:
    try:
        schema = json.loads(source)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"the JSON schema is not valid JSON: {exc.msg} at line "
                              f"{exc.lineno} column {exc.colno}") from None
    if schema is True:
        return {}
    if schema is False:
        raise ConstraintError("the JSON schema `false` allows no value at all")
    if not isinstance(schema, dict):
        raise ConstraintError("a JSON schema must be an object (or true/false), not "
                              f"{type(schema).__name__}")
    return schema


def explain(spec: ConstraintSpec, message: str) -> str:
    """llguidance's message as one line, with the JSON-pointer path where one can be found."""
    if spec.kind not in ("json_schema", "json_object"):
        what = {"regex": "the regular expression", "gbnf": "the GBNF grammar",
                "lark": "the Lark grammar"}[spec.kind]
        return one_line(f"{what} cannot be compiled: {message}")
    schema = json.loads(spec.source) if spec.kind == "json_schema" else {}
    first = message.strip().splitlines()[0] if message.strip() else message
    unimplemented = re.match(r"Unimplemented keys: (\[.*\])", first)
    if unimplemented:
        keys = [str(k) for k in json.loads(unimplemented.group(1))]
        where = _find_keyword(schema, keys)
        listed = ", ".join(f"'{k}'" for k in keys)
        noun = "keyword" if len(keys) == 1 else "keywords"
        return f"unsupported {noun} {listed}{_at(where)}"
    if first.startswith("oneOf constraints are not supported"):
        where = _find_keyword(schema, ["oneOf"])
        return (f"unsupported keyword 'oneOf'{_at(where)}: its branches may overlap "
                f"(anyOf, or branches of different types, are supported)")
    unknown_format = re.match(r"Unknown format: (.*)", first)
    if unknown_format:
        name = unknown_format.group(1).strip()
        where = _find_value(schema, "format", name)
        return f"unsupported format '{name}'{_at(where)}"
    if first.startswith("regex parse error"):
        lines = [line.strip() for line in message.strip().splitlines()]
        pattern = lines[1] if len(lines) > 1 else ""
        where = _find_value(schema, "pattern", pattern)
        return one_line(f"the pattern {pattern!r}{_at(where)} is not a valid regular "
                         f"expression: {lines[-1].removeprefix('error: ')}")
    bad_type = re.match(r"Invalid type: (.*)", first)
    if bad_type:
        where = _find_value(schema, "type", bad_type.group(1).strip())
        return f"invalid type '{bad_type.group(1).strip()}'{_at(where)}"
    return one_line(f"the JSON schema cannot be compiled: {message}")


def _at(pointer: str | None) -> str:
    if pointer is None:
        return ""
    return f" at {pointer}" if pointer else " at the top level"


def _subschemas(node: Any, pointer: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in a schema, depth first, with its JSON pointer."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _subschemas(item, f"{pointer}/{i}")
        return
    if not isinstance(node, dict):
        return
    yield pointer, node
    for key, value in node.items():
        here = f"{pointer}/{_escape(key)}"
        if key in _DATA:
            continue
        if key in _NAME_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield from _subschemas(sub, f"{here}/{_escape(name)}")
        else:
            yield from _subschemas(value, here)


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _find_keyword(schema: Any, keys: Sequence[str]) -> str | None:
    for pointer, node in _subschemas(schema):
        if any(k in node for k in keys):
            return pointer
    return None


def _find_value(schema: Any, key: str, value: str) -> str | None:
    for pointer, node in _subschemas(schema):
        found = node.get(key)
        if found == value or (isinstance(found, list) and value in found):
            return f"{pointer}/{key}"
    return None


def one_line(text: str) -> str:
    line = " ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return line if len(line) <= _MESSAGE_LIMIT else line[:_MESSAGE_LIMIT - 1] + "…"
