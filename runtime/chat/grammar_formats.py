"""Each family's tool-call syntax as a Lark grammar region (the calls, from the call
marker on), with every function's arguments held to its `parameters` schema.

Formats whose arguments are one JSON object get it as an inline `%json` schema (a
function's own `$defs` and `$ref`s moved so they still resolve when several functions
share one schema). Formats that write each argument on its own (Qwen3-Coder, GLM, MiniMax,
Gemma, LFM2) get one rule per parameter, in the schema's order: strings as free text up to
the closing marker, other types as JSON (or the format's own literals), required ones
mandatory, optional ones optional. The parse side is runtime.chat.call_syntax; the tests
check that the parser reads back what each grammar lets through.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.chat.lark import Lark, enum_values, typed_json_kind


@dataclass(frozen=True)
class Function:
    """A tool, checked: its name and its `parameters` JSON Schema (an object schema)."""

    name: str
    parameters: dict[str, Any]


Region = Callable[[Lark, Sequence[Function], bool], str]


@dataclass(frozen=True)
class Format:
    """trigger: the text that starts a call (where a lazy grammar engages; the region
    begins with it). region(g, functions, parallel): the calls. markers: texts that may be
    special tokens. parallel: whether the format can hold more than one call."""

    trigger: str
    region: Region
    markers: tuple[str, ...]
    parallel: bool = True


# --- helpers --------------------------------------------------------------------------------


def _ws(g: Lark) -> str:
    return g.rule("/[ \\t\\r\\n]{1,8}/", prefix="w") + "?"


def _nl(g: Lark) -> str:
    return g.lit("\n") + "?"


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _rehome(schema: Mapping[str, Any], tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`schema` moved to #/$defs/<tag> of a larger schema: its $defs/definitions become
    siblings (<tag>_d_<name>), and its $refs are rewritten to match."""
    moved = {(key, name): f"{tag}_{short}_{name}"
             for key, short in (("$defs", "d"), ("definitions", "D"))
             for name in (schema.get(key) or {})}

    def fix_ref(ref: str) -> str:
        if ref == "#":
            return f"#/$defs/{tag}"
        if not ref.startswith("#/"):
            return ref
        parts = ref[2:].split("/")
        if len(parts) >= 2 and (parts[0], _unescape(parts[1])) in moved:
            return "#/$defs/" + "/".join([_escape(moved[(parts[0], _unescape(parts[1]))]),
                                          *parts[2:]])
        return f"#/$defs/{tag}/" + ref[2:]

    def fix(node: Any) -> Any:
        if isinstance(node, Mapping):
            return {k: fix_ref(v) if k == "$ref" and isinstance(v, str) else fix(v)
                    for k, v in node.items()}
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    skip = {"$defs", "definitions", "$schema", "$id"}
    root = fix({k: v for k, v in schema.items() if k not in skip})
    extra = {new: fix(schema[key][name]) for (key, name), new in moved.items()}
    return root, extra


