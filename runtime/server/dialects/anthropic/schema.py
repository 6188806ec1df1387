"""Request bodies of Anthropic's Messages API, read into an `Ask`
(`runtime.server.request.ask`).

    >>> body = MessagesRequest.model_validate({"model": "m", "max_tokens": 64,
    ...     "system": "Be brief.", "stop_sequences": ["###"],
    ...     "messages": [{"role": "user", "content": "Hi"}]})
    >>> ask = body.ask(ServerLimits())
    >>> [m.role for m in ask.messages], ask.sampling.max_tokens, ask.sampling.fields.stop
    (['system', 'user'], 64, ['###'])

Blocks: `text`; an assistant's `thinking` (its reasoning, handed to templates that keep it;
`redacted_thinking` is dropped) and `tool_use` (a call); a user's `tool_result` (one tool
message per result, in order, named after the call it answers; `is_error` results are
prefixed "Error: "). `image` blocks of user messages become the message's images (base64, or a URL
when the server allows remote images); `document` blocks are refused, as are server tools (web
search, bash …: only custom tools with an `input_schema`) and a final assistant message
(Anthropic's "prefill": the chat template would close that turn, not continue it).
`tool_choice`: auto, any (a call to some tool), tool (that one), none;
`disable_parallel_tool_use`. `thinking`: enabled (adaptive, between_tools) / disabled
switches the template's `enable_thinking`; `budget_tokens` and `display` are accepted but
not enforced (max_tokens bounds the whole reply, thinking included). `output_config.format`
(a JSON schema) is the reply's form, by constrained decoding; `output_config.effort` goes to
the template as `reasoning_effort`. `max_tokens: 0` only prefills the prompt (Anthropic's
cache pre-warming: here the prefix cache), answering an empty message. `temperature`,
`top_p`, `top_k` are read (recent SDKs send them through `extra_body`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from runtime.events import INT32_MAX, ChatMessage
from runtime.server.request.ask import Ask, template_kwargs, tool_call
from runtime.server.request.fields import (
    STRICT,
    Sampling,
    SamplingFields,
    Temperature,
    Text,
    TopK,
    TopP,
    refuse,
)
from runtime.server.request.images import image_from_base64, image_from_url
from runtime.server.request.reply_format import FunctionName, function_json, schema_constraint
from runtime.server.state import ServerLimits

_STRICT = STRICT


class ImageSource(BaseModel):
    """An image block's source: `{"type": "base64", "media_type": "image/png", "data": ...}`
    or `{"type": "url", "url": ...}` (fetched only with --allow-remote-images)."""

    model_config = _STRICT
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None

    def image(self, where: str, limits: ServerLimits) -> bytes:
        if self.type == "base64":
            if not self.data:
                refuse(where, "a base64 image source needs data")
            return image_from_base64(self.data, where=where)
        if not self.url:
            refuse(where, "a url image source needs a url")
        return image_from_url(self.url, where=where, allow_remote=limits.allow_remote_images)


class Block(BaseModel):
    """One content block; which fields matter depends on `type` (read in `_blocks`)."""

    model_config = _STRICT
    type: str
    text: Text | None = None
    id: Text | None = None
    name: Text | None = None
    input: dict[str, Any] | None = None
    tool_use_id: Text | None = None
    content: Text | list[Block] | None = None
    is_error: bool = False
    thinking: Text | None = None
    source: ImageSource | None = None  # an image block's


class MessageIn(BaseModel):
    model_config = _STRICT
    role: Literal["user", "assistant"]
    content: Text | list[Block]


class ToolDef(BaseModel):
    model_config = _STRICT
    name: FunctionName
    description: Text | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None

    def to_json(self, where: str) -> dict[str, Any]:
        if self.type not in (None, "custom") or self.input_schema is None:
            refuse(where, f"tool {self.name!r} is a server tool ({self.type}); only custom tools "
                   "with an input_schema are supported")
        return function_json(self.name, self.description, self.input_schema)


class ToolChoiceIn(BaseModel):
    model_config = _STRICT
    type: Literal["auto", "any", "tool", "none"]
    name: Text | None = None
    disable_parallel_tool_use: bool | None = None

    def how(self) -> str:
        """"auto", "none", "required" or the tool's name."""
        if self.type == "tool":
            if not self.name:
                refuse("tool_choice.name", "tool_choice of type tool needs the tool's name")
            return self.name
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class ThinkingIn(BaseModel):
    model_config = _STRICT
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None


