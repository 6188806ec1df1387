"""Grammars that make a model call tools in its family's own syntax (llguidance Lark).

    >>> from runtime.chat.families import Family
    >>> tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    ...     "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    >>> spec = tool_constraint(Family("hermes", tools=True, reasoning="none"), tools, "auto", False)
    >>> spec.kind, spec.trigger
    ('lark', '<tool_call>')
    >>> tool_constraint(Family("hermes", tools=True, reasoning="none"), tools, "none", False) is None
    True

`choice`: "auto" lets the model write what it likes until it writes the family's call
marker (`trigger`); from there the call must be well formed, its name one of the tools and
its arguments valid under the function's `parameters` schema. "required" forces one call
(several when `parallel`) of any tool from the first token, after the model's thinking if
it thinks (`in_reasoning`: the prompt already opened the thinking block); a function's name
forces a call of that one. "none": no grammar.

`special_tokens` (marker text → token id, from the model's vocabulary) makes the grammar
ask for markers such as <tool_call> or <|channel|> as the single tokens the model was
trained to write (`call_markers(family)` lists the texts to look up).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import SchemaError, validators
from llguidance import LLMatcher

from runtime.chat import grammar_formats as formats
from runtime.chat.families import Family
from runtime.chat.grammar_formats import Function
from runtime.chat.lark import Lark
from runtime.errors import ToolsError, shown
from runtime.events import ConstraintSpec

__all__ = ["Function", "call_markers", "parse_tools", "tool_constraint"]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class _Prefix:
    """What may come before the calls when they are forced from the reply's start."""

    family: Family
    in_reasoning: bool

    def build(self, g: Lark) -> str:
        ws = g.rule("/[ \\t\\r\\n]{1,8}/", prefix="w") + "?"
        if self.family.reasoning == "harmony":
            end = g.until("<|end|>") + " " + g.lit("<|start|>assistant")
            thinking = end if self.in_reasoning else (
                "(" + g.lit("<|channel|>analysis<|message|>") + " " + end + ")?")
            return thinking + " " + g.lit("<|channel|>commentary")
        if self.family.reasoning != "think" or not self.family.think_end:
            return ws
        body = g.until(self.family.think_end)
        if self.in_reasoning:
            return f"{body} {ws}"
        return f"({g.lit(self.family.think_start)} {body})? {ws}"


def parse_tools(tools: Sequence[Any]) -> list[Function]:
    """The request's tools (OpenAI's {"type": "function", "function": {...}}), checked.
    Raises ToolsError with a one-line message for the first bad one."""
    functions: list[Function] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ToolsError(f"tools[{index}] is not an object")
        if tool.get("type", "function") != "function":
            raise ToolsError(f"tools[{index}] has type {shown(tool.get('type'))!r}; "
                             "only 'function' tools are supported")
        function = tool.get("function", tool)
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ToolsError(f"tools[{index}] has no function name")
        if not _NAME.match(name):
            raise ToolsError(f"tool name {shown(name)!r} must be 1-64 letters, digits, "
                             "'_', '-' or '.'")
        if any(f.name == name for f in functions):
            raise ToolsError(f"two tools are named {name!r}")
        params = function.get("parameters")
        if params is None:
            params = _NO_PARAMETERS
        if not isinstance(params, Mapping):
            raise ToolsError(f"tool {name!r}: parameters must be a JSON Schema object")
        try:
            validators.validator_for(params).check_schema(params)
        except SchemaError as error:
            where = "/".join(str(p) for p in error.absolute_path)
            raise ToolsError(f"tool {name!r}: parameters are not a valid JSON Schema "
                             f"({shown(error.message)}{' at /' + where if where else ''})") from None
        if params.get("type", "object") != "object":
            raise ToolsError(f"tool {name!r}: parameters must be a schema of type 'object'")
        functions.append(Function(name, _known_formats(params)))
    return functions


