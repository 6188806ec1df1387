"""What a request asks of the engine, whichever dialect it came in: every dialect's schema
reads its body into an `Ask`, and `Ask.generation` makes the engine's one
`GenerationRequest` of it — the server's limits, the tools' grammar, the reply's form — and
says how the reply is read back (`ReplyOptions`):

    ask = Ask(messages=(ChatMessage("user", "Hi"),), sampling=Sampling(max_tokens=64))
    generation, reply = ask.generation(lease.model, limits)

Nothing here asks the engine anything: the model's template family and its call tokens came
with its load (`LoadedModel.family`, `.call_tokens`), and whether the prompt opens the
thinking block comes back with the admission (`runtime.events.ReasoningOpen`).

A generation needs a model that writes ("chat" in `LoadedModel.capabilities`). An
encoder-only model — a BERT-style embedder, a reranker — does not: its attention sees the
whole input at once, so it has no next token to give, and llama.cpp would answer noise.
Such a request is a 400 (`GenerationUnsupported`) in the dialect's own shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runtime.chat.families import Family
from runtime.engine.api import LoadedModel
from runtime.errors import GenerationUnsupported, shown
from runtime.events import ChatMessage, ConstraintSpec, GenerationRequest, ToolCall
from runtime.server.request.fields import Sampling, refuse
from runtime.server.request.reply_format import tool_plan
from runtime.server.state import ServerLimits

# Template variables a request may not replace.
RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token",
                             "eos_token"})


@dataclass(frozen=True)
class ReplyOptions:
    """How a request's chat replies are read. `thinks`: a reply may open with thinking (not
    when a schema or grammar holds it from its first token)."""

    family: Family
    parse_calls: bool = False
    tools: tuple[dict[str, Any], ...] = ()  # the request's: they type bare argument values
    thinks: bool = True


@dataclass(frozen=True)
class Ask:
    """One request in the engine's terms: chat `messages` or a raw `prompt`, checked by the
    dialect's schema. `tools` are `function_json`s; `tool_choice` "auto", "none",
    "required" or a function's name; `constraint` the reply's form (already checked);
    `tools_at`: the dialect's tools and tool-choice fields, for the 400s of the plan."""

    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | tuple[int, ...] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool | None = None
    constraint: ConstraintSpec | None = None
    logprobs: int | None = None
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    truncate_middle: bool = False
    tools_at: tuple[str, str] = ("tools", "tool_choice")

    def generation(self, model: LoadedModel,
                   limits: ServerLimits) -> tuple[GenerationRequest, ReplyOptions | None]:
        """The engine's request, and how its reply is read (None: all of it is content)."""
        require_generation(model)
        sampling = self.sampling.params(limits, model.n_ctx)
        if self.messages is None:
            return GenerationRequest(prompt=self.prompt, sampling=sampling, n=self.sampling.n,
                                     truncate_middle=self.truncate_middle,
                                     constraint=self.constraint, logprobs=self.logprobs), None
        family = model.family
        plan = tool_plan(self.tools, self.tool_choice, self.parallel_tool_calls, family,
                         special_tokens=model.call_tokens, at=self.tools_at)
        if self.constraint is not None and plan.forced:
            refuse(self.tools_at[1], "it forces a call, and the reply's form (response_format, "
                   "grammar, json_schema) is forced too: send one of them")
        generation = GenerationRequest(
            messages=self.messages, sampling=sampling, n=self.sampling.n,
            truncate_middle=self.truncate_middle, constraint=self.constraint or plan.constraint,
            logprobs=self.logprobs, tools=plan.tools, template_kwargs=self.template_kwargs)
        if family.reasoning == "none" and not plan.parse_calls:
            return generation, None
        return generation, ReplyOptions(family, plan.parse_calls, plan.tools,
                                        thinks=self.constraint is None)


def require_generation(model: LoadedModel) -> None:
    """`GenerationUnsupported` (400) unless `model` writes text."""
    if "chat" in model.capabilities:
        return
    name, arch = shown(model.name), shown(model.architecture)
    if "embeddings" in model.capabilities:
        raise GenerationUnsupported(
            f"{name} is an embedding model ({arch}): it makes embeddings (POST /v1/embeddings, "
            "/api/embed) but cannot write text; ask a chat model")
    raise GenerationUnsupported(
        f"{name} ({arch}) cannot write text: it is not a decoder (a reranker or an encoder); "
        "ask a chat model")


def tool_call(name: str, arguments: str | dict[str, Any], call_id: str | None,
              where: str) -> ToolCall:
    """A call an assistant message carries back (a tools round trip): its arguments as JSON
    text of an object, whether the client sent text (OpenAI) or an object (Ollama).

    >>> tool_call("f", {"x": 1}, "call_1", "messages.1.tool_calls.0").arguments
    '{"x": 1}'
    """
    if not isinstance(arguments, str):
        return ToolCall(name, json.dumps(arguments, ensure_ascii=False), call_id or "")
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        refuse(f"{where}.arguments", "the arguments are not JSON text")
    if not isinstance(parsed, dict):
        refuse(f"{where}.arguments", "the arguments must be a JSON object")
    return ToolCall(name, arguments or "{}", call_id or "")


def template_kwargs(effort: str | None = None, thinking: bool | None = None,
                    more: dict[str, Any] | None = None,
                    at: str = "chat_template_kwargs") -> tuple[tuple[str, Any], ...]:
    """The template variables of a request: `reasoning_effort` (gpt-oss reads it),
    `enable_thinking` (Qwen3's switch), and any more a client sets itself."""
    kwargs: dict[str, Any] = {}
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    reserved = sorted(RESERVED_KWARGS & set(more or {}))
    if reserved:
        refuse(at, f"{reserved[0]!r} is set by the server, not by chat_template_kwargs")
    kwargs.update(more or {})
    return tuple(kwargs.items())
