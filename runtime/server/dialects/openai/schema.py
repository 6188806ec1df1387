"""Request bodies of OpenAI's chat and text completions, read into an `Ask`
(`runtime.server.request.ask`; the field types and their ranges in
`runtime.server.request.fields`, the reply's shape — `response_format`, `grammar`,
`json_schema`, `tools` — in `runtime.server.request.reply_format`).

    >>> body = ChatCompletionRequest.model_validate(
    ...     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stop": "\\n"})
    >>> body.ask(ServerLimits()).sampling.params(ServerLimits(), n_ctx=4096).stop
    ('\\n',)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from runtime.errors import SettingsError
from runtime.events import INT32_MAX, ChatMessage
from runtime.server.request.ask import Ask, template_kwargs, tool_call
from runtime.server.request.fields import (
    STRICT,
    Count,
    Sampling,
    SamplingFields,
    Text,
    TopLogprobs,
    refuse,
)
from runtime.server.request.images import image_from_url
from runtime.server.request.reply_format import (
    ResponseFormat,
    ToolChoice,
    ToolIn,
    choice_name,
    format_constraint,
)
from runtime.server.state import ServerLimits

_STRICT = STRICT
MAX_IMAGE_URL = 32 * 1024 * 1024  # a data: URI of the largest image the server takes

Role = Literal["system", "developer", "user", "assistant", "tool"]


class ImageUrl(BaseModel):
    model_config = _STRICT
    url: Annotated[str, Field(max_length=MAX_IMAGE_URL)]
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the projector decides


class TextPart(BaseModel):
    """A content part: text, or an image (`image_url`: a data: URI, or http(s) when the
    server allows remote images; `runtime.server.request.images`)."""

    model_config = _STRICT
    type: str
    text: Text | None = None
    image_url: ImageUrl | Annotated[str, Field(max_length=MAX_IMAGE_URL)] | None = None


class FunctionCallIn(BaseModel):
    model_config = _STRICT
    name: Text
    arguments: Text | dict[str, Any] = "{}"  # OpenAI sends JSON text; some clients an object


class ToolCallIn(BaseModel):
    """One call of an assistant message that the client sends back (a tools round trip)."""

    model_config = _STRICT
    id: Text | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(BaseModel):
    model_config = _STRICT
    role: Role
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_call_id: Text | None = None  # role "tool": which call this is the result of
    tool_calls: list[ToolCallIn] | None = None  # role "assistant"
    reasoning_content: Text | None = None  # role "assistant": its thinking

    def to_message(self, where: str = "messages", *,
                   allow_remote_images: bool = False) -> ChatMessage:
        images: list[bytes] = []
        if isinstance(self.content, list):
            parts = []
            for j, part in enumerate(self.content):
                if part.type == "image_url" and part.image_url is not None:
                    url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
                    images.append(image_from_url(url, where=f"{where}.content.{j}",
                                                 allow_remote=allow_remote_images))
                    continue
                if part.type != "text" or part.text is None:
                    raise SettingsError(f"message content of type {part.type!r} is not "
                                        "supported: only text and image_url")
                parts.append(part.text)
            text = "".join(parts)
        else:
            text = self.content or ""
        if images and self.role != "user":
            refuse(f"{where}.content", "only user messages may carry images")
        role = "system" if self.role == "developer" else self.role
        if self.tool_calls and role != "assistant":
            refuse(f"{where}.tool_calls", "only assistant messages carry tool_calls")
        calls = tuple(tool_call(call.function.name, call.function.arguments, call.id,
                                f"{where}.tool_calls.{i}.function")
                      for i, call in enumerate(self.tool_calls or ()))
        return ChatMessage(role, text, tool_calls=calls, tool_call_id=self.tool_call_id,
                           name=self.name if role == "tool" else None,
                           reasoning=self.reasoning_content if role == "assistant" else None,
                           images=tuple(images))


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _GenerationBody(SamplingFields):
    """Fields chat and text completions share (the sampling table's among them)."""

    model: str | None = None
    # LM Studio's: seconds the model stays loaded once idle (0: unloaded after this reply)
    ttl: Annotated[float, Field(ge=0.0, le=10 * 365 * 86400)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Count | None = None
    n: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1  # ServerLimits.max_n, ≤ MAX_SAMPLES
    truncate_middle: bool = False  # Outrider: drop older turns instead of failing on overflow
    # The reply's form: OpenAI's response_format, llama-server's grammar (GBNF) / json_schema.
    response_format: ResponseFormat | None = None
    grammar: Text | None = None
    json_schema: dict[str, Any] | bool | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _sampling(self, max_tokens: int | None) -> Sampling:
        return Sampling(self, max_tokens=max_tokens, n=self.n)


class ChatCompletionRequest(_GenerationBody):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_completion_tokens: Count | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: Text | None = None  # handed to the template (gpt-oss reads it)
    chat_template_kwargs: dict[str, Any] | None = None  # more template variables

    def ask(self, limits: ServerLimits) -> Ask:
        if self.top_logprobs is not None and not self.logprobs:
            refuse("top_logprobs", "top_logprobs needs logprobs: true")
        messages = tuple(message.to_message(f"messages.{i}",
                                            allow_remote_images=limits.allow_remote_images)
                         for i, message in enumerate(self.messages))
        max_tokens = self.max_completion_tokens if self.max_tokens is None else self.max_tokens
        return Ask(messages=messages, sampling=self._sampling(max_tokens),
                   tools=tuple(tool.to_json() for tool in self.tools or ()),
                   tool_choice=choice_name(self.tool_choice),
                   parallel_tool_calls=self.parallel_tool_calls,
                   constraint=format_constraint(self.response_format, self.grammar,
                                                self.json_schema),
                   logprobs=(self.top_logprobs or 0) if self.logprobs else None,
                   template_kwargs=template_kwargs(self.reasoning_effort,
                                                   more=self.chat_template_kwargs),
                   truncate_middle=self.truncate_middle)


TokenIds = list[int]


class CompletionRequest(_GenerationBody):
    prompt: Text | TokenIds | list[Text] | list[TokenIds]
    echo: bool = False
    suffix: str | None = None
    logprobs: TopLogprobs | None = None  # the legacy API's: how many top tokens (0: the sampled one)
    best_of: int | None = None

    def ask(self, limits: ServerLimits, n_vocab: int) -> Ask:
        if self.echo:
            raise SettingsError("echo is not supported by this server")
        if self.suffix:
            raise SettingsError("suffix (fill-in-the-middle) is not supported by this server")
        if self.best_of not in (None, self.n):
            raise SettingsError("best_of is not supported by this server")
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise SettingsError("one prompt per request: send a string or a list of token ids")
            prompt = prompt[0]
        engine_prompt: str | tuple[int, ...]
        if isinstance(prompt, str):
            engine_prompt = prompt
        else:
            ids = [token for token in prompt if isinstance(token, int)]
            if not ids:
                raise SettingsError("the prompt is an empty list of token ids")
            bad = [token for token in ids if not 0 <= token < n_vocab]
            if bad:
                refuse("prompt",
                       f"token id {bad[0]} is outside the model's vocabulary (0..{n_vocab - 1})")
            engine_prompt = tuple(ids)
        return Ask(prompt=engine_prompt, sampling=self._sampling(self.max_tokens),
                   constraint=format_constraint(self.response_format, self.grammar,
                                                self.json_schema),
                   logprobs=self.logprobs, truncate_middle=self.truncate_middle)
