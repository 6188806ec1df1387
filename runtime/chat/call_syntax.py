"""How each family writes its tool calls, for reading them back out of a reply.

A family's `CallSyntax` names the markers that open a call in the answer text and makes a
`Reader` for one call block. The reply parser (runtime.chat.reply) finds an opener, then
feeds the reader the text from the opener on, as it streams in, until the reader says
where the block ends and what it held:

    >>> syntax = FORMATS["hermes"]
    >>> reader = syntax.reader("<tool_call>", {})
    >>> reader.read('<tool_call>\\n{"name": "f", "arguments": {"x": 1}}', final=False) is None
    True
    >>> reader.read('<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>!', final=False)
    Outcome(end=61, calls=(Call(name='f', arguments={'x': 1}, id=None),), malformed=None, not_a_call=False)

A reader's answer depends only on the text it was shown, and once it answers, more text
would not change the answer: that is what makes the streamed parse equal the whole one.
Calls whose arguments are written as separate values (Qwen3-Coder, GLM, MiniMax) get each
value typed by the function's parameters schema when the caller knows it (`ParamTypes`),
else by whether it reads as JSON.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runtime.chat.call_readers import (
    Body,
    Closed,
    JsonAfter,
    Llama3Json,
    Mistral,
    Outcome,
    PythonTag,
    Reader,
)
from runtime.chat.call_values import (
    BadCall,
    Call,
    ParamTypes,
    gemma_object,
    json_calls,
    loads,
    object_arguments,
    pythonic_calls,
    typed_value,
)

__all__ = ["FORMATS", "WRAPPERS", "BadCall", "Call", "CallSyntax", "Outcome", "ParamTypes",
           "Reader", "Section"]


@dataclass(frozen=True)
class Section:
    """A wrapper around a reply's calls (DeepSeek, Kimi): `open` call* `close`."""

    open: str
    close: str
    call_open: str


@dataclass(frozen=True)
class CallSyntax:
    """opens: markers that start a call (or its section) anywhere in the answer.
    reader(opener, types): a fresh reader for the block that `opener` starts.
    at_segment_start: a text that starts a call only where the answer (re)starts, after
    whitespace (Llama 3's bare JSON object). strays: closing markers left alone, dropped.
    ends_reasoning: an opener also closes a thinking block the model left open (Qwen3.5)."""

    opens: tuple[str, ...]
    reader: Callable[[str, ParamTypes], Reader]
    section: Section | None = None
    at_segment_start: str = ""
    strays: tuple[str, ...] = ()
    ends_reasoning: bool = False


# --- bodies of the closed formats ---------------------------------------------------------

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.S)
_INVOKE_PARAM = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.S)
_DSML = "｜DSML｜"
_DSML_INVOKE = re.compile(rf'<{_DSML}invoke name="([^"]+)">(.*?)</{_DSML}invoke>', re.S)
_DSML_PARAM = re.compile(
    rf'<{_DSML}parameter name="([^"]+)"(?: string="(true|false)")?>(.*?)</{_DSML}parameter>', re.S)
_FENCED = re.compile(r"\s*```(?:json)?\s*\n(.*?)\n?\s*```\s*$", re.S)


def _only_matches(pattern: re.Pattern[str], text: str, what: str) -> list[re.Match[str]]:
    """Every match of `pattern` in `text`, which must hold nothing else but whitespace."""
    matches = list(pattern.finditer(text))
    if not matches:
        raise BadCall(f"the tool call holds no {what}")
    if pattern.sub("", text).strip():
        raise BadCall(f"the tool call holds text outside its {what}")
    return matches


def _strip_newline(text: str) -> str:
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


def _xml_functions(types: ParamTypes) -> Body:
    """Qwen3-Coder / Seed-OSS: <function=NAME><parameter=K>\\nV\\n</parameter>...</function>."""
    def body(text: str) -> tuple[Call, ...]:
        calls = []
        for function in _only_matches(_FUNCTION, text, "<function=...> block"):
            name = function.group(1).strip()
            known = types.get(name, {})
            arguments = {key.strip(): typed_value(_strip_newline(value), known.get(key.strip()))
                         for key, value in _PARAMETER.findall(function.group(2))}
            calls.append(Call(name, arguments))
        return tuple(calls)
    return body


def _glm(types: ParamTypes) -> Body:
    """GLM 4.5+: NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>... (newlines optional)."""
    def body(text: str) -> tuple[Call, ...]:
        name, sep, rest = text.partition("<arg_key>")
        name, rest = name.strip(), sep + rest
        if not name:
            raise BadCall("a tool call has no function name")
        if rest and _GLM_ARG.sub("", rest).strip():
            raise BadCall("the tool call holds text outside its <arg_key>/<arg_value> pairs")
        known = types.get(name, {})
        arguments = {key.strip(): typed_value(value, known.get(key.strip()))
                     for key, value in _GLM_ARG.findall(rest)}
        return (Call(name, arguments),)
    return body


