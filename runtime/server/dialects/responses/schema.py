"""Request bodies of OpenAI's Responses API, read into an `Ask` (`runtime.server.request.ask`).

    >>> body = ResponsesRequest.model_validate({"model": "m", "instructions": "Be brief.",
    ...     "input": "Hi", "max_output_tokens": 32})
    >>> ask = body.ask(ServerLimits())
    >>> [m.role for m in ask.messages], ask.sampling.max_tokens
    (['system', 'user'], 32)

`input` is text (one user message) or a list of items: messages (`role` user, system,
developer or assistant; content text or `input_text` / `output_text` parts), `function_call`
items (an assistant's calls: consecutive ones form one assistant turn), `function_call_output`
items (the results, one tool message each, named after their call) and `reasoning` items (an
assistant's thinking, kept for the next assistant turn). Images, files, `item_reference`
and tools other than `function` are refused.

Nothing is stored (`store: false` only): `store: true`, `previous_response_id`,
`conversation` and `background` are 400s that say so (a missing `store` means not stored).
`text.format` is the reply's form (json_object / json_schema, by constrained decoding),
`reasoning.effort` goes to the template (gpt-oss reads it), `truncation: "auto"` drops older
turns instead of failing. `include: ["message.output_text.logprobs"]` asks for the tokens'
log-probabilities (with `top_logprobs` alternatives each, 0-20), as OpenAI's API does:

    >>> ResponsesRequest.model_validate({"model": "m", "input": "Hi",
    ...     "include": ["message.output_text.logprobs"], "top_logprobs": 2}).ask(ServerLimits()).logprobs
    2

Other `include` values name output this server never makes (web search results, encrypted
reasoning, …) and are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from runtime.events import ChatMessage
from runtime.server.request.ask import Ask, template_kwargs, tool_call
from runtime.server.request.fields import (
    STRICT,
    Count,
    Sampling,
    SamplingFields,
    Temperature,
    Text,
    TopLogprobs,
    TopP,
    refuse,
)
from runtime.server.request.images import image_from_url
from runtime.server.request.reply_format import FunctionName, function_json, schema_constraint
from runtime.server.state import ServerLimits

_STRICT = STRICT
NOT_STORED = ("responses are not stored on this server (store: false only): send the whole "
              "conversation in input")
LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for them


class Part(BaseModel):
    model_config = _STRICT
    type: str
    text: Text | None = None
    image_url: str | None = None  # input_image: a data: URI (or a URL, if the server fetches)
    detail: str | None = None


class InputItem(BaseModel):
    """A message, a function call, a call's output or a reasoning item (by `type`)."""

    model_config = _STRICT
    type: str | None = None
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: Text | list[Part] | None = None
    call_id: Text | None = None
    name: Text | None = None
    arguments: Text | None = None
    output: Text | list[Part] | None = None
    summary: list[Part] | None = None


class FunctionTool(BaseModel):
    model_config = _STRICT
    type: str
    name: FunctionName | None = None
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def to_json(self, where: str) -> dict[str, Any]:
        if self.type != "function" or not self.name:
            refuse(where, f"tools of type {self.type!r} are not supported: only function tools")
        return function_json(self.name, self.description, self.parameters)


class NamedTool(BaseModel):
    model_config = _STRICT
    type: str
    name: Text | None = None


class TextFormat(BaseModel):
    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    name: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = _STRICT
    format: TextFormat | None = None


class ReasoningConfig(BaseModel):
    model_config = _STRICT
    effort: Text | None = None
    summary: Text | None = None


class ResponsesRequest(BaseModel):
    model_config = _STRICT
    model: Annotated[str, Field(min_length=1)]
    input: Text | list[InputItem]
    instructions: Text | None = None
    max_output_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    metadata: dict[str, Any] | None = None
    include: list[Text] | None = None
    top_logprobs: TopLogprobs | None = None

    @property
    def logprobs(self) -> bool:
        """Whether the reply carries its tokens' log-probabilities."""
        return LOGPROBS in (self.include or ())

    def check_not_stored(self) -> None:
        if self.store:
            refuse("store", NOT_STORED)
        if self.previous_response_id is not None:
            refuse("previous_response_id", "responses are not stored on this server (store: "
                   "false only), so previous_response_id names none: send the earlier turns "
                   "in input")
        if self.conversation is not None:
            refuse("conversation", NOT_STORED)
        if self.background:
            refuse("background", "background responses need storing them, which this server "
                   "does not do: leave background out")

    def ask(self, limits: ServerLimits) -> Ask:
        self.check_not_stored()
        messages: list[ChatMessage] = []
        if self.instructions:
            messages.append(ChatMessage("system", self.instructions))
        if isinstance(self.input, str):
            messages.append(ChatMessage("user", self.input))
        else:
            messages += _messages(self.input, limits)
        if not messages:
            refuse("input", "the input holds no message")
        form = self.text.format if self.text is not None else None
        constraint = None
        if form is not None and form.type != "text":
            constraint = schema_constraint("text.format", form.schema_ if form.type ==
                                           "json_schema" else None)
        if self.top_logprobs and not self.logprobs:
            refuse("top_logprobs", f"top_logprobs needs include: [\"{LOGPROBS}\"] (the "
                   "log-probabilities are sent only when asked for)")
        return Ask(messages=tuple(messages),
                   sampling=Sampling(SamplingFields(temperature=self.temperature,
                                                    top_p=self.top_p),
                                     max_tokens=self.max_output_tokens,
                                     max_tokens_at="max_output_tokens"),
                   tools=tuple(t.to_json(f"tools.{i}") for i, t in enumerate(self.tools or ())),
                   tool_choice=_tool_choice(self.tool_choice),
                   parallel_tool_calls=self.parallel_tool_calls, constraint=constraint,
                   logprobs=(self.top_logprobs or 0) if self.logprobs else None,
                   template_kwargs=template_kwargs(
                       self.reasoning.effort if self.reasoning is not None else None),
                   truncate_middle=self.truncation == "auto")