class OutputFormat(BaseModel):
    model_config = _STRICT
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = _STRICT
    effort: Text | None = None
    format: OutputFormat | None = None


class MessagesBody(BaseModel):
    """What `/v1/messages` and `/v1/messages/count_tokens` share."""

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[MessageIn], Field(min_length=1)]
    system: Text | list[Block] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None
    output_config: OutputConfig | None = None

    def ask(self, limits: ServerLimits) -> Ask:
        messages: list[ChatMessage] = []
        if self.system:
            messages.append(ChatMessage("system", _text_of(self.system, "system")))
        names: dict[str, str] = {}  # tool_use id → the tool's name (tool results carry ids)
        for i, message in enumerate(self.messages):
            messages += _translate(message, f"messages.{i}", names, limits)
        if self.messages[-1].role == "assistant":
            refuse(f"messages.{len(self.messages) - 1}",
                   "a final assistant message (prefill) is not supported: end with a user message")
        choice = self.tool_choice
        config = self.output_config
        constraint = None
        if config is not None and config.format is not None:
            constraint = schema_constraint("output_config.format", config.format.schema_)
        return Ask(messages=tuple(messages), sampling=self.sampling(),
                   tools=tuple(t.to_json(f"tools.{i}") for i, t in enumerate(self.tools or ())),
                   tool_choice=choice.how() if choice is not None else "auto",
                   parallel_tool_calls=None if choice is None or
                   choice.disable_parallel_tool_use is None
                   else not choice.disable_parallel_tool_use,
                   constraint=constraint,
                   template_kwargs=template_kwargs(
                       config.effort if config is not None else None,
                       None if self.thinking is None else self.thinking.type != "disabled",
                       at="thinking"))

    def sampling(self) -> Sampling:
        return Sampling()


class MessagesRequest(MessagesBody):
    max_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)]  # 0: prefill only (warms the cache)
    stop_sequences: list[Text] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # accepted, unused

    def sampling(self) -> Sampling:
        fields = SamplingFields(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                stop=self.stop_sequences)
        return Sampling(fields, max_tokens=max(1, self.max_tokens), stop_at="stop_sequences")


def _text_of(content: str | list[Block], where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for j, block in enumerate(content):
        if block.type != "text" or block.text is None:
            refuse(f"{where}.{j}", f"a {block.type} block is not allowed here: only text")
        parts.append(block.text)
    return "".join(parts)


def _translate(message: MessageIn, where: str, names: dict[str, str],
               limits: ServerLimits) -> list[ChatMessage]:
    """One Anthropic message as chat messages: an assistant turn (text, thinking, calls),
    or a user turn's tool results (one tool message each) followed by its text."""
    if isinstance(message.content, str):
        return [ChatMessage(message.role, message.content)]
    text: list[str] = []
    images: list[bytes] = []
    thinking: list[str] = []
    calls = []
    results: list[ChatMessage] = []
    for j, block in enumerate(message.content):
        at = f"{where}.content.{j}"
        kind = block.type
        if kind == "text" and block.text is not None:
            text.append(block.text)
        elif kind == "image" and message.role == "user":
            if block.source is None:
                refuse(at, "an image block needs a source")
            images.append(block.source.image(at, limits))
        elif kind in ("image", "document", "search_result"):
            refuse(at, f"{kind} blocks are not supported here: only text (and images from "
                   "the user)")
        elif message.role == "assistant" and kind == "thinking":
            thinking.append(block.thinking or "")
        elif message.role == "assistant" and kind == "redacted_thinking":
            continue
        elif message.role == "assistant" and kind == "tool_use":
            if not block.id or not block.name:
                refuse(at, "a tool_use block needs an id and a name")
            names[block.id] = block.name
            calls.append(tool_call(block.name, block.input or {}, block.id, at))
        elif message.role == "user" and kind == "tool_result":
            if not block.tool_use_id:
                refuse(at, "a tool_result block needs the tool_use_id it answers")
            output = _text_of(block.content or "", f"{at}.content")
            results.append(ChatMessage("tool", f"Error: {output}" if block.is_error else output,
                                       tool_call_id=block.tool_use_id,
                                       name=names.get(block.tool_use_id)))
        else:
            refuse(at, f"a {kind} block is not allowed in a {message.role} message")
    if message.role == "assistant":
        return [ChatMessage("assistant", "".join(text), tool_calls=tuple(calls),
                            reasoning="".join(thinking) if thinking else None)]
    if text or images or not results:
        results.append(ChatMessage("user", "".join(text), images=tuple(images)))
    return results