def _invokes(types: ParamTypes) -> Body:
    """MiniMax M2: <invoke name="NAME"><parameter name="K">V</parameter></invoke>..."""
    def body(text: str) -> tuple[Call, ...]:
        calls = []
        for invoke in _only_matches(_INVOKE, text, '<invoke name="..."> block'):
            name = invoke.group(1)
            known = types.get(name, {})
            arguments = {key: typed_value(_strip_newline(value), known.get(key))
                         for key, value in _INVOKE_PARAM.findall(invoke.group(2))}
            calls.append(Call(name, arguments))
        return tuple(calls)
    return body


def _dsml(text: str) -> tuple[Call, ...]:
    """DeepSeek V3.2: <｜DSML｜invoke name="NAME"><｜DSML｜parameter name="K" string="true|false">."""
    calls = []
    for invoke in _only_matches(_DSML_INVOKE, text, "DSML invoke block"):
        arguments: dict[str, Any] = {}
        for key, is_string, value in _DSML_PARAM.findall(invoke.group(2)):
            arguments[key] = value if is_string != "false" else loads(value)
        calls.append(Call(invoke.group(1), arguments))
    return tuple(calls)


def _deepseek(text: str) -> tuple[Call, ...]:
    """V3.1: NAME<｜tool▁sep｜>{json}; R1: function<｜tool▁sep｜>NAME\\n```json\\n{json}\\n```."""
    head, sep, rest = text.partition("<｜tool▁sep｜>")
    if not sep:
        raise BadCall("a DeepSeek tool call has no <｜tool▁sep｜>")
    if rest.lstrip().startswith("{"):
        name, arguments = head.strip(), rest
    else:
        name, _, arguments = rest.partition("\n")
        fenced = _FENCED.match(arguments)
        arguments = fenced.group(1) if fenced else arguments
    if not name.strip():
        raise BadCall("a tool call has no function name")
    return (Call(name.strip(), object_arguments(loads(arguments))),)


def _kimi(text: str) -> tuple[Call, ...]:
    """functions.NAME:INDEX<|tool_call_argument_begin|>{json}; the id is functions.NAME:INDEX."""
    head, sep, arguments = text.partition("<|tool_call_argument_begin|>")
    if not sep:
        raise BadCall("a Kimi tool call has no <|tool_call_argument_begin|>")
    call_id = head.strip()
    name = call_id.removeprefix("functions.")
    base, colon, index = name.rpartition(":")
    name = base if colon and index.isdigit() else name
    if not name:
        raise BadCall("a tool call has no function name")
    return (Call(name, object_arguments(loads(arguments)), call_id),)


def _gemma(text: str) -> tuple[Call, ...]:
    """call:NAME{key:<|"|>text<|"|>,n:1}."""
    text = text.strip()
    if not text.startswith("call:") or "{" not in text:
        raise BadCall("a Gemma tool call does not start with call:NAME{")
    name = text[5:text.index("{")].strip()
    if not name:
        raise BadCall("a tool call has no function name")
    return (Call(name, gemma_object(text[text.index("{"):])),)


def _function_tag(text: str) -> tuple[Call, ...]:
    """Functionary v3.1 / Llama 3.1's custom format: <function=NAME>{json}</function>."""
    name, sep, arguments = text.partition(">")
    if not sep or not name.strip():
        raise BadCall("a <function=...> call has no function name")
    return (Call(name.strip(), object_arguments(loads(arguments))),)


def _apertus(text: str) -> tuple[Call, ...]:
    """[{"NAME": {arguments}}, ...]."""
    value = loads(text)
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or len(item) != 1:
            raise BadCall('an Apertus tool call is not {"name": {arguments}}')
        ((name, arguments),) = item.items()
        calls.append(Call(name, object_arguments(arguments)))
    if not calls:
        raise BadCall("the tool call list is empty")
    return tuple(calls)


def _json_body(**keys: str) -> Body:
    return lambda text: json_calls(loads(text), **keys)


def _closed(open_: str, close: str, body: Body) -> Callable[[str, ParamTypes], Reader]:
    return lambda _opener, _types: Closed(open_, close, body)


def _typed(open_: str, close: str, make: Callable[[ParamTypes], Body]) -> Callable[
        [str, ParamTypes], Reader]:
    return lambda _opener, types: Closed(open_, close, make(types))


