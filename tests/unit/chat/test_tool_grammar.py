"""tool_constraint: bad tools are one-line ToolsErrors; every family's grammar compiles with
llguidance, accepts the golden calls of test_reply, and whatever it lets a model write is
read back by ReplyParser as calls whose arguments validate against the tool's schema."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

from runtime.chat.families import Family
from runtime.chat.grammar_formats import FORMATS
from runtime.chat.reply import ReplyParser
from runtime.chat.tool_grammar import call_markers, parse_tools, tool_constraint
from runtime.errors import ToolsError
from tests.unit.chat.reply_goldens import GOLDENS, TOOLS, Golden, family

FAMILIES = sorted(FORMATS)
EOS = 256


class _Bytes:
    """A tokenizer whose tokens are the 256 bytes, then special tokens, then EOS: every text
    is a token sequence, so a matcher answers exactly which texts a grammar accepts."""

    def __init__(self, specials: tuple[str, ...] = ()) -> None:
        self.specials = specials
        self.tokens = [bytes([i]) for i in range(256)] + [
            b"\xff" + s.encode() for s in specials] + [b"\xff<eos>"]
        self.eos_token_id = len(self.tokens) - 1
        self.bos_token_id = None
        self.special_token_ids = list(range(256, len(self.tokens)))

    def __call__(self, text: Any) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)

    def ids(self) -> dict[str, int]:
        return {s: 256 + i for i, s in enumerate(self.specials)}

    def encode(self, text: str) -> list[int]:
        """Specials as their token, the rest byte by byte."""
        out, i = [], 0
        while i < len(text):
            special = next((s for s in self.specials if text.startswith(s, i)), None)
            if special:
                out.append(self.ids()[special])
                i += len(special)
            else:
                out += list(text[i].encode())
                i += 1
        return out


BYTES = _Bytes()
TOKENIZER = LLTokenizer(TokenizerWrapper(BYTES))


def matcher(source: str, tokenizer: LLTokenizer = TOKENIZER) -> LLMatcher:
    grammar = LLMatcher.grammar_from_lark(source)
    assert LLMatcher.validate_grammar(grammar, tokenizer) == ""
    return LLMatcher(tokenizer, grammar, log_level=0)


def accepts(source: str, tokens: list[int], tokenizer: LLTokenizer = TOKENIZER) -> bool:
    m = matcher(source, tokenizer)
    return m.consume_tokens(tokens) and m.is_accepting()


def constraint(name: str, choice: str = "required", parallel: bool = True, **kw: Any) -> Any:
    return tool_constraint(family(name), TOOLS, choice, parallel, **kw)


# --- bad input ---------------------------------------------------------------------------


def _tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": function}


@pytest.mark.parametrize(("tools", "message"), [
    ([_tool(description="no name")], "tools[0] has no function name"),
    ([_tool(name="bad name!")], "tool name 'bad name!' must be"),
    ([{"type": "retrieval"}], "tools[0] has type 'retrieval'; only 'function' tools"),
    (["get_weather"], "tools[0] is not an object"),
    ([_tool(name="f"), _tool(name="f")], "two tools are named 'f'"),
    ([_tool(name="f", parameters="{}")], "tool 'f': parameters must be a JSON Schema object"),
    ([_tool(name="f", parameters={"type": "object", "properties": {"a": {"type": "strin"}}})],
     "tool 'f': parameters are not a valid JSON Schema"),
    ([_tool(name="f", parameters={"type": "object", "required": "a"})],
     "tool 'f': parameters are not a valid JSON Schema"),
    ([_tool(name="f", parameters={"type": "array"})],
     "tool 'f': parameters must be a schema of type 'object'"),
])
def test_bad_tools_are_one_line_errors(tools: list[Any], message: str) -> None:
    with pytest.raises(ToolsError, match="^" + message.replace("(", r"\(").replace("[", r"\[")):
        tool_constraint(family("hermes"), tools, "auto", True)
    with pytest.raises(ToolsError) as caught:
        parse_tools(tools)
    assert "\n" not in str(caught.value)


def test_unknown_function_is_named_with_the_available_ones() -> None:
    with pytest.raises(ToolsError) as caught:
        constraint("hermes", "get_wether")
    assert str(caught.value) == ("tool_choice names 'get_wether', which is not among the tools "
                                 "(get_weather, get_time)")


def test_family_without_a_call_format() -> None:
    plain = Family("plain", tools=False, reasoning="none")
    with pytest.raises(ToolsError, match="has no tool-call format"):
        tool_constraint(plain, TOOLS, "auto", True)
    assert tool_constraint(plain, TOOLS, "none", True) is None  # "none" asks for nothing


def test_a_schema_the_grammar_engine_cannot_take_names_the_tool() -> None:
    tools = [*TOOLS, _tool(name="odd", parameters={
        "type": "object", "properties": {"a": {"not": {"type": "string"}}}})]
    with pytest.raises(ToolsError, match=r"^tool 'odd': its parameters schema is not supported"):
        tool_constraint(family("hermes"), tools, "auto", True)


def test_unknown_formats_are_annotations() -> None:
    tools = [_tool(name="f", parameters={"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"},
        "ref": {"type": "string", "format": "uri-reference"}}, "required": ["when", "ref"]})]
    spec = tool_constraint(family("hermes"), tools, "required", False)
    assert spec is not None and "uri-reference" not in spec.source and "date-time" in spec.source


def test_none_empty_and_choice_shapes() -> None:
    assert constraint("hermes", "none") is None
    assert tool_constraint(family("hermes"), [], "auto", True) is None
    with pytest.raises(ToolsError, match="needs at least one tool"):
        tool_constraint(family("hermes"), [], "required", True)
    named = tool_constraint(family("hermes"), TOOLS,
                            {"type": "function", "function": {"name": "get_time"}}, True)
    assert named is not None and '"get_time"' in named.source and '"get_weather"' not in named.source
    with pytest.raises(ToolsError, match=r"^tool_choice must be"):
        tool_constraint(family("hermes"), TOOLS, 3, True)


# --- grammars ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_every_grammar_compiles(name: str) -> None:
    for choice in ("auto", "required", "get_time"):
        for parallel in (False, True):
            for in_reasoning in (False, True):
                spec = constraint(name, choice, parallel, in_reasoning=in_reasoning)
                assert spec.kind == "lark"
                assert spec.trigger == (FORMATS[name].trigger if choice == "auto" else None)
                grammar = LLMatcher.grammar_from_lark(spec.source)
                assert LLMatcher.validate_grammar(grammar) == ""
                assert LLMatcher.validate_grammar(grammar, TOKENIZER) == ""


CALL_GOLDENS = [g for g in GOLDENS if g.grammar]


@pytest.mark.parametrize("golden", CALL_GOLDENS, ids=lambda g: g.id)
def test_golden_calls_are_what_the_grammar_accepts(golden: Golden) -> None:
    required = constraint(golden.family, "required", in_reasoning=golden.in_reasoning)
    assert accepts(required.source, BYTES.encode(golden.text))
    auto = constraint(golden.family, "auto")
    region = golden.text[golden.text.index(auto.trigger):]  # the lazy grammar engages here
    assert accepts(auto.source, BYTES.encode(region))
    single = constraint(golden.family, "required", parallel=False,
                        in_reasoning=golden.in_reasoning)
    assert accepts(single.source, BYTES.encode(golden.text)) == (len(golden.calls) == 1)
    named = constraint(golden.family, golden.calls[0][0], in_reasoning=golden.in_reasoning)
    all_named = all(call[0] == golden.calls[0][0] for call in golden.calls)
    assert accepts(named.source, BYTES.encode(golden.text)) == all_named


def test_required_allows_thinking_but_no_answer_text() -> None:
    spec = constraint("hermes")
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    assert accepts(spec.source, BYTES.encode("<think>\nHmm.\n</think>\n\n" + call))
    assert not accepts(spec.source, BYTES.encode("Sure! " + call))
    assert not accepts(spec.source, BYTES.encode(call.replace('"CET"', "5")))  # schema: string
    assert not accepts(spec.source, BYTES.encode(call.replace("get_time", "get_date")))


def _walk(source: str, rng: random.Random, limit: int = 1500) -> str | None:
    """A random text the grammar accepts (None if the walk ran too long)."""
    m = matcher(source)
    hints = [b"\n</parameter>", b"</parameter>", b"</arg_value>", b'<|"|>', b"</tool_call>",
             "</｜DSML｜parameter>".encode(), b'"', b"}", b"]"]
    out = bytearray()
    while len(out) < limit:
        if m.is_stopped():
            break
        if rng.random() < 0.1:
            hint = list(rng.choice(hints))
            if m.validate_tokens(hint) == len(hint):
                m.consume_tokens(hint)
                out += bytes(hint)
                continue
        mask = m.compute_bitmask()
        allowed = [t for t in range(257) if mask[t // 8] >> (t % 8) & 1]
        if EOS in allowed and rng.random() < 0.5:
            break
        text = [t for t in allowed if t in (9, 10) or 32 <= t < 127]
        closers = [t for t in text if chr(t) in '"}]<']  # so that walks end
        token = rng.choice(closers if closers and rng.random() < 0.25 else
                           text or [t for t in allowed if t != EOS])
        assert m.consume_token(token)
        out.append(token)
    else:
        return None
    assert m.is_accepting()
    return out.decode()


@pytest.mark.parametrize("name", FAMILIES)
def test_what_the_grammar_lets_through_parses_as_valid_calls(name: str) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    rng = random.Random(name)
    texts = 0
    for choice in ("required", "get_time", "auto"):
        in_reasoning = choice != "auto" and rng.random() < 0.3
        spec = constraint(name, choice, parallel=choice == "required", in_reasoning=in_reasoning)
        for _ in range(5):
            text = _walk(spec.source, rng)
            if text is None:
                continue
            texts += 1
            parser = ReplyParser(family(name), in_reasoning=in_reasoning, tools=True,
                                 tool_specs=TOOLS)
            parser.push(text)
            reply = parser.finish()
            assert reply.malformed is None and reply.tool_calls, text
            assert reply.content == "", text  # thinking and calls only
            for call in reply.tool_calls:
                assert choice in ("required", "auto") or call.name == choice
                jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    assert texts >= 5


def test_refs_and_defs_of_a_tool_still_resolve() -> None:
    tools = [_tool(name="tree", parameters={
        "type": "object", "$defs": {"node": {"type": "object", "properties": {
            "label": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["label"]}},
        "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"]}), *TOOLS]
    call = ('<tool_call>\n{"name": "tree", "arguments": {"root": {"label": "a", "kids": '
            '[{"label": "b"}]}}}\n</tool_call>')
    spec = tool_constraint(family("hermes"), tools, "required", False)
    assert spec is not None and accepts(spec.source, BYTES.encode(call))
    assert not accepts(spec.source, BYTES.encode(call.replace('{"label": "b"}', '{"lab": 1}')))
    mistral = tool_constraint(family("mistral"), tools, "tree", False)
    assert mistral is not None and accepts(mistral.source, BYTES.encode(
        '[TOOL_CALLS]tree[ARGS]{"root": {"label": "a"}}'))


@pytest.mark.parametrize(("name", "text"), [
    ("hermes", '<think>\nok\n</think>\n\n<tool_call>\n{"name": "get_time", "arguments": '
               '{"zone": "CET"}}\n</tool_call>'),
    ("gpt_oss", '<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>commentary'
                ' to=functions.get_time <|constrain|>json<|message|>{"zone": "CET"}'),
])
def test_special_token_markers_are_single_tokens(name: str, text: str) -> None:
    markers = call_markers(family(name))
    assert markers
    tokens = _Bytes(tuple(sorted(markers, key=len, reverse=True)))
    tokenizer = LLTokenizer(TokenizerWrapper(tokens))
    spec = constraint(name, special_tokens=tokens.ids())
    assert "<[" in spec.source
    assert accepts(spec.source, tokens.encode(text), tokenizer)
    assert not accepts(spec.source, list(text.encode()), tokenizer)  # spelled out: refused
    literal = constraint(name)
    assert accepts(literal.source, list(text.encode()), tokenizer)


def test_tool_arguments_and_response_formats_bound_json_whitespace_alike() -> None:
    """One rule for JSON whitespace: a tool call's arguments and a response_format document."""
    from runtime.chat import lark
    from runtime.sampling import grammar

    assert lark._JSON_WHITESPACE["whitespace_pattern"] == \
        grammar._JSON_DEFAULTS["whitespace_pattern"]
