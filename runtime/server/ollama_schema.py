"""Request bodies of Ollama's API, and their translation onto the OpenAI chat request the
engine's request is made from (`runtime.server.dialect`).

    >>> body = OllamaChatRequest.model_validate({"model": "m", "messages": [
    ...     {"role": "user", "content": "Hi"}], "format": "json",
    ...     "options": {"num_predict": 32, "temperature": 0, "stop": ["\\n"]}})
    >>> fields = body.openai_fields(n_ctx=2048)
    >>> fields["max_tokens"], fields["temperature"], fields["stop"], fields["response_format"]
    (32, 0.0, ['\\n'], {'type': 'json_object'})

`options`: num_predict (−1 and −2, Ollama's "until the context ends", mean the server's
default, cut to the context), temperature, top_k, top_p, min_p, seed, stop, repeat_penalty,
repeat_last_n, presence_penalty, frequency_penalty. `num_ctx` may not exceed the loaded
model's context (the server does not reload per request; a smaller one is accepted and the
loaded context used). Load-time options (num_gpu, num_thread, num_batch, use_mmap, …) are the
load's business (POST /api/load) and are ignored here, as other unknown options are (Ollama
only warns about them); sampling options Outrider does not have (mirostat, typical_p, tfs_z)
are refused unless they are their neutral values. Sampling defaults are Outrider's own
(`SamplingParams`), the same as for every other client.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.server.openai_schema import Text
from runtime.server.reply_format import refuse
from runtime.server.router import KEEP

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def with_images(text: str, images: list[str] | None,
                where: str = "images") -> str | list[dict[str, Any]]:
    """An Ollama message's text and base64 images as OpenAI content parts (the images read
    by `runtime.server.image_parts`, as every dialect's are; an error names `where`.N).

    >>> with_images("Hi", None), with_images("What is it?", ["iVBO"])[1]["where"]
    ('Hi', 'images.0')
    """
    if not images:
        return text
    return [{"type": "text", "text": text},
            *({"type": "image_url", "image_url": {"url": f"data:image/*;base64,{data}"},
               "where": f"{where}.{i}"} for i, data in enumerate(images))]


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

_STRICT = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

# OpenAI field → the Ollama field a 400 names.
RENAME = {
    "max_tokens": "options.num_predict", "temperature": "options.temperature",
    "top_k": "options.top_k", "top_p": "options.top_p", "min_p": "options.min_p",
    "seed": "options.seed", "stop": "options.stop", "repeat_penalty": "options.repeat_penalty",
    "repeat_last_n": "options.repeat_last_n", "presence_penalty": "options.presence_penalty",
    "frequency_penalty": "options.frequency_penalty", "response_format": "format",
    "chat_template_kwargs": "think", "reasoning_effort": "think",
}
_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty",
             "repeat_last_n", "presence_penalty", "frequency_penalty")


class OllamaOptions(BaseModel):
    model_config = _STRICT
    num_ctx: int | None = None
    num_predict: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: Text | list[Text] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
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

    def sampling_fields(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _SAMPLING if getattr(self, name) is not None}
        if out.get("seed") is not None and out["seed"] < 0:
            out["seed"] = -1  # Ollama's "random"
        if self.stop is not None:
            out["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if self.num_predict is not None and self.num_predict not in (-1, -2):
            out["max_tokens"] = self.num_predict
        return out


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

    def openai(self, where: str) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role,
                               "content": with_images(self.content, self.images,
                                                      f"{where}.images")}
        if self.role == "assistant" and self.thinking:
            out["reasoning_content"] = self.thinking
        if self.tool_calls:
            out["tool_calls"] = [{"id": call.id, "type": "function",
                                  "function": {"name": call.function.name,
                                               "arguments": call.function.arguments}}
                                 for call in self.tool_calls]
        if self.role == "tool":
            if self.tool_name is not None:
                out["name"] = self.tool_name
            if self.tool_call_id is not None:
                out["tool_call_id"] = self.tool_call_id
        return out


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
    top_logprobs: int | None = None

    def _common(self, n_ctx: int) -> dict[str, Any]:
        options = self.options or OllamaOptions()
        options.check(n_ctx)
        fields: dict[str, Any] = {"model": self.model, **options.sampling_fields()}
        if self.format == "json":
            fields["response_format"] = {"type": "json_object"}
        elif isinstance(self.format, dict):
            fields["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "format", "schema": self.format}}
        if isinstance(self.think, bool):
            fields["chat_template_kwargs"] = {"enable_thinking": self.think}
        elif self.think is not None:
            fields["reasoning_effort"] = self.think
        if self.logprobs:
            fields["logprobs"] = True
        if self.top_logprobs is not None:
            fields["top_logprobs"] = self.top_logprobs
        return fields


class OllamaChatRequest(_OllamaBody):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    def openai_fields(self, n_ctx: int) -> dict[str, Any]:
        """The OpenAI chat request's fields (Ollama's tools are OpenAI's already)."""
        fields = self._common(n_ctx)
        fields["messages"] = [m.openai(f"messages.{i}") for i, m in enumerate(self.messages)]
        if self.tools:
            fields["tools"] = self.tools
        return fields


class OllamaGenerateRequest(_OllamaBody):
    prompt: Text = ""
    system: Text | None = None
    suffix: Text | None = None
    template: Text | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None  # base64

    def openai_fields(self, n_ctx: int) -> dict[str, Any]:
        """A chat of the system text and the prompt (the model's template applied, as Ollama
        does), or with `raw` the prompt as it is (a text completion's fields)."""
        for name, what in (("suffix", "fill-in-the-middle (suffix) is not supported"),
                           ("template", "a custom template is not supported: the model's own "
                                        "chat template is used (or raw: true)"),
                           ("context", "context (an earlier reply's tokens) is not supported: "
                                       "send the conversation to /api/chat")):
            if getattr(self, name):
                refuse(name, what)
        fields = self._common(n_ctx)
        if self.raw:
            fields.pop("chat_template_kwargs", None)
            fields.pop("reasoning_effort", None)
            top = fields.pop("top_logprobs", None)  # the text completion's one number
            if fields.pop("logprobs", False):
                fields["logprobs"] = top or 0
            if self.images:
                refuse("images", "images need the model's chat template: leave raw out")
            fields["prompt"] = self.prompt
            return fields
        messages = [{"role": "system", "content": self.system}] if self.system else []
        fields["messages"] = [*messages, {"role": "user",
                                          "content": with_images(self.prompt, self.images)}]
        return fields


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

