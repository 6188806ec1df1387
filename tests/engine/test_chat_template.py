"""Chat templates (runtime.engine.chat_template): the fixture's ChatML template, HF-style
features real templates use, and the ChatML fallback said out loud."""

from __future__ import annotations

import pytest

from runtime.engine.chat_template import CHATML, ChatTemplate
from runtime.errors import ChatTemplateError
from runtime.events import ChatMessage
from tests.fixtures.tiny_gguf import CHATML_TEMPLATE

CHAT = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello!"), ChatMessage("user", "Bye")]


def test_fixture_chatml_template() -> None:
    t = ChatTemplate.from_model(CHATML_TEMPLATE, bos_token="", eos_token="<|im_end|>")
    assert t.source == "model" and t.note is None
    assert t.render(CHAT) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert not t.render(CHAT, add_generation_prompt=False).endswith("assistant\n")


@pytest.mark.parametrize("template", [None, "", "   "])
def test_no_template_falls_back_to_chatml_and_says_so(template: str | None) -> None:
    t = ChatTemplate.from_model(template, bos_token="<s>", eos_token="</s>")
    assert t.source == "fallback" and t.text == CHATML
    assert t.note == "the model has no chat template; using ChatML"
    assert t.render([ChatMessage("user", "Hi")]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_a_broken_template_falls_back_with_the_reason() -> None:
    t = ChatTemplate.from_model("{% for m in messages %}", bos_token="", eos_token="")
    assert t.source == "fallback"
    assert t.note is not None and "does not compile" in t.note


LLAMA3_LIKE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if loop.index0 == 0 and message['role'] == 'assistant' %}"
    "{{ raise_exception('Conversation must start with a user message') }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def test_bos_token_trim_and_generation_prompt() -> None:
    t = ChatTemplate.from_model(LLAMA3_LIKE, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert t.render([ChatMessage("user", "  Hi  ")]) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_raise_exception_becomes_a_typed_error() -> None:
    t = ChatTemplate.from_model(LLAMA3_LIKE, bos_token="", eos_token="")
    with pytest.raises(ChatTemplateError, match="must start with a user message"):
        t.render([ChatMessage("assistant", "Hi")])


def test_trim_blocks_lstrip_blocks_loopcontrols_tojson_and_strftime() -> None:
    template = (
        "{% for m in messages %}\n"
        "    {% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
        "{{ m | tojson }}\n"
        "{% endfor %}"
        "{{ strftime_now('%Y') | length }}"
    )
    t = ChatTemplate.from_model(template, bos_token="", eos_token="")
    out = t.render([ChatMessage("system", "x"), {"role": "user", "content": "héllo"}])
    assert out == '{"role": "user", "content": "héllo"}\n4'


def test_the_sandbox_refuses_unsafe_access() -> None:
    t = ChatTemplate.from_model("{{ messages.__class__.__mro__ }}", bos_token="", eos_token="")
    with pytest.raises(ChatTemplateError):
        t.render([ChatMessage("user", "x")])


# ---- bounded rendering (issue 15): a template is code from a model file -----------------------

BOUNDED = {"time_limit_s": 0.3, "max_chars": 100_000}


@pytest.mark.parametrize(("template", "words"), [
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
     "longer than 0.3 s"),
    ("{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}",
     "stopped"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "nested calls"),
    ("{{ 'x' * 1000000000 }}", "over 100,000 items"),
    ("{{ messages[0]['content'] | center(1000000000) }}", "number over 100,000"),
    ("{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s }}", "stopped"),
    ("{{ range(10**9) | list }}", "OverflowError"),
    ("{{ messages.nope.deeper }}", "has no attribute"),
    ("{{ raise_exception('two\\nlines') }}", "two lines"),
])
def test_a_hostile_template_ends_in_one_line_error(template: str, words: str) -> None:
    t = ChatTemplate(template, "model", "", "", **BOUNDED)  # type: ignore[arg-type]
    with pytest.raises(ChatTemplateError, match="chat template") as caught:
        t.render(CHAT)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_constant_filter_bomb_is_refused_at_compile_time_too() -> None:
    """jinja folds constant filter calls while compiling, i.e. at model load."""
    t = ChatTemplate.from_model("{{ 'x' | center(1000000000) }}", bos_token="", eos_token="")
    with pytest.raises(ChatTemplateError, match="number over"):
        t.render(CHAT)


def test_bounds_leave_a_normal_render_alone_on_any_thread() -> None:
    from concurrent.futures import ThreadPoolExecutor

    t = ChatTemplate.from_model(LLAMA3_LIKE, bos_token="<s>", eos_token="")
    long_chat = [ChatMessage("user", f"message {i}") for i in range(2_000)]
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda _: t.render(long_chat), range(4)))
    assert len(set(outs)) == 1 and outs[0].count("<|eot_id|>") == 2_000
