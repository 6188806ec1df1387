"""ReplyParser: golden replies of every family parse to their answer, thinking and calls,
and the streamed parse (one character at a time, random chunks) equals the whole one."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.chat import call_syntax, grammar_formats
from runtime.chat.families import TOOL_FAMILIES, Family
from runtime.chat.reply import ParsedReply, ReplyDelta, ReplyParser, starts_in_reasoning
from tests.unit.chat.reply_goldens import GOLDENS, TOOLS, Golden, family

CALL_ID = re.compile(r"^call_[A-Za-z0-9]{24}$")


def parse(golden: Golden, chunks: list[str], *, tools: bool = True
          ) -> tuple[list[ReplyDelta], ParsedReply]:
    parser = ReplyParser(family(golden.family), in_reasoning=golden.in_reasoning, tools=tools,
                         tool_specs=TOOLS)
    deltas: list[ReplyDelta] = []
    for chunk in chunks:
        deltas += parser.push(chunk)
    deltas += parser.close()
    return deltas, parser.finish()


def random_chunks(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    chunks, i = [], 0
    while i < len(text):
        n = rng.choice((1, 1, 2, 3, 5, 8, 13))
        chunks.append(text[i:i + n])
        i += n
    return chunks


def summary(reply: ParsedReply) -> tuple[object, ...]:
    """A reply without the random call ids."""
    calls = tuple((c.name, json.loads(c.arguments)) for c in reply.tool_calls)
    return reply.content, reply.reasoning, calls, reply.malformed


def assert_deltas_add_up(deltas: list[ReplyDelta], reply: ParsedReply) -> None:
    assert "".join(d.text for d in deltas if d.kind == "content") == reply.content
    assert ("".join(d.text for d in deltas if d.kind == "reasoning") or None) == reply.reasoning
    calls = [d for d in deltas if d.kind == "tool_call"]
    assert [d.tool_call for d in calls] == list(reply.tool_calls)
    assert [d.tool_index for d in calls] == list(range(len(calls)))
    assert all(d.text for d in deltas if d.kind != "tool_call")


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: g.id)
def test_golden_reply_parses(golden: Golden) -> None:
    _, reply = parse(golden, [golden.text])
    assert reply.content == golden.content
    assert reply.reasoning == golden.reasoning
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == list(golden.calls)
    assert (reply.malformed is not None) == golden.malformed, reply.malformed
    for call, model_id in zip(reply.tool_calls, golden.ids or (None,) * len(golden.calls),
                              strict=True):
        assert call.id == model_id if model_id else CALL_ID.match(call.id)
        assert call.arguments == json.dumps(json.loads(call.arguments), separators=(",", ":"),
                                            ensure_ascii=False)


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda g: g.id)
def test_streaming_equals_the_whole_parse(golden: Golden) -> None:
    deltas, whole = parse(golden, [golden.text])
    assert_deltas_add_up(deltas, whole)
    splits = [list(golden.text)] + [random_chunks(golden.text, seed) for seed in range(12)]
    for chunks in splits:
        deltas, reply = parse(golden, chunks)
        assert summary(reply) == summary(whole), chunks
        assert_deltas_add_up(deltas, reply)
        assert [c.id for c in reply.tool_calls if not CALL_ID.match(c.id)] == [
            c.id for c in whole.tool_calls if not CALL_ID.match(c.id)]


def test_text_is_sent_as_soon_as_it_cannot_be_a_marker() -> None:
    parser = ReplyParser(family("hermes"), in_reasoning=False, tools=True)
    assert parser.push("<think>Plan") == [ReplyDelta("reasoning", "Plan")]
    assert parser.push(" more</thi") == [ReplyDelta("reasoning", " more")]
    assert parser.push("nk>Hi <") == [ReplyDelta("content", "Hi")]  # the space may precede a call
    assert parser.push("b>bold</b>") == [ReplyDelta("content", " <b>bold</b>")]
    assert parser.push('<tool_call>{"name": "f", "arguments": {}}') == []
    (call,) = parser.push("</tool_call>")
    assert call.kind == "tool_call" and call.tool_call is not None
    assert (call.tool_call.name, call.tool_call.arguments) == ("f", "{}")
    assert parser.close() == []


def test_the_last_held_text_comes_with_close() -> None:
    parser = ReplyParser(family("hermes"), in_reasoning=False, tools=True)
    assert parser.push("Done <tool") == [ReplyDelta("content", "Done")]
    assert parser.close() == [ReplyDelta("content", " <tool")]
    assert parser.finish().content == "Done <tool"
    assert parser.push("more") == [] and parser.close() == []


@pytest.mark.parametrize("golden", [g for g in GOLDENS if g.calls], ids=lambda g: g.id)
def test_without_tools_calls_stay_text(golden: Golden) -> None:
    _, reply = parse(golden, [golden.text], tools=False)
    assert reply.tool_calls == () and reply.malformed is None
    _, with_tools = parse(golden, [golden.text])
    if golden.case != "call-closes-thinking" and family(golden.family).reasoning != "harmony":
        assert reply.reasoning == with_tools.reasoning


def test_a_family_without_tools_never_reads_calls() -> None:
    plain = Family("plain", tools=False, reasoning="none")
    parser = ReplyParser(plain, in_reasoning=False, tools=True)
    parser.push('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n')
    reply = parser.finish()
    assert reply.content == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n'
    assert reply.tool_calls == () and reply.reasoning is None


def test_plain_text_is_kept_exactly() -> None:
    text = "  indented\n\nand trailing  \n"
    for name in ("plain", "hermes", "llama3", "gpt_oss"):
        fam = family(name) if name != "plain" else Family("plain", tools=False, reasoning="none")
        parser = ReplyParser(fam, in_reasoning=False, tools=True)
        parser.push(text)
        assert parser.finish().content == text


def test_botched_call_then_good_one() -> None:
    text = ('<tool_call>{"name": "a", "arguments": {x}}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    parser = ReplyParser(family("hermes"), in_reasoning=False, tools=True)
    parser.push(text)
    reply = parser.finish()
    assert reply.content == '<tool_call>{"name": "a", "arguments": {x}}</tool_call>'
    assert [c.name for c in reply.tool_calls] == ["b"]
    assert reply.malformed and "not valid JSON" in reply.malformed


def test_qwen3_coder_values_follow_the_schema() -> None:
    tools = [{"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}}}}]
    text = ("<tool_call>\n<function=note>\n<parameter=text>\n42\n</parameter>\n"
            "<parameter=n>\n42\n</parameter>\n</function>\n</tool_call>")
    with_schema = ReplyParser(family("qwen3_coder"), in_reasoning=False, tools=True,
                              tool_specs=tools)
    with_schema.push(text)
    assert json.loads(with_schema.finish().tool_calls[0].arguments) == {"text": "42", "n": 42}
    without = ReplyParser(family("qwen3_coder"), in_reasoning=False, tools=True)
    without.push(text)
    assert json.loads(without.finish().tool_calls[0].arguments) == {"text": 42, "n": 42}


def test_starts_in_reasoning() -> None:
    r1, oss = family("deepseek_r1"), family("gpt_oss")
    assert starts_in_reasoning(r1, "<｜User｜>Hi<｜Assistant｜><think>\n")
    assert not starts_in_reasoning(r1, "<｜Assistant｜><think>\n</think>")
    assert not starts_in_reasoning(r1, "<think>old</think> answer<｜Assistant｜>")
    assert starts_in_reasoning(family("mistral"), "[INST]Hi[/INST][THINK]")
    assert starts_in_reasoning(oss, "<|start|>assistant<|channel|>analysis<|message|>")
    assert not starts_in_reasoning(oss, "<|start|>assistant")
    assert not starts_in_reasoning(family("llama3"), "<think>")


def test_every_tool_family_has_a_parser_and_a_grammar() -> None:
    parsed = set(call_syntax.FORMATS) | {"gpt_oss"}  # harmony has its own reader
    assert parsed >= TOOL_FAMILIES
    assert parsed == set(grammar_formats.FORMATS)
    assert {g.family for g in GOLDENS} == parsed


_PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "{", "}", '"name"', ":", '"f"',
           ",", '"arguments"', "[TOOL_CALLS]", "[ARGS]", "<|channel|>", "analysis", "final",
           "<|message|>", "<|end|>", "<|start|>", " to=functions.f", "<|call|>", "\n", " ", "x",
           "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
           "<|tool_call>", "call:f", "<tool_call|>", "<arg_key>", "<arg_value>", "<"]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([*sorted(call_syntax.FORMATS), "gpt_oss"]),
       st.lists(st.sampled_from(_PIECES), max_size=30),
       st.booleans(), st.integers(1, 6))
def test_any_text_parses_without_error(name: str, pieces: list[str], in_reasoning: bool,
                                       step: int) -> None:
    """Whatever the model writes, the parser answers (no exception) and streaming agrees."""
    text = "".join(pieces)
    golden = Golden(name, "fuzz", text, in_reasoning=in_reasoning)
    deltas, whole = parse(golden, [text])
    assert_deltas_add_up(deltas, whole)
    chunks = [text[i:i + step] for i in range(0, len(text), step)]
    deltas, reply = parse(golden, chunks)
    assert summary(reply) == summary(whole)
    assert_deltas_add_up(deltas, reply)
