"""Request bodies of the OpenAI-compatible routes, and their translation to the engine's request.

Like OpenAI's API, unknown fields are ignored; unlike a lax parser, wrong *types* are refused
(`"max_tokens": "10"` is a 400, not 10). Every number is range-checked here, at the edge, so
the 400 names the parameter (`param`) — int32 limits for whatever reaches llama.cpp
(`"top_k": 2**64` used to fail the batched step of every stream); the engine's
`SamplingParams` checks them again for the CLI and the app; then the server's own caps
(`ServerLimits`). Text with a lone surrogate (`"\\ud800"`, valid JSON but not Unicode text)
is refused too: it has no UTF-8 encoding for the tokenizer. The reply's shape —
`response_format`, `grammar`, `json_schema`, `tools` — is read in `runtime.server.reply_format`.

    >>> body = ChatCompletionRequest.model_validate(
    ...     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stop": "\\n"})
    >>> body.to_generation(ServerLimits(), n_ctx=4096, n_vocab=32000).sampling.stop
    ('\\n',)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from runtime.chat.families import PLAIN, Family
from runtime.errors import SettingsError
from runtime.events import (
    INT32_MAX,
    MAX_SAMPLES,
    MAX_TOP_LOGPROBS,
    ChatMessage,
    ConstraintSpec,
    GenerationRequest,
    SamplingParams,
    ToolCall,
)
from runtime.server.image_parts import image_from_url
from runtime.server.reply_format import (
    ResponseFormat,
    ToolChoice,
    ToolIn,
    ToolPlan,
    format_constraint,
    refuse,
    tool_plan,
)
from runtime.server.state import ServerLimits

_STRICT = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)
MAX_IMAGE_URL = 32 * 1024 * 1024  # a data: URI of the largest image the server takes

Role = Literal["system", "developer", "user", "assistant", "tool"]


def _unicode_text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raise ValueError(f"the text holds a lone surrogate ({bad!a}), which is not valid "
                         "Unicode; send the character it stands for") from None
    return value


Text = Annotated[str, AfterValidator(_unicode_text)]
Count = Annotated[int, Field(ge=1, le=INT32_MAX)]  # max_tokens and friends
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]
_refuse = refuse
# Template variables a request's chat_template_kwargs may not replace.
_RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token",
                              "eos_token"})


class ImageUrl(BaseModel):
    model_config = _STRICT
    url: Annotated[str, Field(max_length=MAX_IMAGE_URL)]
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the projector decides


class TextPart(BaseModel):
    """A content part: text, or an image (`image_url`: a data: URI, or http(s) when the
    server allows remote images; `runtime.server.image_parts`)."""

    model_config = _STRICT
    type: str
    text: Text | None = None
    image_url: ImageUrl | Annotated[str, Field(max_length=MAX_IMAGE_URL)] | None = None
    # Where another dialect's request held this image ("messages.0.images.1"), so its error
    # names the client's own field; set by the translations in runtime.server.*_schema.
    where: str | None = None


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
                    images.append(image_from_url(url, where=part.where or f"{where}.content.{j}",
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
            _refuse(f"{where}.content", "only user messages may carry images")
        role = "system" if self.role == "developer" else self.role
        if self.tool_calls and role != "assistant":
            _refuse(f"{where}.tool_calls", "only assistant messages carry tool_calls")
        calls = tuple(_tool_call(call, f"{where}.tool_calls.{i}")
                      for i, call in enumerate(self.tool_calls or ()))
        return ChatMessage(role, text, tool_calls=calls, tool_call_id=self.tool_call_id,
                           name=self.name if role == "tool" else None,
                           reasoning=self.reasoning_content if role == "assistant" else None,
                           images=tuple(images))


def _tool_call(call: ToolCallIn, where: str) -> ToolCall:
    arguments = call.function.arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            _refuse(f"{where}.function.arguments", "the arguments are not JSON text")
        if not isinstance(parsed, dict):
            _refuse(f"{where}.function.arguments", "the arguments must be a JSON object")
        text = arguments or "{}"
    else:
        text = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(call.function.name, text, call.id or "")


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _GenerationBody(BaseModel):
    """Fields chat and text completions share."""

    model_config = _STRICT
    model: str | None = None
    # LM Studio's: seconds the model stays loaded once idle (0: unloaded after this reply)
    ttl: Annotated[float, Field(ge=0.0, le=10 * 365 * 86400)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Count | None = None
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None  # ≥ the vocabulary: off
    min_p: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    seed: Annotated[int, Field(ge=-1, lt=2**63)] | None = None
    stop: Text | list[Text] | None = None
    n: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1  # ServerLimits.max_n, ≤ MAX_SAMPLES
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repeat_penalty: Annotated[float, Field(gt=0.0, le=100.0)] | None = None  # llama.cpp's, multiplicative
    repeat_last_n: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    truncate_middle: bool = False  # Outrider: drop older turns instead of failing on overflow
    # The reply's form: OpenAI's response_format, llama-server's grammar (GBNF) / json_schema.
    response_format: ResponseFormat | None = None
    grammar: Text | None = None
    json_schema: dict[str, Any] | bool | None = None

    def _format(self) -> ConstraintSpec | None:
        return format_constraint(self.response_format, self.grammar, self.json_schema)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _sampling(self, limits: ServerLimits, n_ctx: int, max_tokens: int | None) -> SamplingParams:
        if max_tokens is None:
            max_tokens = min(limits.default_max_tokens, n_ctx)
        elif max_tokens > limits.max_tokens:
            _refuse("max_tokens",
                    f"max_tokens {max_tokens} is over this server's limit of {limits.max_tokens}")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > limits.max_stop:
            _refuse("stop", f"at most {limits.max_stop} stop strings, not {len(stops)}")
        if any(stop == "" for stop in stops):
            _refuse("stop", "stop strings must not be empty")
        max_n = min(limits.max_n, MAX_SAMPLES)
        if not 1 <= self.n <= max_n:
            _refuse("n", f"n must be between 1 and {max_n}, not {self.n}")
        defaults = SamplingParams()
        pick = _pick
        return SamplingParams(
            temperature=pick(self.temperature, defaults.temperature),
            top_k=pick(self.top_k, defaults.top_k),
            top_p=pick(self.top_p, defaults.top_p),
            min_p=pick(self.min_p, defaults.min_p),
            repeat_penalty=pick(self.repeat_penalty, defaults.repeat_penalty),
            frequency_penalty=_penalty("frequency_penalty", self.frequency_penalty),
            presence_penalty=_penalty("presence_penalty", self.presence_penalty),
            penalty_last_n=pick(self.repeat_last_n, defaults.penalty_last_n),
            seed=None if self.seed in (None, -1) else self.seed,  # -1: random, as llama.cpp
            max_tokens=max_tokens,
            stop=tuple(stops),
        )


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _penalty(name: str, value: float | None) -> float:
    if value is None:
        return 0.0
    if not -2.0 <= value <= 2.0:
        raise SettingsError(f"{name} must be between -2 and 2, not {value}")
    return value


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

    def tool_plan(self, family: Family, *, in_reasoning: bool = False,
                  special_tokens: Mapping[str, int] | None = None) -> ToolPlan:
        """What the tools become (`reply_format.tool_plan`)."""
        return tool_plan(self.tools, self.tool_choice, self.parallel_tool_calls, family,
                         in_reasoning=in_reasoning, special_tokens=special_tokens)

    def chat_messages(self, allow_remote_images: bool = False) -> tuple[ChatMessage, ...]:
        return tuple(message.to_message(f"messages.{i}", allow_remote_images=allow_remote_images)
                     for i, message in enumerate(self.messages))

    def tools_json(self) -> tuple[dict[str, Any], ...]:
        """The tools as the template renders them."""
        return tuple(tool.to_json() for tool in self.tools or ())

    def to_generation(self, limits: ServerLimits, *, n_ctx: int, n_vocab: int,
                      family: Family = PLAIN, plan: ToolPlan | None = None) -> GenerationRequest:
        """The engine's request. `family` is the loaded model's template family (tools need
        one with a call format); `plan` its `tool_plan`, when the caller already made it."""
        if self.top_logprobs is not None and not self.logprobs:
            _refuse("top_logprobs", "top_logprobs needs logprobs: true")
        plan = self.tool_plan(family) if plan is None else plan
        constraint = self._format()
        if constraint is not None and plan.forced:
            _refuse("tool_choice", "it forces a call, and response_format (or grammar, "
                    "json_schema) forces the reply's form: send one of them")
        if constraint is None:
            constraint = plan.constraint
        max_tokens = self.max_completion_tokens if self.max_tokens is None else self.max_tokens
        return GenerationRequest(
            messages=self.chat_messages(limits.allow_remote_images), sampling=self._sampling(limits, n_ctx, max_tokens),
            n=self.n, truncate_middle=self.truncate_middle, constraint=constraint,
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            tools=plan.tools, template_kwargs=self.template_kwargs())

    def template_kwargs(self) -> tuple[tuple[str, Any], ...]:
        """`reasoning_effort` and `chat_template_kwargs`, as template variables."""
        kwargs: dict[str, Any] = {}
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
        reserved = sorted(_RESERVED_KWARGS & set(self.chat_template_kwargs or {}))
        if reserved:
            _refuse("chat_template_kwargs",
                    f"{reserved[0]!r} is set by the server, not by chat_template_kwargs")
        kwargs.update(self.chat_template_kwargs or {})
        return tuple(kwargs.items())


TokenIds = list[int]


class CompletionRequest(_GenerationBody):
    prompt: Text | TokenIds | list[Text] | list[TokenIds]
    echo: bool = False
    suffix: str | None = None
    logprobs: TopLogprobs | None = None  # the legacy API's: how many top tokens (0: the sampled one)
    best_of: int | None = None

    def to_generation(self, limits: ServerLimits, *, n_ctx: int, n_vocab: int) -> GenerationRequest:
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
                _refuse("prompt",
                        f"token id {bad[0]} is outside the model's vocabulary (0..{n_vocab - 1})")
            engine_prompt = tuple(ids)
        return GenerationRequest(prompt=engine_prompt,
                                 sampling=self._sampling(limits, n_ctx, self.max_tokens),
                                 n=self.n, truncate_middle=self.truncate_middle,
                                 constraint=self._format(), logprobs=self.logprobs)
