"""A request's prompt as tokens: rendered, tokenized, checked against the context.

Never silent about the context: a prompt that does not fit is a `ContextOverflow` naming
both numbers, unless the request allows middle truncation. Then older chat turns are
dropped (system messages and the last message are kept), or for a raw prompt the middle
tokens, and `truncated_tokens` says how many went.

    prompt 5,000 tokens, context 4,096            → ContextOverflow("… 5000 tokens … 4096 …")
    same chat, truncate_middle=True, max_tokens 512 → oldest turns dropped until the prompt
                                                      fits in 4,096 − 512 tokens

Dropping turns is a binary search over how many to drop (the token count only falls as turns
go), so a 10,000-message chat costs about 15 renders, not one per dropped message.

The answer's length is bounded too (`answer_budget`): the `n` samples of a request share the
prompt's cells, so each may generate at most (context − prompt) / n tokens and all n fit in
the cache together — `n: 8, max_tokens: 8192` on a 4,096 context with a 96-token prompt
gets 500 tokens each and finishes with "length", instead of preempting itself for minutes.

A chat renders with the request's `tools` (the template's `tools`) and `template_kwargs`
(`enable_thinking`, `reasoning_effort`, … as template variables); every render of one
request, truncated or not, gets the same ones.

Text reaches llama.cpp as UTF-8, which has no encoding for a lone surrogate ("\ud800", legal
in a Python string and in JSON): those become U+FFFD here, so the CLI and the app are as safe
as the server, which refuses them outright.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from runtime.chat.reply import starts_in_reasoning
from runtime.engine.chat_template import ChatTemplate
from runtime.errors import ContextOverflow, SettingsError
from runtime.events import ChatMessage, GenerationRequest, SamplingParams


class Tokenizer(Protocol):
    n_vocab: int

    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class PreparedPrompt:
    tokens: tuple[int, ...]
    truncated_tokens: int = 0
    dropped_messages: int = 0
    in_reasoning: bool = False  # the rendered chat ends inside the thinking block


def prepare_prompt(request: GenerationRequest, tok: Tokenizer, template: ChatTemplate,
                   n_ctx: int) -> PreparedPrompt:
    """Tokens for `request` that fit in `n_ctx`, or a typed error."""
    bound = _Bound(template, request.tools, dict(request.template_kwargs))
    in_reasoning = False
    if request.messages is not None:
        text = utf8_safe(bound.render(request.messages, add_generation_prompt=True))
        tokens = tok.tokenize(text)
        in_reasoning = starts_in_reasoning(template.family, text)
    elif isinstance(request.prompt, str):
        tokens = tok.tokenize(utf8_safe(request.prompt))
    else:
        tokens = list(request.prompt or ())
        bad = [t for t in tokens if not 0 <= t < tok.n_vocab]
        if bad:
            raise SettingsError(f"token id {bad[0]} is outside the vocabulary (0..{tok.n_vocab - 1})")
    if not tokens:
        raise SettingsError("the prompt is empty")
    if len(tokens) <= n_ctx:
        return PreparedPrompt(tuple(tokens), in_reasoning=in_reasoning)
    if not request.truncate_middle:
        raise ContextOverflow(
            f"the prompt is {len(tokens)} tokens but the context holds {n_ctx}; shorten it, "
            f"load the model with a longer context, or allow middle truncation")
    # Leave room to answer: up to max_tokens, but never more than half the context.
    limit = n_ctx - min(request.sampling.max_tokens, n_ctx // 2)
    if request.messages is not None:
        dropped = _drop_turns(request.messages, tok, bound, limit, n_ctx, len(tokens))
        return replace(dropped, in_reasoning=in_reasoning)  # the same generation prompt ends it
    head = limit // 2
    kept = tokens[:head] + tokens[len(tokens) - (limit - head):]
    return PreparedPrompt(tuple(kept), truncated_tokens=len(tokens) - len(kept))


def answer_budget(sampling: SamplingParams, *, prompt_len: int, n: int, n_ctx: int,
                  n_slots: int | None = None, shares_prefixes: bool = True) -> SamplingParams:
    """`sampling` with max_tokens cut to what the cache holds for the samples that run side
    by side: `n`, or the context's `n_slots` sequences when n is larger (the rest wait).

    With prefix sharing they hold one copy of the prompt: each gets (n_ctx − prompt) // n
    tokens. Without (recurrent models) each holds its own copy: n_ctx // n − prompt. A request
    alone in the engine then never has to preempt itself.

        >>> answer_budget(SamplingParams(max_tokens=8192), prompt_len=96, n=8,
        ...               n_ctx=4096).max_tokens
        500
    """
    together = min(n, n_slots) if n_slots else n
    room = ((n_ctx - prompt_len) // together if shares_prefixes
            else n_ctx // together - prompt_len)
    if room < 1:
        raise ContextOverflow(
            f"{together} samples of a {prompt_len}-token prompt do not fit in a context of "
            f"{n_ctx} tokens; ask for fewer samples (n) or shorten the prompt")
    if sampling.max_tokens <= room:
        return sampling
    return replace(sampling, max_tokens=room)


def utf8_safe(text: str) -> str:
    """`text` with lone surrogates (no UTF-8 encoding) replaced by U+FFFD; pairs are joined.

        >>> utf8_safe("a" + chr(0xD800) + "b"), utf8_safe(chr(0xD83D) + chr(0xDE00))
        ('a\ufffdb', '😀')
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class _Template(Protocol):
    def render(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> str: ...


@dataclass(frozen=True)
class _Bound:
    """A template with one request's tools and template kwargs."""

    template: ChatTemplate
    tools: Sequence[Mapping[str, Any]]
    extra: Mapping[str, Any]

    def render(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> str:
        return self.template.render(messages, add_generation_prompt=add_generation_prompt,
                                    tools=self.tools, extra=self.extra)


def _chat_tokens(messages: Sequence[ChatMessage], tok: Tokenizer, template: _Template) -> list[int]:
    return tok.tokenize(utf8_safe(template.render(messages, add_generation_prompt=True)))


def drop_order(messages: Sequence[ChatMessage]) -> list[tuple[int, ...]]:
    """The turns middle truncation drops, oldest first, as indices into `messages`: each
    non-system message but the last, with the assistant reply that follows it (pairs go
    together, so no reply is left without its question).

        >>> roles = ["system", "user", "assistant", "user", "assistant", "user"]
        >>> drop_order([ChatMessage(r, "") for r in roles])  # type: ignore[arg-type]
        [(1, 2), (3, 4)]
    """
    last = len(messages) - 1
    steps: list[tuple[int, ...]] = []
    i = 0
    while i < last:
        if messages[i].role == "system":
            i += 1
            continue
        if i + 1 < last and messages[i + 1].role == "assistant":
            steps.append((i, i + 1))
            i += 2
        else:
            steps.append((i,))
            i += 1
    return steps


def _drop_turns(messages: Sequence[ChatMessage], tok: Tokenizer, template: _Template,
                limit: int, n_ctx: int, original: int) -> PreparedPrompt:
    """Drop the fewest oldest turns (`drop_order`) that make the prompt fit `limit`.

    Binary search over how many turns go: dropping more never lengthens the prompt, so
    log2(turns) + 1 renders find the fewest (10,000 messages: 14), where dropping one turn
    at a time rendered the whole chat once per dropped turn (minutes for 10,000)."""
    steps = drop_order(messages)
    tried: dict[int, tuple[list[int], int]] = {}

    def attempt(k: int) -> tuple[list[int], int]:
        if k not in tried:
            gone = {i for step in steps[:k] for i in step}
            kept = [m for i, m in enumerate(messages) if i not in gone]
            tried[k] = _chat_tokens(kept, tok, template), len(gone)
        return tried[k]

    lo, hi = 1, len(steps)  # the answer is in [lo, hi], or nothing fits
    best: tuple[list[int], int] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        tokens, dropped = attempt(mid)
        if len(tokens) <= limit:
            best, hi = (tokens, dropped), mid - 1
        else:
            lo = mid + 1
    if best is not None:
        tokens, dropped = best
        return PreparedPrompt(tuple(tokens), truncated_tokens=original - len(tokens),
                              dropped_messages=dropped)
    tokens, dropped = attempt(len(steps)) if steps else (_chat_tokens(messages, tok, template), 0)
    if len(tokens) < n_ctx:  # no room for a full answer, but some
        return PreparedPrompt(tuple(tokens), truncated_tokens=original - len(tokens),
                              dropped_messages=dropped)
    raise ContextOverflow(
        f"even with older turns dropped the prompt is {len(tokens)} tokens but the context "
        f"holds {n_ctx} (with room to answer: {limit}); shorten the last message or load "
        f"a longer context")
