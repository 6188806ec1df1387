"""Prompt preparation (runtime.engine.prompt): middle truncation by binary search (renders
counted), which turns go together, max_tokens fitted to n samples, lone surrogates."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from runtime.engine.chat_template import ChatTemplate
from runtime.engine.prompt import answer_budget, drop_order, prepare_prompt, utf8_safe
from runtime.errors import ContextOverflow
from runtime.events import ChatMessage, GenerationRequest, SamplingParams
from tests.fixtures.tiny_gguf import CHATML_TEMPLATE


class CountingTemplate(ChatTemplate):
    """The fixture's ChatML, counting renders."""

    renders = 0

    def render(self, messages: Sequence[ChatMessage | Mapping[str, Any]], *,
               add_generation_prompt: bool = True, **extra: Any) -> str:
        type(self).renders += 1
        return super().render(messages, add_generation_prompt=add_generation_prompt, **extra)


class WordTokenizer:
    """One token per whitespace-separated word."""

    n_vocab = 1000

    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        return [len(word) % self.n_vocab for word in text.split()]


def chat(n_pairs: int) -> tuple[ChatMessage, ...]:
    messages = [ChatMessage("system", "be brief")]
    for i in range(n_pairs):
        messages += [ChatMessage("user", f"question number {i}"),
                     ChatMessage("assistant", f"answer number {i}")]
    messages.append(ChatMessage("user", "the last question"))
    return tuple(messages)


def fewest_turns_by_dropping_one_at_a_time(messages: Sequence[ChatMessage], limit: int) -> int:
    """The reference: how many drop_order steps the old linear loop took."""
    tok, template = WordTokenizer(), ChatTemplate(CHATML_TEMPLATE, "model", "", "")
    steps = drop_order(messages)
    for k in range(1, len(steps) + 1):
        gone = {i for step in steps[:k] for i in step}
        kept = [m for i, m in enumerate(messages) if i not in gone]
        if len(tok.tokenize(template.render(kept))) <= limit:
            return sum(len(step) for step in steps[:k])
    return -1


def test_truncating_ten_thousand_messages_costs_a_logarithmic_number_of_renders() -> None:
    messages = chat(5_000)
    assert len(messages) == 10_002
    template = CountingTemplate(CHATML_TEMPLATE, "model", "", "")
    CountingTemplate.renders = 0
    request = GenerationRequest(messages=messages, truncate_middle=True,
                                sampling=SamplingParams(max_tokens=100))
    prepared = prepare_prompt(request, WordTokenizer(), template, n_ctx=2_000)
    steps = len(drop_order(messages))
    # One render of the whole chat, then a binary search over how many turns go.
    assert CountingTemplate.renders <= 2 + math.ceil(math.log2(steps)) + 1
    assert len(prepared.tokens) <= 2_000 - 100
    assert prepared.dropped_messages > 0 and prepared.truncated_tokens > 0


