"""Request bodies of the OpenAI-compatible routes, and their translation to the engine's request.

Like OpenAI's API, unknown fields are ignored; unlike a lax parser, wrong *types* are refused
(`"max_tokens": "10"` is a 400, not 10). Values are checked where the engine defines them
(`SamplingParams`), plus the server's own caps (`ServerLimits`).

    >>> body = ChatCompletionRequest.model_validate(
    ...     {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stop": "\\n"})
    >>> body.to_generation(ServerLimits(), n_ctx=4096, n_vocab=32000).sampling.stop
    ('\\n',)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import SettingsError
from runtime.events import ChatMessage, GenerationRequest, SamplingParams
from runtime.server.state import ServerLimits

_STRICT = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

Role = Literal["system", "developer", "user", "assistant", "tool"]


class TextPart(BaseModel):
    model_config = _STRICT
    type: str
    text: str | None = None


class ChatMessageIn(BaseModel):
    model_config = _STRICT
    role: Role
    content: str | list[TextPart] | None = None

    def to_message(self) -> ChatMessage:
        if isinstance(self.content, list):
            parts = []
            for part in self.content:
                if part.type != "text" or part.text is None:
                    raise SettingsError(
                        f"message content of type {part.type!r} is not supported: only text")
                parts.append(part.text)
            text = "".join(parts)
        else:
            text = self.content or ""
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(role, text)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _GenerationBody(BaseModel):
    """Fields chat and text completions share."""

    model_config = _STRICT
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repeat_penalty: float | None = None  # llama.cpp's multiplicative penalty
    repeat_last_n: int | None = None
    truncate_middle: bool = False  # Outrider: drop older turns instead of failing on overflow

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _sampling(self, limits: ServerLimits, n_ctx: int, max_tokens: int | None) -> SamplingParams:
        if max_tokens is None:
            max_tokens = min(limits.default_max_tokens, n_ctx)
        elif max_tokens > limits.max_tokens:
            raise SettingsError(
                f"max_tokens {max_tokens} is over this server's limit of {limits.max_tokens}")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > limits.max_stop:
            raise SettingsError(f"at most {limits.max_stop} stop strings, not {len(stops)}")
        if any(stop == "" for stop in stops):
            raise SettingsError("stop strings must not be empty")
        if not 1 <= self.n <= limits.max_n:
            raise SettingsError(f"n must be between 1 and {limits.max_n}, not {self.n}")
        if self.seed is not None and not -1 <= self.seed < 2**63:
            raise SettingsError(f"seed must be a 64-bit integer, not {self.seed}")
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
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def to_generation(self, limits: ServerLimits, *, n_ctx: int, n_vocab: int) -> GenerationRequest:
        if self.logprobs:
            raise SettingsError("logprobs are not supported by this server")
        if self.tools:
            raise SettingsError("tool calling is not supported by this server")
        if self.response_format is not None and self.response_format.get("type") != "text":
            raise SettingsError("only response_format {'type': 'text'} is supported")
        max_tokens = self.max_completion_tokens if self.max_tokens is None else self.max_tokens
        return GenerationRequest(
            messages=tuple(message.to_message() for message in self.messages),
            sampling=self._sampling(limits, n_ctx, max_tokens),
            n=self.n, truncate_middle=self.truncate_middle)


TokenIds = list[int]


class CompletionRequest(_GenerationBody):
    prompt: str | TokenIds | list[str] | list[TokenIds]
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None

    def to_generation(self, limits: ServerLimits, *, n_ctx: int, n_vocab: int) -> GenerationRequest:
        if self.echo:
            raise SettingsError("echo is not supported by this server")
        if self.suffix:
            raise SettingsError("suffix (fill-in-the-middle) is not supported by this server")
        if self.logprobs is not None:
            raise SettingsError("logprobs are not supported by this server")
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
                raise SettingsError(
                    f"token id {bad[0]} is outside the model's vocabulary (0..{n_vocab - 1})")
            engine_prompt = tuple(ids)
        return GenerationRequest(prompt=engine_prompt,
                                 sampling=self._sampling(limits, n_ctx, self.max_tokens),
                                 n=self.n, truncate_middle=self.truncate_middle)
