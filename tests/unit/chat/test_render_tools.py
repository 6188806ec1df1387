"""Rendering with tools (runtime.engine.chat_template): for every real template of a family
with tools, a conversation with calls and results renders with the tool's name, the call's
arguments and the result in the prompt; every one of the 70 renders a plain chat; messages
reach the template the way llama.cpp's `--jinja` hands them over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.chat.messages import short_id
from runtime.engine.chat_template import ChatTemplate
from runtime.engine.prompt import prepare_prompt
from runtime.errors import ChatTemplateError
from runtime.events import ChatMessage, GenerationRequest, ToolCall

TOOLS = (
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "required": ["city"],
                       "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "local_time", "description": "The time of day in a time zone",
        "parameters": {"type": "object", "required": ["zone"],
                       "properties": {"zone": {"type": "string"}}}}},
)

WEATHER = ToolCall("get_weather", '{"city": "Hammerfest"}', "call_weather01")
TIME = ToolCall("local_time", '{"zone": "Europe/Oslo"}', "call_time0002")
WEATHER_RESULT = ChatMessage("tool", "sleet, minus four", tool_call_id="call_weather01",
                             name="get_weather")
TIME_RESULT = ChatMessage("tool", "half past nine", tool_call_id="call_time0002",
                          name="local_time")
ASK = (ChatMessage("system", "You answer in one sentence."),
       ChatMessage("user", "What is it like in the north right now?"))
END = (ChatMessage("assistant", "Sleet at minus four, and it is half past nine."),
       ChatMessage("user", "Should I bring gloves?"))

# Two calls one after the other, each with its result; then two calls at once.
CONVERSATION = (*ASK, ChatMessage("assistant", "", tool_calls=(WEATHER,)), WEATHER_RESULT,
                ChatMessage("assistant", "", tool_calls=(TIME,)), TIME_RESULT, *END)
PARALLEL = (*ASK, ChatMessage("assistant", "", tool_calls=(WEATHER, TIME)), WEATHER_RESULT,
            TIME_RESULT, *END)
WANTED = ["get_weather", "local_time", "Hammerfest", "Europe/Oslo", "sleet, minus four",
          "half past nine", "Should I bring gloves?"]

PLAIN_CHAT = (
    ChatMessage("user", "Hello there"),
    ChatMessage("assistant", "Hi! How can I help?"),
    ChatMessage("user", "Tell me a joke"),
)


def _load(directory: Path, stem: str) -> ChatTemplate:
    text = (directory / f"{stem}.jinja").read_text(encoding="utf-8")
    return ChatTemplate.from_model(text, bos_token="<s>", eos_token="</s>")


def _all(directory: Path) -> dict[str, ChatTemplate]:
    return {p.stem: _load(directory, p.stem) for p in sorted(directory.glob("*.jinja"))}


@pytest.fixture(scope="module")
def templates(llama_templates: Path) -> dict[str, ChatTemplate]:
    return _all(llama_templates)


def test_every_template_compiles(templates: dict[str, ChatTemplate]) -> None:
    assert len(templates) == 70
    assert [stem for stem, t in templates.items() if t.source != "model"] == []


def test_every_tools_family_renders_calls_and_results(templates: dict[str, ChatTemplate]) -> None:
    with_tools = {stem: t for stem, t in templates.items() if t.family.tools}
    assert len(with_tools) >= 29
    missing: dict[str, list[str]] = {}
    for stem, template in with_tools.items():
        out = template.render(CONVERSATION, tools=TOOLS)
        lost = [w for w in WANTED if w not in out]
        if lost:
            missing[stem] = lost
    assert missing == {}


def test_parallel_calls_render_or_the_template_says_it_takes_one(
        templates: dict[str, ChatTemplate]) -> None:
    single = []
    for stem, template in templates.items():
        if not template.family.tools:
            continue
        try:
            out = template.render(PARALLEL, tools=TOOLS)
        except ChatTemplateError as exc:  # Llama 3.x: "only supports single tool-calls"
            assert "single tool-call" in str(exc), stem
            single.append(stem)
            continue
        assert [w for w in WANTED if w not in out] == [], stem
    assert sorted(single) == ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
                              "meta-llama-Llama-3.3-70B-Instruct"]


def test_every_template_renders_a_plain_chat(templates: dict[str, ChatTemplate]) -> None:
    failed = {}
    for stem, template in templates.items():
        try:
            out = template.render(PLAIN_CHAT)
        except ChatTemplateError as exc:  # the one failure a template may have
            failed[stem] = str(exc)
            continue
        assert "Tell me a joke" in out, stem
    assert failed == {}


def test_a_templates_own_raise_exception_is_a_chat_template_error(llama_templates: Path) -> None:
    gemma2 = _load(llama_templates, "google-gemma-2-2b-it")
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        gemma2.render([ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")])


def test_arguments_go_as_an_object_where_the_template_wants_one(llama_templates: Path) -> None:
    coder = _load(llama_templates, "Qwen3-Coder")  # iterates the arguments' items
    assert coder.family.arguments_as_object
    assert "<parameter=city>\nHammerfest\n</parameter>" in coder.render(CONVERSATION, tools=TOOLS)
    qwen = _load(llama_templates, "Qwen-Qwen2.5-7B-Instruct")  # `arguments | tojson`
    assert qwen.family.arguments_as_object
    out = qwen.render(CONVERSATION, tools=TOOLS)
    assert '{"name": "get_weather", "arguments": {"city": "Hammerfest"}}' in out
    functionary = _load(llama_templates, "meetkai-functionary-medium-v3.2")  # `'…' + arguments`
    assert not functionary.family.arguments_as_object
    assert '{"city": "Hammerfest"}' in functionary.render(CONVERSATION, tools=TOOLS)


def test_mistral_gets_its_nine_character_ids(llama_templates: Path) -> None:
    nemo = _load(llama_templates, "mistralai-Mistral-Nemo-Instruct-2407")
    out = nemo.render(CONVERSATION, tools=TOOLS)  # OpenAI-style ids: the template raises
    weather = short_id("call_weather01")
    assert f'"id": "{weather}"' in out and f'"call_id": "{weather}"' in out
    assert short_id("abcDEF123") == "abcDEF123"


def test_templates_that_hide_calls_still_show_them(llama_templates: Path) -> None:
    # R1-Distill-Llama writes a call only when the content is None; Granite 3.3 never does.
    r1 = _load(llama_templates, "deepseek-ai-DeepSeek-R1-Distill-Llama-8B")
    assert "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Hammerfest\"}" in r1.render(
        CONVERSATION, tools=TOOLS)
    granite = _load(llama_templates, "ibm-granite-granite-3.3-2B-Instruct")
    assert '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Hammerfest"}}' in (
        granite.render(CONVERSATION, tools=TOOLS))


def test_template_kwargs_are_template_variables(llama_templates: Path) -> None:
    qwen3 = _load(llama_templates, "Qwen-Qwen3-0.6B")
    chat = [ChatMessage("user", "Hi")]
    assert qwen3.render(chat).endswith("<|im_start|>assistant\n")
    assert qwen3.render(chat, extra={"enable_thinking": False}).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    gpt_oss = _load(llama_templates, "openai-gpt-oss-120b")
    assert "Reasoning: high" in gpt_oss.render(chat, extra={"reasoning_effort": "high"})


def test_reasoning_reaches_the_template(llama_templates: Path) -> None:
    thinking = ChatMessage("assistant", "", reasoning="The user wants the weather first.",
                           tool_calls=(ToolCall("get_weather", '{"city": "Hammerfest"}', "c1"),))
    chat = [ChatMessage("user", "Weather?"), thinking,
            ChatMessage("tool", "sleet", tool_call_id="c1", name="get_weather")]
    qwen3 = _load(llama_templates, "Qwen-Qwen3-0.6B")  # reasoning_content
    assert "<think>\nThe user wants the weather first.\n</think>" in qwen3.render(chat, tools=TOOLS)
    gpt_oss = _load(llama_templates, "openai-gpt-oss-120b")  # `thinking`, as llama.cpp maps it
    assert ("<|channel|>analysis<|message|>The user wants the weather first.<|end|>"
            in gpt_oss.render(chat, tools=TOOLS))


def test_without_tools_the_variable_stays_undefined() -> None:
    # As in llama.cpp: Hermes 2 Pro's tool-use template loops over `tools` unguarded, and
    # over None that fails (test_every_template_renders_a_plain_chat renders it).
    probe = ChatTemplate.from_model("{{ tools is defined }} {{ tools | length if tools }}",
                                    bos_token="", eos_token="")
    assert probe.render([ChatMessage("user", "Hi")]) == "False "
    assert probe.render([ChatMessage("user", "Hi")], tools=TOOLS) == "True 2"


def test_arguments_that_are_not_json_are_a_chat_template_error(llama_templates: Path) -> None:
    coder = _load(llama_templates, "Qwen3-Coder")
    bad = ChatMessage("assistant", "", tool_calls=(ToolCall("get_weather", "{city: Oslo"),))
    with pytest.raises(ChatTemplateError, match="get_weather"):
        coder.render([ChatMessage("user", "Weather?"), bad], tools=TOOLS)


class CharTokenizer:
    n_vocab = 0x110000

    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        return [ord(c) for c in text]


def test_prompt_renders_with_the_requests_tools_and_kwargs(llama_templates: Path) -> None:
    qwen3 = _load(llama_templates, "Qwen-Qwen3-0.6B")
    request = GenerationRequest(messages=(ChatMessage("user", "Weather in Hammerfest?"),),
                                tools=TOOLS, template_kwargs=(("enable_thinking", False),))
    prompt = "".join(map(chr, prepare_prompt(request, CharTokenizer(), qwen3, 100_000).tokens))
    assert json.dumps(TOOLS[0], ensure_ascii=False) in prompt
    assert prompt.endswith("<think>\n\n</think>\n\n")