def _llama3(opener: str, _types: ParamTypes) -> Reader:
    return PythonTag() if opener == PythonTag.OPEN else Llama3Json()


def _qwen3_coder(opener: str, types: ParamTypes) -> Reader:
    if opener == "<function=":  # Qwen3-Coder sometimes leaves out <tool_call>
        inner = _xml_functions(types)
        return Closed("<function=", "</function>",
                      lambda text: inner("<function=" + text + "</function>"))
    return Closed("<tool_call>", "</tool_call>", _xml_functions(types))


def _granite(opener: str, _types: ParamTypes) -> Reader:
    if opener == "<|tool_call|>":  # Granite 3.x; Granite 4 writes Hermes' <tool_call>
        return JsonAfter(opener, _json_body())
    return Closed("<tool_call>", "</tool_call>", _json_body())


def _functionary(opener: str, _types: ParamTypes) -> Reader:
    return PythonTag() if opener == PythonTag.OPEN else Closed("<function=", "</function>",
                                                               _function_tag)


_DEEPSEEK = Section("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>")
_KIMI = Section("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                "<|tool_call_begin|>")
_HERMES = _closed("<tool_call>", "</tool_call>", _json_body())

FORMATS: dict[str, CallSyntax] = {
    "hermes": CallSyntax(("<tool_call>",), _HERMES),
    "qwen3_coder": CallSyntax(("<tool_call>", "<function="), _qwen3_coder,
                              strays=("</tool_call>",), ends_reasoning=True),
    "llama3": CallSyntax((PythonTag.OPEN,), _llama3, at_segment_start="{"),
    "mistral_nemo": CallSyntax((Mistral.OPEN,), lambda _o, _t: Mistral()),
    "mistral": CallSyntax((Mistral.OPEN,), lambda _o, _t: Mistral()),
    "deepseek_r1": CallSyntax((_DEEPSEEK.open, _DEEPSEEK.call_open), _closed(
        _DEEPSEEK.call_open, "<｜tool▁call▁end｜>", _deepseek), section=_DEEPSEEK),
    "deepseek_v3_1": CallSyntax((_DEEPSEEK.open, _DEEPSEEK.call_open), _closed(
        _DEEPSEEK.call_open, "<｜tool▁call▁end｜>", _deepseek), section=_DEEPSEEK),
    "deepseek_v3_2": CallSyntax((f"<{_DSML}function_calls>",), _closed(
        f"<{_DSML}function_calls>", f"</{_DSML}function_calls>", _dsml)),
    "command_r7b": CallSyntax(("<|START_ACTION|>",), _closed(
        "<|START_ACTION|>", "<|END_ACTION|>",
        _json_body(name="tool_name", arguments="parameters", id="tool_call_id"))),
    "granite": CallSyntax(("<|tool_call|>", "<tool_call>"), _granite),
    "gemma4": CallSyntax(("<|tool_call>",), _closed("<|tool_call>", "<tool_call|>", _gemma)),
    "glm45": CallSyntax(("<tool_call>",), _typed("<tool_call>", "</tool_call>", _glm)),
    "kimi_k2": CallSyntax((_KIMI.open, _KIMI.call_open), _closed(
        _KIMI.call_open, "<|tool_call_end|>", _kimi), section=_KIMI),
    "functionary_v3_1": CallSyntax(("<function=", PythonTag.OPEN), _functionary),
    "firefunction_v2": CallSyntax(("functools[",), lambda _o, _t: JsonAfter(
        "functools[", _json_body(), json_from=len("functools"))),
    "nemotron_v2": CallSyntax(("<TOOLCALL>",), _closed("<TOOLCALL>", "</TOOLCALL>",
                                                       _json_body())),
    "apertus": CallSyntax(("<|tools_prefix|>",), _closed("<|tools_prefix|>", "<|tools_suffix|>",
                                                         _apertus)),
    "phi4": CallSyntax(("<|tool_call|>",), _closed("<|tool_call|>", "<|/tool_call|>",
                                                   _json_body())),
    "lfm2": CallSyntax(("<|tool_call_start|>",), _closed(
        "<|tool_call_start|>", "<|tool_call_end|>", pythonic_calls)),
    "seed_oss": CallSyntax(("<seed:tool_call>",), _typed(
        "<seed:tool_call>", "</seed:tool_call>", _xml_functions)),
    "minimax_m2": CallSyntax(("<minimax:tool_call>",), _typed(
        "<minimax:tool_call>", "</minimax:tool_call>", _invokes)),
}

# Markers some families wrap their answer in: not part of the answer, whatever the tools.
WRAPPERS: Mapping[str, tuple[str, ...]] = {
    "command_r7b": ("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    "granite": ("<response>", "</response>"),
}
