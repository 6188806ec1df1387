"""The reply being written now: its message, its stream, and what the footer will say
(time to the first token, tokens of thinking and of answer).

    gen = Generation(message)
    gen.count(delta)          # each TextDelta as it arrives
    gen.thinking_tokens, gen.answer_tokens
    gen.streamed()            # what the footer takes of it (app.chat.footer)
"""

from __future__ import annotations

from dataclasses import dataclass

from app.chat.conversation import Message
from app.chat.footer import Streamed
from app.chat.retrieval import PassageFinder
from app.engine.client import ReplyStream
from app.engine.wire import TextDelta


@dataclass
class Generation:
    """The reply being written now."""

    message: Message
    stream: ReplyStream | None = None
    finder: PassageFinder | None = None  # picking a long document's passages first
    passages_picked: bool = False  # they were (the request goes with what was found)
    sent_at: float = 0.0
    first_token_at: float | None = None
    tokens: int = 0
    dirty: bool = False
    thinking_tokens: int = 0
    answer_tokens: int = 0
    held_tokens: int = 0  # tokens whose text the server held back (a marker), kind not known yet
    last_kind: str = ""  # "thinking" / "answer": what the last text was
    server_counts: bool = False  # the stream carries token ids (Outrider's server does)
    thinking_first_at: float | None = None

    def count(self, delta: TextDelta) -> None:
        """Add a chunk's tokens to the thinking or the answer.

        Each chunk carries the ids of the tokens behind it (`outrider.token_ids`), so these
        are real token counts. Tokens that came with no text (the server held it back, or it
        was a marker such as `<think>` / `</think>`) belong with the text around them: with
        the text before them when there was some (a closing marker ends the thinking), else
        with the text that comes next (an opening marker starts it). Text with no tokens
        (what the server held back, sent at the end) adds none; from a server that sends no
        token ids at all, each chunk counts as one.

        >>> gen = Generation(Message(1, 1, None, "assistant", "", 0.0))
        >>> for d in (TextDelta("", (1,)), TextDelta("", (2, 3), reasoning="Hm"),
        ...           TextDelta("", (4,)), TextDelta("Yes", (5, 6)), TextDelta("!")):
        ...     gen.count(d)
        >>> gen.thinking_tokens, gen.answer_tokens
        (4, 2)
        """
        self.server_counts = self.server_counts or bool(delta.token_ids)
        fallback = 0 if self.server_counts else 1
        n = len(delta.token_ids) or (fallback if delta.text or delta.reasoning else 0)
        if delta.reasoning and delta.text:
            # One chunk with both (a batch of tokens across `</think>`): which token made
            # which text is not in the chunk, so share them by length, one at least each.
            share = len(delta.reasoning) / (len(delta.reasoning) + len(delta.text))
            thinking = min(n - 1, max(1, round(n * share))) if n > 1 else 0
            self._add("thinking", thinking + self.held_tokens)
            self._add("answer", n - thinking)
        elif delta.reasoning:
            self._add("thinking", n + self.held_tokens)
        elif delta.text:
            self._add("answer", n + self.held_tokens)
        elif self.last_kind:
            self._add(self.last_kind, n)
            return
        else:
            self.held_tokens += n
            return
        self.held_tokens = 0
        self.last_kind = "answer" if delta.text else "thinking"

    def streamed(self) -> Streamed:
        """What the footer takes of this reply so far (`app.chat.footer.footer_stats`)."""
        thinking_s = self.message.stats.get("thinking_s")
        return Streamed(self.tokens, self.thinking_tokens, bool(self.message.reasoning),
                        self.sent_at, self.first_token_at,
                        thinking_s if isinstance(thinking_s, int | float) else None)

    def _add(self, kind: str, n: int) -> None:
        if kind == "thinking":
            self.thinking_tokens += n
        else:
            self.answer_tokens += n
