"""A request's prompt as tokens: rendered, tokenized, checked against the context.

Never silent about the context: a prompt that does not fit is a `ContextOverflow` naming
both numbers, unless the request allows middle truncation. Then older chat turns are
dropped (system messages and the last message are kept), or for a raw prompt the middle
tokens, and `truncated_tokens` says how many went.

    prompt 5,000 tokens, context 4,096            → ContextOverflow("… 5000 tokens … 4096 …")
    same chat, truncate_middle=True, max_tokens 512 → oldest turns dropped until the prompt
                                                      fits in 4,096 − 512 tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from runtime.engine.chat_template import ChatTemplate
from runtime.errors import ContextOverflow, SettingsError
from runtime.events import ChatMessage, GenerationRequest


class Tokenizer(Protocol):
    n_vocab: int

    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class PreparedPrompt:
    tokens: tuple[int, ...]
    truncated_tokens: int = 0
    dropped_messages: int = 0


def prepare_prompt(request: GenerationRequest, tok: Tokenizer, template: ChatTemplate,
                   n_ctx: int) -> PreparedPrompt:
    """Tokens for `request` that fit in `n_ctx`, or a typed error."""
    if request.messages is not None:
        tokens = _chat_tokens(request.messages, tok, template)
    elif isinstance(request.prompt, str):
        tokens = tok.tokenize(request.prompt)
    else:
        tokens = list(request.prompt or ())
        bad = [t for t in tokens if not 0 <= t < tok.n_vocab]
        if bad:
            raise SettingsError(f"token id {bad[0]} is outside the vocabulary (0..{tok.n_vocab - 1})")
    if not tokens:
        raise SettingsError("the prompt is empty")
    if len(tokens) <= n_ctx:
        return PreparedPrompt(tuple(tokens))
    if not request.truncate_middle:
        raise ContextOverflow(
            f"the prompt is {len(tokens)} tokens but the context holds {n_ctx}; shorten it, "
            f"load the model with a longer context, or allow middle truncation")
    # Leave room to answer: up to max_tokens, but never more than half the context.
    limit = n_ctx - min(request.sampling.max_tokens, n_ctx // 2)
    if request.messages is not None:
        return _drop_turns(request.messages, tok, template, limit, n_ctx, len(tokens))
    head = limit // 2
    kept = tokens[:head] + tokens[len(tokens) - (limit - head):]
    return PreparedPrompt(tuple(kept), truncated_tokens=len(tokens) - len(kept))


def _chat_tokens(messages: Sequence[ChatMessage], tok: Tokenizer, template: ChatTemplate) -> list[int]:
    return tok.tokenize(template.render(messages, add_generation_prompt=True))


def _drop_turns(messages: Sequence[ChatMessage], tok: Tokenizer, template: ChatTemplate,
                limit: int, n_ctx: int, original: int) -> PreparedPrompt:
    """Drop the oldest non-system messages (never the last) until the prompt fits `limit`."""
    msgs = list(messages)
    dropped = 0
    while True:
        droppable = [i for i, m in enumerate(msgs[:-1]) if m.role != "system"]
        if not droppable:
            break
        idx = droppable[0]
        del msgs[idx]
        dropped += 1
        # Keep turns paired: the reply to a dropped question goes with it.
        if idx < len(msgs) - 1 and msgs[idx].role == "assistant":
            del msgs[idx]
            dropped += 1
        tokens = _chat_tokens(msgs, tok, template)
        if len(tokens) <= limit:
            return PreparedPrompt(tuple(tokens), truncated_tokens=original - len(tokens),
                                  dropped_messages=dropped)
    tokens = _chat_tokens(msgs, tok, template)
    if len(tokens) < n_ctx:  # no room for a full answer, but some
        return PreparedPrompt(tuple(tokens), truncated_tokens=original - len(tokens),
                              dropped_messages=dropped)
    raise ContextOverflow(
        f"even with older turns dropped the prompt is {len(tokens)} tokens but the context "
        f"holds {n_ctx} (with room to answer: {limit}); shorten the last message or load "
        f"a longer context")
