"""The fields every dialect's request body is built from, each with one type and one range.

Like OpenAI's API, unknown fields are ignored; unlike a lax parser, wrong *types* are refused
(`"max_tokens": "10"` is a 400, not 10). Every number is range-checked here, at the edge, so
the 400 names the client's own field (`options.temperature` for Ollama, `temperature` for
OpenAI) — int32 limits for whatever reaches llama.cpp (`"top_k": 2**64` used to fail the
batched step of every stream). The engine's `SamplingParams` checks them again for the CLI
and the app; then the server's own caps (`ServerLimits`) are applied by `Sampling.params`.
Text with a lone surrogate (`"\\ud800"`, valid JSON but not Unicode text) is refused too: it
has no UTF-8 encoding for the tokenizer.

    >>> Sampling(SamplingFields(stop="\\n"), max_tokens=8).params(ServerLimits(), n_ctx=4096).stop
    ('\\n',)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, NoReturn

from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from runtime.events import INT32_MAX, MAX_SAMPLES, MAX_TOP_LOGPROBS, SamplingParams
from runtime.server.state import ServerLimits

STRICT = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


def refuse(param: str, message: str) -> NoReturn:
    """A 400 `invalid_value` that names the parameter, like pydantic's own (`runtime.server.app`)."""
    raise RequestValidationError([{"type": "value_error", "loc": ("body", param), "msg": message}])


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

# The sampling table: every dialect's body declares its sampling fields with these types.
Temperature = Annotated[float, Field(ge=0.0, le=100.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=0, le=INT32_MAX)]  # ≥ the vocabulary: off
MinP = Annotated[float, Field(ge=0.0, lt=1.0)]
Seed = Annotated[int, Field(ge=-1, lt=2**63)]  # -1: random, as llama.cpp
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]  # OpenAI's frequency and presence
RepeatPenalty = Annotated[float, Field(gt=0.0, le=100.0)]  # llama.cpp's, multiplicative
LastN = Annotated[int, Field(ge=0, le=INT32_MAX)]


class SamplingFields(BaseModel):
    """The sampling table: the fields a dialect's body (or its `options`) inherits, each
    with its one type and range (None: Outrider's default, the same for every client)."""

    model_config = STRICT
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: Seed | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repeat_penalty: RepeatPenalty | None = None
    repeat_last_n: LastN | None = None
    stop: Text | list[Text] | None = None


@dataclass(frozen=True)
class Sampling:
    """A request's sampling, whichever dialect asked. `max_tokens_at` and `stop_at` name
    the dialect's own fields, for the 400s of the server's caps."""

    fields: SamplingFields = field(default_factory=SamplingFields)
    max_tokens: int | None = None
    n: int = 1
    max_tokens_at: str = "max_tokens"
    stop_at: str = "stop"

    def params(self, limits: ServerLimits, n_ctx: int) -> SamplingParams:
        """The engine's sampling: a request without `max_tokens` gets the server's default,
        cut to the context; one asking for more than the server's cap is a 400."""
        max_tokens, stop = self.max_tokens, stops(self.fields.stop)
        if max_tokens is None:
            max_tokens = min(limits.default_max_tokens, n_ctx)
        elif max_tokens > limits.max_tokens:
            refuse(self.max_tokens_at, f"max_tokens {max_tokens} is over this server's limit "
                   f"of {limits.max_tokens}")
        if len(stop) > limits.max_stop:
            refuse(self.stop_at, f"at most {limits.max_stop} stop strings, not {len(stop)}")
        if "" in stop:
            refuse(self.stop_at, "stop strings must not be empty")
        max_n = min(limits.max_n, MAX_SAMPLES)
        if not 1 <= self.n <= max_n:
            refuse("n", f"n must be between 1 and {max_n}, not {self.n}")
        given, default = self.fields, SamplingParams()
        return SamplingParams(
            temperature=_or(given.temperature, default.temperature),
            top_k=_or(given.top_k, default.top_k), top_p=_or(given.top_p, default.top_p),
            min_p=_or(given.min_p, default.min_p),
            repeat_penalty=_or(given.repeat_penalty, default.repeat_penalty),
            frequency_penalty=_or(given.frequency_penalty, 0.0),
            presence_penalty=_or(given.presence_penalty, 0.0),
            penalty_last_n=_or(given.repeat_last_n, default.penalty_last_n),
            seed=None if given.seed is None or given.seed < 0 else given.seed,
            max_tokens=max_tokens, stop=stop)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def stops(value: str | list[str] | None) -> tuple[str, ...]:
    """A `stop` field (one string or a list) as the tuple `Sampling` takes.

    >>> stops("\\n"), stops(["a", "b"]), stops(None)
    (('\\n',), ('a', 'b'), ())
    """
    return (value,) if isinstance(value, str) else tuple(value or ())
