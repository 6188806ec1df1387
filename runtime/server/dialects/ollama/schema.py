"""Request bodies of Ollama's API, read into an `Ask` (`runtime.server.request.ask`).

    >>> body = OllamaChatRequest.model_validate({"model": "m", "messages": [
    ...     {"role": "user", "content": "Hi"}], "format": "json",
    ...     "options": {"num_predict": 32, "temperature": 0, "stop": ["\\n"]}})
    >>> ask = body.ask(ServerLimits(), n_ctx=2048)
    >>> ask.sampling.max_tokens, ask.sampling.fields.temperature, ask.sampling.fields.stop, ask.constraint.kind
    (32, 0.0, ['\\n'], 'json_object')

`options`: num_predict (−1 and −2, Ollama's "until the context ends", mean the server's
default, cut to the context), temperature, top_k, top_p, min_p, seed (negative: random),
stop, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty. `num_ctx` may not
exceed the loaded model's context (the server does not reload per request; a smaller one is
accepted and the loaded context used). Load-time options (num_gpu, num_thread, num_batch,
use_mmap, …) are the load's business (POST /api/load) and are ignored here, as other unknown
options are (Ollama only warns about them); sampling options Outrider does not have
(mirostat, typical_p, tfs_z) are refused unless they are their neutral values. Sampling
defaults are Outrider's own (`SamplingParams`), the same as for every other client.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from runtime.events import ChatMessage
from runtime.server.models.router import KEEP
from runtime.server.request.ask import Ask, template_kwargs, tool_call
from runtime.server.request.fields import (
    STRICT,
    Sampling,
    SamplingFields,
    Text,
    TopLogprobs,
    refuse,
)
from runtime.server.request.images import image_from_base64
from runtime.server.request.reply_format import ToolIn, schema_constraint
from runtime.server.state import ServerLimits

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def images(data: list[str] | None, where: str) -> tuple[bytes, ...]:
    """An Ollama message's base64 images, read as every dialect's are
    (`runtime.server.request.images`; an error names `where`.N)."""
    return tuple(image_from_base64(item, where=f"{where}.{i}") for i, item in enumerate(data or ()))


def keep_alive_s(value: float | int | str | None) -> Any:
    """Ollama's `keep_alive` as the router's idle TTL in seconds: a number of seconds or a Go
    duration ("5m", "1h30m"); 0 unloads the model after the reply, a negative value keeps it
    loaded; absent leaves the model's TTL as it is (`router.KEEP`).

    >>> keep_alive_s("1h30m"), keep_alive_s(0), keep_alive_s("-1"), keep_alive_s(None) is KEEP
    (5400.0, 0.0, None, True)
    """
    if value is None:
        return KEEP
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            negative = text.startswith("-")
            parts = _DURATION.findall(text.lstrip("-"))
            if not parts or "".join(n + u for n, u in parts) != text.lstrip("-"):
                refuse("keep_alive", f"keep_alive {value!r} is not a duration: give seconds "
                       "or a duration such as \"5m\" or \"1h30m\"")
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts) * (-1 if negative else 1)
    else:
        seconds = float(value)
    return None if seconds < 0 else seconds

_STRICT = STRICT


class OllamaOptions(SamplingFields):
    num_ctx: int | None = None
    num_predict: int | None = None
    seed: int | None = None  # negative: random
    # Not in Outrider's sampler: refused unless neutral.
    mirostat: int | None = None
    typical_p: float | None = None
    tfs_z: float | None = None

    def check(self, n_ctx: int) -> None:
        if self.num_ctx is not None and self.num_ctx > n_ctx:
            refuse("options.num_ctx",
                   f"num_ctx {self.num_ctx} is larger than the loaded model's context ({n_ctx}); "
                   "the server does not reload per request: load the model with a larger "
                   "n_ctx (POST /api/load)")
        if self.mirostat not in (None, 0):
            refuse("options.mirostat", "mirostat sampling is not supported; leave it 0")
        for name in ("typical_p", "tfs_z"):
            if getattr(self, name) not in (None, 1.0):
                refuse(f"options.{name}", f"{name} is not supported; leave it 1")

    def sampling(self) -> Sampling:
        predict = self.num_predict
        if predict is not None and predict < 1 and predict not in (-1, -2):
            refuse("options.num_predict", "num_predict must be at least 1 (or -1: until the "
                   "context ends)")
        return Sampling(self, max_tokens=None if predict in (None, -1, -2) else predict,
                        max_tokens_at="options.num_predict", stop_at="options.stop")


class FunctionCall(BaseModel):
    model_config = _STRICT
    name: Text
    arguments: dict[str, Any] | Text = Field(default_factory=dict)


class OllamaToolCall(BaseModel):
    model_config = _STRICT
    id: Text | None = None
    function: FunctionCall


class OllamaMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "user", "assistant", "tool"]
    content: Text = ""
    thinking: Text | None = None
    images: list[str] | None = None  # base64, as Ollama sends them
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: Text | None = None
    tool_call_id: Text | None = None

    def message(self, where: str) -> ChatMessage:
        calls = tuple(tool_call(call.function.name, call.function.arguments, call.id,
                                f"{where}.tool_calls.{i}.function")
                      for i, call in enumerate(self.tool_calls or ()))
        if calls and self.role != "assistant":
            refuse(f"{where}.tool_calls", "only assistant messages carry tool_calls")
        if self.images and self.role != "user":
            refuse(f"{where}.images", "only user messages may carry images")
        tool = self.role == "tool"
        return ChatMessage(self.role, self.content, tool_calls=calls,
                           tool_call_id=self.tool_call_id if tool else None,
                           name=self.tool_name if tool else None,
                           reasoning=(self.thinking or None) if self.role == "assistant" else None,
                           images=images(self.images, f"{where}.images"))


Format = Literal["", "json"] | dict[str, Any]
Think = bool | Literal["low", "medium", "high"]


class _OllamaBody(BaseModel):
    """What chat and generate share."""

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1)]
    stream: bool = True
    options: OllamaOptions | None = None
    format: Format | None = None
    keep_alive: float | int | str | None = None  # the model's idle TTL (keep_alive_s)
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None

    def _ask(self, n_ctx: int, **fields: Any) -> Ask:
        options = self.options or OllamaOptions()
        options.check(n_ctx)
        constraint = None
        if self.format == "json":
            constraint = schema_constraint("format", None)
        elif isinstance(self.format, dict):
            constraint = schema_constraint("format", self.format)
        if self.top_logprobs is not None and not self.logprobs:
            refuse("top_logprobs", "top_logprobs needs logprobs: true")
        return Ask(sampling=options.sampling(), constraint=constraint,
                   logprobs=(self.top_logprobs or 0) if self.logprobs else None,
                   template_kwargs=template_kwargs(
                       self.think if isinstance(self.think, str) else None,
                       self.think if isinstance(self.think, bool) else None), **fields)


class OllamaChatRequest(_OllamaBody):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[ToolIn] | None = None  # Ollama's tools are OpenAI's

    def ask(self, limits: ServerLimits, n_ctx: int) -> Ask:
        messages = tuple(m.message(f"messages.{i}") for i, m in enumerate(self.messages))
        return self._ask(n_ctx, messages=messages,
                         tools=tuple(tool.to_json() for tool in self.tools or ()))


class OllamaGenerateRequest(_OllamaBody):
    prompt: Text = ""
    system: Text | None = None
    suffix: Text | None = None
    template: Text | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None  # base64

    def ask(self, limits: ServerLimits, n_ctx: int) -> Ask:
        """A chat of the system text and the prompt (the model's template applied, as Ollama
        does), or with `raw` the prompt as it is (a text completion)."""
        for name, what in (("suffix", "fill-in-the-middle (suffix) is not supported"),
                           ("template", "a custom template is not supported: the model's own "
                                        "chat template is used (or raw: true)"),
                           ("context", "context (an earlier reply's tokens) is not supported: "
                                       "send the conversation to /api/chat")):
            if getattr(self, name):
                refuse(name, what)
        if not self.raw:
            system = (ChatMessage("system", self.system),) if self.system else ()
            user = ChatMessage("user", self.prompt, images=images(self.images, "images"))
            return self._ask(n_ctx, messages=(*system, user))
        if self.images:
            refuse("images", "images need the model's chat template: leave raw out")
        ask = self._ask(n_ctx, prompt=self.prompt)
        return dataclasses.replace(ask, template_kwargs=())


class _ModelOrName(BaseModel):
    """A body naming a model by `model`, or by `name` as older clients do."""

    model_config = _STRICT
    model: str | None = None
    name: str | None = None  # older clients

    @property
    def asked(self) -> str:
        asked = self.model or self.name
        if not asked:
            refuse("model", "Field required")
        return asked


class OllamaShowRequest(_ModelOrName):
    verbose: bool = False


class OllamaPullRequest(_ModelOrName):
    stream: bool = True
    insecure: bool = False


class OllamaEmbedRequest(BaseModel):
    """`/api/embed`. `truncate` is accepted, but an input longer than the embedding limit is
    refused (400, naming the limit) rather than cut; `dimensions` is refused as for
    `/v1/embeddings`: the model's vectors have one size."""

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1)]
    input: Text | list[Text]
    truncate: bool = True
    options: OllamaOptions | None = None
    keep_alive: float | int | str | None = None
    dimensions: int | None = None

    @property
    def inputs(self) -> list[str]:
        inputs = [self.input] if isinstance(self.input, str) else list(self.input)
        if not inputs:
            refuse("input", "give at least one text to embed (the list is empty)")
        if self.dimensions is not None:
            refuse("dimensions", "the model makes embeddings of one fixed size and Outrider "
                   "does not shorten them; leave dimensions out")
        return inputs


class OllamaEmbeddingsRequest(BaseModel):
    """The older `/api/embeddings`: one `prompt`, one `embedding`."""

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1)]
    prompt: Text
    options: OllamaOptions | None = None
    keep_alive: float | int | str | None = None

