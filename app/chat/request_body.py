"""The body of a chat request (`/v1/chat/completions`) for the next reply of a conversation:
its messages so far, its system prompt, its sampling and its structured output schema. Plain
Python over the chat store (attachments are read from it), no Qt.

    body = request_body(store, conversation, tree.path(reply.id)[:-1], model="SmolLM2")
    body["messages"]   # [{"role": "system", ...}, {"role": "user", "content": ...}, ...]

Earlier replies go back as their answers only, never with their thinking: the templates of
reasoning models drop past thinking themselves (Qwen3, DeepSeek-R1), and sending it would
only cost context. A reply that is all thinking is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.chat import schema
from app.chat.conversation import DEFAULT_SAMPLING, Conversation, Message
from app.chat.message_content import api_content
from app.chat.store import ChatStore


def request_body(store: ChatStore, conv: Conversation | None, history: Sequence[Message],
                 model: str | None) -> dict[str, Any]:
    """The request for a reply to `history` (the conversation's path before the reply) in
    `conv` (None: no conversation settings, the app's defaults), to the served `model`
    (None: whichever the server has)."""
    messages = [{"role": m.role, "content": api_content(store, m)}
                for m in history if m.content or m.attachments]
    system_prompt = conv.system_prompt if conv else ""
    if system_prompt.strip():
        messages.insert(0, {"role": "system", "content": system_prompt})
    s = conv.sampling if conv else DEFAULT_SAMPLING
    body: dict[str, Any] = {
        "messages": messages, "max_tokens": s.max_tokens, "temperature": s.temperature,
        "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
        "frequency_penalty": s.frequency_penalty, "presence_penalty": s.presence_penalty,
        "repeat_penalty": s.repeat_penalty,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if model is not None:
        body["model"] = model
    response_format = schema.response_format(conv.response_schema) if conv else None
    if response_format is not None:
        body["response_format"] = response_format
    return body
