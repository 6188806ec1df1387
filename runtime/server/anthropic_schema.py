"""Request bodies of Anthropic's Messages API, and their translation onto the OpenAI chat
request the engine's request is made from (`runtime.server.dialect`).

    >>> body = MessagesRequest.model_validate({"model": "m", "max_tokens": 64,
    ...     "system": "Be brief.", "stop_sequences": ["###"],
    ...     "messages": [{"role": "user", "content": "Hi"}]})
    >>> fields = body.openai_fields()
    >>> [m["role"] for m in fields["messages"]], fields["max_tokens"], fields["stop"]
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

from pydantic import BaseModel, ConfigDict, Field

from runtime.events import INT32_MAX
from runtime.server.openai_schema import Text
from runtime.server.reply_format import refuse

_STRICT = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

# OpenAI field → the Anthropic field a 400 names.
RENAME = {"stop": "stop_sequences", "chat_template_kwargs": "thinking",
          "parallel_tool_calls": "tool_choice", "response_format": "output_config.format",
          "reasoning_effort": "output_config.effort"}


class ImageSource(BaseModel):
    """An image block's source: `{"type": "base64", "media_type": "image/png", "data": ...}`
    or `{"type": "url", "url": ...}` (fetched only with --allow-remote-images)."""

    model_config = _STRICT
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None

    def data_url(self, where: str) -> str:
        if self.type == "base64":
            if not self.data:
                refuse(where, "a base64 image source needs data")
            return f"data:{self.media_type or 'image/*'};base64,{self.data}"
        if not self.url:
            refuse(where, "a url image source needs a url")
        return self.url


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
    name: Text
    description: Text | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None

    def openai(self, where: str) -> dict[str, Any]:
        if self.type not in (None, "custom") or self.input_schema is None:
            refuse(where, f"tool {self.name!r} is a server tool ({self.type}); only custom tools "
                   "with an input_schema are supported")
        function: dict[str, Any] = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


class ToolChoiceIn(BaseModel):
    model_config = _STRICT
    type: Literal["auto", "any", "tool", "none"]
    name: Text | None = None
    disable_parallel_tool_use: bool | None = None

    def openai(self) -> Any:
        if self.type == "tool":
            if not self.name:
                refuse("tool_choice.name", "tool_choice of type tool needs the tool's name")
            return {"type": "function", "function": {"name": self.name}}
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

    def openai_fields(self) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if self.system:
            messages.append({"role": "system", "content": _text_of(self.system, "system")})
        names: dict[str, str] = {}  # tool_use id → the tool's name (tool results carry ids)
        for i, message in enumerate(self.messages):
            messages += _translate(message, f"messages.{i}", names)
        if self.messages[-1].role == "assistant":
            refuse(f"messages.{len(self.messages) - 1}",
                   "a final assistant message (prefill) is not supported: end with a user message")
        fields: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.tools:
            fields["tools"] = [t.openai(f"tools.{i}") for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice.openai()
            if self.tool_choice.disable_parallel_tool_use is not None:
                fields["parallel_tool_calls"] = not self.tool_choice.disable_parallel_tool_use
        if self.thinking is not None:
            fields["chat_template_kwargs"] = {"enable_thinking": self.thinking.type != "disabled"}
        config = self.output_config
        if config is not None and config.format is not None:
            fields["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": config.format.schema_}}
        if config is not None and config.effort is not None:
            fields["reasoning_effort"] = config.effort
        return fields


class MessagesRequest(MessagesBody):
    max_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)]  # 0: prefill only (warms the cache)
    stop_sequences: list[Text] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # accepted, unused

    def openai_fields(self) -> dict[str, Any]:
        fields = super().openai_fields()
        fields["max_tokens"] = max(1, self.max_tokens)
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.stop_sequences:
            fields["stop"] = list(self.stop_sequences)
        return fields


def _text_of(content: str | list[Block], where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for j, block in enumerate(content):
        if block.type != "text" or block.text is None:
            refuse(f"{where}.{j}", f"a {block.type} block is not allowed here: only text")
        parts.append(block.text)
    return "".join(parts)


def _translate(message: MessageIn, where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI messages: an assistant turn (text, thinking, calls),
    or a user turn's tool results (one tool message each) followed by its text."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    text: list[str] = []
    images: list[dict[str, Any]] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(message.content):
        at = f"{where}.content.{j}"
        kind = block.type
        if kind == "text" and block.text is not None:
            text.append(block.text)
        elif kind == "image" and message.role == "user":
            if block.source is None:
                refuse(at, "an image block needs a source")
            images.append({"type": "image_url", "where": at,
                           "image_url": {"url": block.source.data_url(f"{at}.source")}})
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
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": block.input or {}}})
        elif message.role == "user" and kind == "tool_result":
            if not block.tool_use_id:
                refuse(at, "a tool_result block needs the tool_use_id it answers")
            output = _text_of(block.content or "", f"{at}.content")
            result: dict[str, Any] = {"role": "tool", "tool_call_id": block.tool_use_id,
                                      "content": f"Error: {output}" if block.is_error else output}
            if block.tool_use_id in names:
                result["name"] = names[block.tool_use_id]
            results.append(result)
        else:
            refuse(at, f"a {kind} block is not allowed in a {message.role} message")
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if thinking:
            out["reasoning_content"] = "".join(thinking)
        if calls:
            out["tool_calls"] = calls
        return [out]
    if images:  # as OpenAI content parts: the text, then the images
        return [*results, {"role": "user",
                           "content": [{"type": "text", "text": "".join(text)}, *images]}]
    return results + ([{"role": "user", "content": "".join(text)}] if text or not results else [])
