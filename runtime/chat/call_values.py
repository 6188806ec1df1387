"""The values inside tool calls: JSON call objects, arguments, typed XML values, Gemma's
and Python's call notations. Everything raises `BadCall` (a one-line reason) on bad input.

    >>> json_calls({"name": "f", "arguments": '{"x": 1}'})
    (Call(name='f', arguments={'x': 1}, id=None),)
    >>> typed_value("42", frozenset({"integer"})), typed_value("42", frozenset({"string"}))
    (42, '42')
    >>> gemma_object('{city:<|"|>Paris<|"|>,days:[1,2],metric:true}')
    {'city': 'Paris', 'days': [1, 2], 'metric': True}
    >>> pythonic_calls('[get_weather(city="Paris"), brave_search.call(query="x")]')[1].name
    'brave_search'
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# function name -> parameter name -> the JSON types its schema allows
ParamTypes = Mapping[str, Mapping[str, frozenset[str]]]


class BadCall(Exception):
    """A tool call that cannot be read; str() is the one-line reason."""


@dataclass(frozen=True)
class Call:
    """One call as read: `arguments` is the parsed arguments object, `id` the model's own."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None


def loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
        raise BadCall(f"the tool call is not valid JSON ({reason})") from None


def object_arguments(value: Any) -> dict[str, Any]:
    """Arguments as an object: a JSON text holding one is read; none at all is {}."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = loads(value)
    if not isinstance(value, dict):
        raise BadCall("the arguments of a tool call are not a JSON object")
    return value


def json_calls(value: Any, *, name: str = "name", arguments: str = "arguments",
               id: str = "id") -> tuple[Call, ...]:
    """Calls from a JSON object or a list of them; `arguments` also accepts "parameters"
    (Llama 3), and OpenAI's own {"type": "function", "function": {...}} shape is read too."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise BadCall("the tool call list is empty")
    calls = []
    for item in items:
        if not isinstance(item, dict):
            raise BadCall("a tool call is not a JSON object")
        if name not in item and isinstance(item.get("function"), dict):
            item = {**item["function"], id: item.get(id)}
        call_name = item.get(name)
        if not isinstance(call_name, str) or not call_name.strip():
            raise BadCall("a tool call has no function name")
        raw = next((item[key] for key in (arguments, "arguments", "parameters") if key in item),
                   None)
        call_id = item.get(id)
        calls.append(Call(call_name.strip(), object_arguments(raw),
                          str(call_id) if isinstance(call_id, (str, int)) and call_id != ""
                          else None))
    return tuple(calls)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def typed_value(text: str, types: frozenset[str] | None) -> Any:
    """A value written bare (XML-style calls): the string itself where the schema wants a
    string, else its JSON reading when that fits the schema (any JSON when no schema)."""
    if types and types <= {"string"}:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    kind = _json_type(value)
    if types is None or kind in types or (kind == "integer" and "number" in types):
        return value
    return text if "string" in types else value


def _schema_types(schema: Any) -> frozenset[str] | None:
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return frozenset({kind})
    if isinstance(kind, list):
        return frozenset(k for k in kind if isinstance(k, str))
    if "enum" in schema and isinstance(schema["enum"], list):
        return frozenset(_json_type(v) for v in schema["enum"] if _json_safe(v))
    if "const" in schema and _json_safe(schema["const"]):
        return frozenset({_json_type(schema["const"])})
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            parts = [_schema_types(s) for s in schema[key]]
            if all(p is not None for p in parts):
                return frozenset().union(*[p for p in parts if p is not None])
    return None


def _json_safe(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, list, dict)) or value is None


def param_types(tools: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, frozenset[str]]]:
    """From OpenAI tools, the JSON types each function's parameters allow (where known)."""
    out: dict[str, dict[str, frozenset[str]]] = {}
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else {}
        name = function.get("name") if isinstance(function, Mapping) else None
        params = function.get("parameters") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not isinstance(params, Mapping):
            continue
        props = params.get("properties")
        if isinstance(props, Mapping):
            known = {key: _schema_types(schema) for key, schema in props.items()}
            out[name] = {key: types for key, types in known.items() if types is not None}
    return out


# --- Gemma 4: {key:<|"|>text<|"|>,n:1,ok:true,list:[...]} --------------------------------------

_QUOTE = '<|"|>'
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WORDS = {"true": True, "false": False, "null": None}


def gemma_object(text: str) -> dict[str, Any]:
    value, end = _gemma_value(text, 0)
    if not isinstance(value, dict) or text[end:].strip():
        raise BadCall("a Gemma tool call's arguments are not one {...} object")
    return value


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _gemma_value(text: str, i: int) -> tuple[Any, int]:
    i = _skip(text, i)
    if text.startswith(_QUOTE, i):
        close = text.find(_QUOTE, i + len(_QUOTE))
        if close < 0:
            raise BadCall("a Gemma string is not closed")
        return text[i + len(_QUOTE):close], close + len(_QUOTE)
    if i >= len(text):
        raise BadCall("a Gemma tool call ends inside a value")
    if text[i] in "{[":
        return _gemma_container(text, i)
    for word, value in _WORDS.items():
        if text.startswith(word, i):
            return value, i + len(word)
    number = _NUMBER.match(text, i)
    if number:
        return json.loads(number.group()), number.end()
    raise BadCall(f"a Gemma tool call holds an unreadable value at {text[i:i + 12]!r}")


def _gemma_container(text: str, i: int) -> tuple[Any, int]:
    is_dict = text[i] == "{"
    close = "}" if is_dict else "]"
    items: dict[str, Any] | list[Any] = {} if is_dict else []
    i = _skip(text, i + 1)
    if text.startswith(close, i):
        return items, i + 1
    while True:
        if isinstance(items, dict):
            colon = text.find(":", i)
            if colon < 0:
                raise BadCall("a Gemma object key has no ':'")
            key = text[i:colon].strip().removeprefix(_QUOTE).removesuffix(_QUOTE)
            items[key], i = _gemma_value(text, colon + 1)
        else:
            value, i = _gemma_value(text, i)
            items.append(value)
        i = _skip(text, i)
        if text.startswith(",", i):
            i = _skip(text, i + 1)
        elif text.startswith(close, i):
            return items, i + 1
        else:
            raise BadCall(f"a Gemma {'object' if is_dict else 'list'} is not closed")


# --- Python call notation: [name(key="value"), ...] (LFM2, Llama 3's built-in tools) ----------


def pythonic_calls(text: str) -> tuple[Call, ...]:
    try:
        with warnings.catch_warnings():  # a model's "\d" in a string is not our warning
            warnings.simplefilter("ignore")
            node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        raise BadCall("the tool call is not a Python-style call list") from None
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    calls = []
    for item in items:
        if not isinstance(item, ast.Call) or item.args:
            raise BadCall("a Python-style tool call must be name(key=value, ...)")
        name = ast.unparse(item.func).removesuffix(".call")
        arguments = {kw.arg: _literal(kw.value) for kw in item.keywords if kw.arg is not None}
        calls.append(Call(name, arguments))
    if not calls:
        raise BadCall("the tool call list is empty")
    return tuple(calls)


_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False,
          "None": None}


def _literal(node: ast.expr) -> Any:
    """A Python literal, where JSON's true/false/null are also accepted (LFM2 writes them)."""
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(v) for v in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise BadCall("a Python-style tool call's arguments are not literals")
        return {_literal(k): _literal(v)  # type: ignore[arg-type]
                for k, v in zip(node.keys, node.values, strict=True)}
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise BadCall("a Python-style tool call's arguments are not literals") from None