@pytest.mark.parametrize("n_pairs", [3, 40, 333])
def test_the_binary_search_drops_exactly_what_the_linear_loop_did(n_pairs: int) -> None:
    messages = chat(n_pairs)
    template = ChatTemplate(CHATML_TEMPLATE, "model", "", "")
    full = len(WordTokenizer().tokenize(template.render(messages)))
    n_ctx = full * 2 // 3
    request = GenerationRequest(messages=messages, truncate_middle=True,
                                sampling=SamplingParams(max_tokens=n_ctx // 4))
    prepared = prepare_prompt(request, WordTokenizer(), template, n_ctx=n_ctx)
    limit = n_ctx - n_ctx // 4
    assert prepared.dropped_messages == fewest_turns_by_dropping_one_at_a_time(messages, limit)
    assert prepared.truncated_tokens == full - len(prepared.tokens)


def test_drop_order_keeps_pairs_system_messages_and_the_last_message() -> None:
    roles = ["system", "user", "assistant", "user", "user", "assistant", "system", "assistant",
             "user"]
    messages = [ChatMessage(role, "") for role in roles]  # type: ignore[arg-type]
    assert drop_order(messages) == [(1, 2), (3,), (4, 5), (7,)]


def test_nothing_droppable_and_still_too_long_is_a_context_overflow() -> None:
    messages = (ChatMessage("system", "x " * 50), ChatMessage("user", "y " * 50))
    request = GenerationRequest(messages=messages, truncate_middle=True)
    with pytest.raises(ContextOverflow, match="even with older turns dropped"):
        prepare_prompt(request, WordTokenizer(), ChatTemplate(CHATML_TEMPLATE, "model", "", ""),
                       n_ctx=40)


@pytest.mark.parametrize(("n", "max_tokens", "prompt", "n_ctx", "shares", "want"), [
    (8, 8192, 96, 4096, True, 500),      # the docstring's example
    (1, 8192, 96, 4096, True, 4000),     # one sample: the rest of the context
    (1, 100, 96, 4096, True, 100),       # a max_tokens that fits is kept
    (8, 8192, 96, 4096, False, 416),     # no sharing: each holds its own prompt copy
])
def test_answer_budget_fits_n_samples_in_the_cache(n: int, max_tokens: int, prompt: int,
                                                   n_ctx: int, shares: bool, want: int) -> None:
    fitted = answer_budget(SamplingParams(max_tokens=max_tokens), prompt_len=prompt, n=n,
                           n_ctx=n_ctx, shares_prefixes=shares)
    assert fitted.max_tokens == want


def test_answer_budget_without_room_is_a_context_overflow() -> None:
    with pytest.raises(ContextOverflow, match="8 samples of a 509-token prompt"):
        answer_budget(SamplingParams(), prompt_len=509, n=8, n_ctx=512)


def test_utf8_safe_replaces_lone_surrogates_and_joins_pairs() -> None:
    assert utf8_safe("plain") == "plain"
    assert utf8_safe("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert utf8_safe("\ud83d\ude00") == "\U0001f600"
    utf8_safe("a\ud800b").encode("utf-8")  # what the tokenizer does with it


def test_answer_budget_counts_only_the_samples_that_fit_in_the_slots() -> None:
    """n 1,000 on 4 slots: 4 run at a time, the rest wait for a slot."""
    fitted = answer_budget(SamplingParams(max_tokens=8192), prompt_len=12, n=1000, n_ctx=512,
                           n_slots=4)
    assert fitted.max_tokens == (512 - 12) // 4


# A template whose generation prompt opens the thinking block (DeepSeek R1's, Qwen3.5's).
THINKING_TEMPLATE = CHATML_TEMPLATE.replace("'<|im_start|>assistant\n'",
                                            "'<|im_start|>assistant\n<think>\n'")


@pytest.mark.parametrize(("text", "opened"), [(THINKING_TEMPLATE, True), (CHATML_TEMPLATE, False)])
def test_the_prepared_prompt_says_whether_it_opened_the_thinking_block(text: str,
                                                                      opened: bool) -> None:
    template = ChatTemplate(text, "model", "", "")
    assert template.family.reasoning == ("think" if opened else "none")
    whole = prepare_prompt(GenerationRequest(messages=chat(2)), WordTokenizer(), template,
                           n_ctx=2_000)
    cut = prepare_prompt(GenerationRequest(messages=chat(40), truncate_middle=True,
                                           sampling=SamplingParams(max_tokens=20)),
                         WordTokenizer(), template, n_ctx=120)
    assert cut.dropped_messages > 0
    assert (whole.in_reasoning, cut.in_reasoning) == (opened, opened)
    raw = prepare_prompt(GenerationRequest(prompt="<think>"), WordTokenizer(), template, 2_000)
    assert not raw.in_reasoning  # a raw prompt is not the template's: nothing to say