def _strict(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


def _calls_json(g: Lark, functions: Sequence[Function], parallel: bool | None,
                item: Callable[[Function, dict[str, Any]], dict[str, Any]]) -> str:
    """One %json for the calls: `item(function, arguments_ref)` is one call's object;
    `parallel` None: a single object, else an array (of one, or of several)."""
    defs: dict[str, Any] = {}
    alternatives = []
    for index, function in enumerate(functions):
        root, extra = _rehome(function.parameters, f"t{index}")
        defs[f"t{index}"] = root
        defs.update(extra)
        alternatives.append(item(function, {"$ref": f"#/$defs/t{index}"}))
    one = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    schema: dict[str, Any] = dict(one) if parallel is None else {
        "type": "array", "items": one, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    schema["$defs"] = defs
    return g.json(schema)


def _name_args(function: Function, ref: dict[str, Any]) -> dict[str, Any]:
    return _strict({"name": {"const": function.name}, "arguments": ref})


def _value_json(g: Lark, function: Function, schema: Any) -> str:
    """A %json for one parameter, able to resolve the function's own $defs."""
    sub = dict(schema) if isinstance(schema, Mapping) else {}
    for key in ("$defs", "definitions"):
        if key in function.parameters and key not in sub:
            sub[key] = function.parameters[key]
    return g.json(sub)


def _parameters(function: Function) -> list[tuple[str, Any, bool]]:
    """(name, schema, required) of each declared parameter, in the schema's order."""
    props = function.parameters.get("properties") or {}
    required = set(function.parameters.get("required") or [])
    return [(key, schema, key in required) for key, schema in props.items()]


def _bare_value(g: Lark, function: Function, schema: Any, close: str) -> str:
    """A bare argument value then `close`: strings free up to `close`, else JSON."""
    kind = typed_json_kind(schema)
    if kind == "string":
        return g.until(close)
    if kind == "enum":
        return g.choice([g.lit(v) for v in enum_values(schema)]) + " " + g.lit(close)
    return _value_json(g, function, schema) + " " + g.lit(close)


# --- the formats ----------------------------------------------------------------------------


def _tagged(open_: str, close: str, parallel_json: bool = False) -> Region:
    """open {"name", "arguments"} close, repeated (Hermes), or open [calls] close."""
    def region(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
        if parallel_json:
            body = _calls_json(g, functions, parallel, _name_args)
            return f"{g.lit(open_)} {body}{' ' + g.lit(close) if close else ''}"
        body = _calls_json(g, functions, None, _name_args)
        call = g.rule(f"{g.lit(open_)} {_nl(g)} {body} {_nl(g)} {g.lit(close)}", prefix="c")
        return g.repeat(call, parallel, _ws(g))
    return region


def _llama3(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    return _calls_json(g, functions, None, lambda f, ref: _strict(
        {"name": {"const": f.name}, "parameters": ref}))


def _mistral_nemo(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    def item(f: Function, ref: dict[str, Any]) -> dict[str, Any]:
        return _strict({"name": {"const": f.name}, "arguments": ref,
                        "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}})
    return g.lit("[TOOL_CALLS]") + " " + _calls_json(g, functions, parallel, item)


def _named(g: Lark, functions: Sequence[Function],
           one: Callable[[Function, str], str]) -> str:
    """A choice of the functions, `one(function, its arguments %json)` each."""
    return g.choice([g.rule(one(f, g.json(f.parameters)), prefix="f") for f in functions])


def _mistral(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    call_id = g.rule("/[a-zA-Z0-9]{9}/", prefix="i")
    fns = _named(g, functions, lambda f, args: (
        f"{g.lit(f.name)} ({g.lit('[CALL_ID]')} {call_id})? {g.lit('[ARGS]')} {args}"))
    return g.repeat(g.rule(f"{g.lit('[TOOL_CALLS]')} {fns}", prefix="c"), parallel)


def _section(open_: str, close: str, call: Callable[[Lark, Sequence[Function]], str]) -> Region:
    def region(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
        one = g.rule(call(g, functions), prefix="c")
        return f"{g.lit(open_)} {g.repeat(one, parallel, _ws(g))} {g.lit(close)}"
    return region


def _deepseek_r1(g: Lark, functions: Sequence[Function]) -> str:
    fns = _named(g, functions, lambda f, args: (
        f"{g.lit(f.name + chr(10) + '```json' + chr(10))} {args} {g.lit(chr(10) + '```')}"))
    return f"{g.lit('<｜tool▁call▁begin｜>function<｜tool▁sep｜>')} {fns} " + g.lit(
        "<｜tool▁call▁end｜>")


def _deepseek_v3(g: Lark, functions: Sequence[Function]) -> str:
    fns = _named(g, functions, lambda f, args: f"{g.lit(f.name + '<｜tool▁sep｜>')} {args}")
    return f"{g.lit('<｜tool▁call▁begin｜>')} {fns} {g.lit('<｜tool▁call▁end｜>')}"


def _kimi(g: Lark, functions: Sequence[Function]) -> str:
    index = g.rule("/[0-9]{1,3}/", prefix="i")
    fns = _named(g, functions, lambda f, args: (
        f'{g.lit(f.name)} ":" {index} {g.lit("<|tool_call_argument_begin|>")} {args}'))
    return f'{g.lit("<|tool_call_begin|>functions.")} {fns} {g.lit("<|tool_call_end|>")}'


def _harmony(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    tail = (f'({g.lit("<|channel|>commentary")})? (" " {g.lit("<|constrain|>")}? "json")? '
            + g.lit("<|message|>"))
    fns = _named(g, functions, lambda f, args: f"{g.lit(f.name)} {tail} {args}")
    return f'{g.lit(" to=functions.")} {fns} {g.lit("<|call|>")}?'


def _command_r7b(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    def item(f: Function, ref: dict[str, Any]) -> dict[str, Any]:
        return _strict({"tool_call_id": {"type": "string", "pattern": "^[0-9]{1,3}$"},
                        "tool_name": {"const": f.name}, "parameters": ref})
    body = _calls_json(g, functions, parallel, item)
    return f'{g.lit("<|START_ACTION|>")} {body} {g.lit("<|END_ACTION|>")}'


def _apertus(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    body = _calls_json(g, functions, parallel, lambda f, ref: _strict({f.name: ref}))
    return f'{g.lit("<|tools_prefix|>")} {body} {g.lit("<|tools_suffix|>")}'


def _xml(call_open: str, call_close: str, fn_open: str, fn_close: str,
         param_open: Callable[[str, str], str], param_close: str) -> Region:
    """Calls whose arguments are tagged one by one; `fn_open` has {name}, `param_open(key,
    kind)` gives a parameter's opening text (kind: "string", "enum" or "json")."""
    def region(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
        def one(f: Function) -> str:
            params = _parameters(f)
            parts = []
            for key, schema, required in params:
                kind = typed_json_kind(schema)
                value = _bare_value(g, f, schema, param_close)
                rule = g.rule(f"{g.lit(param_open(key, kind))} {value} {_nl(g)}", prefix="p")
                parts.append(rule if required else rule + "?")
            if not params and f.parameters.get("additionalProperties", True) is not False:
                key = g.rule('/[A-Za-z0-9_.\\-]{1,64}/', prefix="k")
                opening = param_open("\x00", "string").split("\x00")
                parts.append(f"({g.lit(opening[0])} {key} {g.lit(opening[1])} "
                             f"{g.until(param_close)} {_nl(g)})*")
            head = g.lit(fn_open.format(name=f.name))
            return g.rule(f"{head} {_nl(g)} {' '.join(parts)} {g.lit(fn_close)}", prefix="f")
        fns = g.choice([one(f) for f in functions])
        call = g.rule(f"{g.lit(call_open)} {_nl(g)} {fns} {g.lit(call_close)}", prefix="c")
        return g.repeat(call, parallel, _ws(g))
    return region


def _glm(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    def one(f: Function) -> str:
        parts = []
        for key, schema, required in _parameters(f):
            value = _bare_value(g, f, schema, "</arg_value>")
            rule = g.rule(f"{g.lit('<arg_key>' + key + '</arg_key>')} {_nl(g)} "
                          f"{g.lit('<arg_value>')} {value} {_nl(g)}", prefix="p")
            parts.append(rule if required else rule + "?")
        return g.rule(f"{g.lit(f.name)} {_nl(g)} {' '.join(parts)}", prefix="f")
    fns = g.choice([one(f) for f in functions])
    call = g.rule(f"{g.lit('<tool_call>')} {fns} {g.lit('</tool_call>')}", prefix="c")
    return g.repeat(call, parallel, _ws(g))


_NUMBER = '/-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/'
_INTEGER = '/-?(0|[1-9][0-9]*)/'


def _gemma(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    quote = '<|"|>'
    string = f"{g.lit(quote)} {g.until(quote)}"
    number = g.rule(_NUMBER, prefix="n")
    value = g.named("gemma_value", f'{string} | {number} | "true" | "false" | "null" | '
                    "gemma_object | gemma_list")
    g.named("gemma_object", '"{" (gemma_member ("," gemma_member)*)? "}"')
    g.named("gemma_member", g.rule("/[A-Za-z0-9_.\\-]{1,64}/", prefix="k") + ' ":" gemma_value')
    g.named("gemma_list", '"[" (gemma_value ("," gemma_value)*)? "]"')

    def typed(schema: Any) -> str:
        kind = schema.get("type") if isinstance(schema, Mapping) else None
        if typed_json_kind(schema) == "enum":
            return g.choice([f"{g.lit(quote + v + quote)}" for v in enum_values(schema)])
        return {"string": string, "integer": g.rule(_INTEGER, prefix="n"), "number": number,
                "boolean": '("true" | "false")'}.get(kind if isinstance(kind, str) else "", value)

    def one(f: Function) -> str:
        members = g.members([(g.rule(f"{json.dumps(key + ':')} {typed(schema)}", prefix="p"), required)
                             for key, schema, required in _parameters(f)], '","')
        return g.rule(f'{g.lit(f.name)} "{{" {members} "}}"', prefix="f")
    fns = g.choice([one(f) for f in functions])
    call = g.rule(f'{g.lit("<|tool_call>call:")} {fns} {g.lit("<tool_call|>")}', prefix="c")
    return g.repeat(call, parallel)


def _lfm2(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    string = g.rule('/"([^"\\\\\\n]|\\\\.)*"/', prefix="s")

    def typed(f: Function, schema: Any) -> str:
        kind = schema.get("type") if isinstance(schema, Mapping) else None
        if typed_json_kind(schema) == "enum":
            return g.choice([g.lit('"' + v + '"') for v in enum_values(schema)])
        simple = {"string": string, "integer": g.rule(_INTEGER, prefix="n"),
                  "number": g.rule(_NUMBER, prefix="n"), "boolean": '("True" | "False")'}
        return simple.get(kind if isinstance(kind, str) else "") or _value_json(g, f, schema)

    def one(f: Function) -> str:
        members = g.members([(g.rule(f"{json.dumps(key + '=')} {typed(f, schema)}", prefix="p"), required)
                             for key, schema, required in _parameters(f)], '", "')
        return g.rule(f'{g.lit(f.name)} "(" {members} ")"', prefix="f")
    fns = g.choice([one(f) for f in functions])
    calls = g.repeat(fns, parallel, '", "')
    return f'{g.lit("<|tool_call_start|>")} "[" {calls} "]" {g.lit("<|tool_call_end|>")}'


def _functionary(g: Lark, functions: Sequence[Function], parallel: bool) -> str:
    fns = _named(g, functions, lambda f, args: f"{g.lit(f.name + '>')} {args}")
    return g.repeat(g.rule(f'{g.lit("<function=")} {fns} {g.lit("</function>")}', prefix="c"),
                    parallel)


def _dsml_param(key: str, kind: str) -> str:
    return f'<｜DSML｜parameter name="{key}" string="{"false" if kind == "json" else "true"}">'


_DEEPSEEK = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
             "<｜tool▁call▁end｜>", "<｜tool▁sep｜>")
_QWEN = ("<tool_call>", "</tool_call>")

FORMATS: dict[str, Format] = {
    "hermes": Format("<tool_call>", _tagged(*_QWEN), _QWEN),
    "qwen3_coder": Format("<tool_call>", _xml(
        "<tool_call>", "</tool_call>", "<function={name}>", "</function>\n",
        lambda key, _kind: f"<parameter={key}>\n", "\n</parameter>"), _QWEN),
    "llama3": Format('{"name"', _llama3, ("<|python_tag|>",), parallel=False),
    "mistral_nemo": Format("[TOOL_CALLS]", _mistral_nemo, ("[TOOL_CALLS]",)),
    "mistral": Format("[TOOL_CALLS]", _mistral, ("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]")),
    "deepseek_r1": Format(_DEEPSEEK[0], _section(_DEEPSEEK[0], _DEEPSEEK[1], _deepseek_r1),
                          _DEEPSEEK),
    "deepseek_v3_1": Format(_DEEPSEEK[0], _section(_DEEPSEEK[0], _DEEPSEEK[1], _deepseek_v3),
                            _DEEPSEEK),
    "deepseek_v3_2": Format("<｜DSML｜function_calls>", _xml(
        "<｜DSML｜function_calls>", "</｜DSML｜function_calls>", '<｜DSML｜invoke name="{name}">',
        "</｜DSML｜invoke>\n", _dsml_param, "</｜DSML｜parameter>"), ()),
    "gpt_oss": Format(" to=functions.", _harmony, (
        "<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>", "<|call|>"),
        parallel=False),
    "command_r7b": Format("<|START_ACTION|>", _command_r7b,
                          ("<|START_ACTION|>", "<|END_ACTION|>")),
    "granite": Format("<|tool_call|>", _tagged("<|tool_call|>", "", parallel_json=True),
                      ("<|tool_call|>",)),
    "gemma4": Format("<|tool_call>", _gemma, ("<|tool_call>", "<tool_call|>", '<|"|>')),
    "glm45": Format("<tool_call>", _glm, (*_QWEN, "<arg_key>", "</arg_key>", "<arg_value>",
                                          "</arg_value>")),
    "kimi_k2": Format("<|tool_calls_section_begin|>", _section(
        "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", _kimi), (
        "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>")),
    "functionary_v3_1": Format("<function=", _functionary, ()),
    "firefunction_v2": Format("functools[", _tagged("functools", "", parallel_json=True), ()),
    "nemotron_v2": Format("<TOOLCALL>", _tagged("<TOOLCALL>", "</TOOLCALL>", parallel_json=True),
                          ("<TOOLCALL>", "</TOOLCALL>")),
    "apertus": Format("<|tools_prefix|>", _apertus, ("<|tools_prefix|>", "<|tools_suffix|>")),
    "phi4": Format("<|tool_call|>", _tagged("<|tool_call|>", "<|/tool_call|>", parallel_json=True),
                   ("<|tool_call|>", "<|/tool_call|>")),
    "lfm2": Format("<|tool_call_start|>", _lfm2, ("<|tool_call_start|>", "<|tool_call_end|>")),
    "seed_oss": Format("<seed:tool_call>", _xml(
        "<seed:tool_call>", "</seed:tool_call>", "<function={name}>", "</function>\n",
        lambda key, _kind: f"<parameter={key}>", "</parameter>"),
        ("<seed:tool_call>", "</seed:tool_call>")),
    "minimax_m2": Format("<minimax:tool_call>", _xml(
        "<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="{name}">', "</invoke>\n",
        lambda key, _kind: f'<parameter name="{key}">', "</parameter>"),
        ("<minimax:tool_call>", "</minimax:tool_call>")),
}