def _tool_choice(choice: str | NamedTool | None) -> str:
    if choice is None or isinstance(choice, str):
        return choice or "auto"
    if choice.type != "function" or not choice.name:
        refuse("tool_choice", f"tool_choice of type {choice.type!r} is not supported: "
               "auto, none, required or a function by name")
    return choice.name


def _text(content: str | list[Part] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, part in enumerate(content):
        if part.type not in ("input_text", "output_text", "text", "summary_text",
                             "reasoning_text") or part.text is None:
            refuse(f"{where}.{j}", f"content of type {part.type!r} is not supported: only text")
        parts.append(part.text)
    return "".join(parts)


def _content(content: str | list[Part] | None, where: str,
             limits: ServerLimits) -> tuple[str, tuple[bytes, ...]]:
    """A message's text and its `input_image`s."""
    if not isinstance(content, list) or not any(p.type == "input_image" for p in content):
        return _text(content, where), ()
    texts: list[str] = []
    images: list[bytes] = []
    for j, part in enumerate(content):
        if part.type == "input_image":
            if not part.image_url:
                refuse(f"{where}.{j}", "an input_image needs an image_url (a data: URI); "
                       "file_id is not supported")
            images.append(image_from_url(part.image_url, where=f"{where}.{j}",
                                         allow_remote=limits.allow_remote_images))
        else:
            texts.append(_text([part], f"{where}.{j}"))
    return "".join(texts), tuple(images)


def _messages(items: list[InputItem], limits: ServerLimits) -> list[ChatMessage]:
    """The chat messages of an input item list (module doc)."""
    out: list[dict[str, Any]] = []  # ChatMessage's fields, while calls may still join
    names: dict[str, str] = {}  # call_id → function name
    reasoning: list[str] = []
    open_calls = False  # the last message is an assistant turn that function calls may join

    def thought() -> str | None:
        text = "".join(reasoning) if reasoning else None
        reasoning.clear()
        return text

    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.type or "message"
        if kind == "message":
            if item.role is None:
                refuse(f"{where}.role", "Field required")
            text, images = _content(item.content, f"{where}.content", limits)
            if images and item.role != "user":
                refuse(f"{where}.content", "only user messages may carry images")
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": text, "images": images,
                        "reasoning": thought() if role == "assistant" else None})
            open_calls = role == "assistant"
        elif kind == "function_call":
            if not item.call_id or not item.name:
                refuse(where, "a function_call item needs a call_id and a name")
            names[item.call_id] = item.name
            if not open_calls:
                out.append({"role": "assistant", "content": "", "reasoning": thought()})
                open_calls = True
            out[-1].setdefault("tool_calls", []).append(
                tool_call(item.name, item.arguments or "{}", item.call_id, where))
        elif kind == "function_call_output":
            if not item.call_id:
                refuse(where, "a function_call_output item needs the call_id it answers")
            out.append({"role": "tool", "content": _text(item.output, f"{where}.output"),
                        "tool_call_id": item.call_id, "name": names.get(item.call_id)})
            open_calls = False
        elif kind == "reasoning":
            reasoning.append(_text(item.content, f"{where}.content")
                             or _text(item.summary, f"{where}.summary"))
        elif kind == "item_reference":
            refuse(where, NOT_STORED)
        else:
            refuse(where, f"input items of type {kind!r} are not supported")
    return [ChatMessage(m["role"], m["content"], tool_calls=tuple(m.get("tool_calls", ())),
                        tool_call_id=m.get("tool_call_id"), name=m.get("name"),
                        reasoning=m.get("reasoning"), images=m.get("images", ()))
            for m in out]