# The string formats llguidance enforces; any other `format` is only an annotation (as JSON
# Schema 2020-12 has it) and is left out of the grammar instead of failing the request.
_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4",
                      "ipv6", "uuid", "uri"})


_DATA = frozenset({"const", "enum", "default", "examples"})  # values, not schemas


def _known_formats(schema: Any) -> Any:
    if isinstance(schema, Mapping):
        return {k: v if k in _DATA else _known_formats(v) for k, v in schema.items()
                if not (k == "format" and isinstance(v, str) and v not in _FORMATS)}
    if isinstance(schema, list):
        return [_known_formats(v) for v in schema]
    return schema


def call_markers(family: Family) -> tuple[str, ...]:
    """The marker texts a family's call grammar may use (to look up as special tokens)."""
    fmt = formats.FORMATS.get(family.name)
    extra = (family.think_start, family.think_end) if family.reasoning != "none" else ()
    return tuple(dict.fromkeys((*(fmt.markers if fmt else ()), *extra)))


def tool_constraint(family: Family, tools: Sequence[Any], choice: Any, parallel: bool, *,
                    in_reasoning: bool = False,
                    special_tokens: Mapping[str, int] | None = None) -> ConstraintSpec | None:
    """The grammar for `choice` ("auto", "none", "required", a function's name — or
    OpenAI's {"type": "function", "function": {"name": ...}}); None for "none" or for
    "auto" without tools. Raises ToolsError."""
    functions = parse_tools(tools)
    wanted = _choice_name(choice)
    if wanted == "none":
        return None
    fmt = formats.FORMATS.get(family.name)
    if not family.tools or fmt is None:
        raise ToolsError(f"this model's chat template ({family.name}) has no tool-call "
                         "format Outrider can read; send the request without tools")
    if not functions:
        if wanted == "auto":
            return None
        raise ToolsError(f"tool_choice {wanted!r} needs at least one tool")
    if wanted not in ("auto", "required"):
        chosen = [f for f in functions if f.name == wanted]
        if not chosen:
            names = ", ".join(f.name for f in functions)
            raise ToolsError(f"tool_choice names {shown(wanted)!r}, which is not among the "
                             f"tools ({names})")
        functions = chosen
    g = Lark(special_tokens)
    calls = fmt.region(g, functions, parallel and fmt.parallel)
    if wanted == "auto":
        g.start(calls)
    else:
        g.start(_Prefix(family, in_reasoning).build(g) + " " + calls)
    source = g.text()
    _check_compiles(source, functions)
    if wanted != "auto":
        return ConstraintSpec("lark", source)
    # A reply that starts inside the thinking block may name the call marker while it thinks:
    # the trigger counts only once the thinking has ended.
    armed_after = family.think_end if in_reasoning and family.reasoning == "think" else None
    return ConstraintSpec("lark", source, trigger=fmt.trigger, armed_after=armed_after)


def _choice_name(choice: Any) -> str:
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str):
            raise ToolsError('tool_choice must be "auto", "none", "required" or '
                             '{"type": "function", "function": {"name": ...}}')
        return name
    if not isinstance(choice, str) or not choice:
        raise ToolsError('tool_choice must be "auto", "none", "required" or a function name')
    return choice


def _check_compiles(source: str, functions: Sequence[Function]) -> None:
    """The grammar compiles (tokenizer-free); a schema llguidance cannot take is named."""
    error = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(source))
    if not error:
        return
    for function in functions:
        alone = LLMatcher.grammar_from_json_schema(json.dumps(function.parameters))
        problem = LLMatcher.validate_grammar(alone)
        if problem:
            raise ToolsError(f"tool {function.name!r}: its parameters schema is not supported "
                             f"for tool calls ({_first_line(problem)})")
    raise ToolsError(f"the tool-call grammar does not compile ({_first_line(error)})")


def _first_line(message: str) -> str:
    return shown(message.strip().splitlines()[0] if message.strip() else message)
