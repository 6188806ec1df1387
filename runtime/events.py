"""Typed messages in and out of the engine: what a caller asks for and what it gets back.

The engine thread yields these frozen dataclasses; the server turns them into JSON and the
app into signals. Errors travel as `ErrorEvent`, never as text inside the token stream.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.errors import SettingsError

_ids = itertools.count(1)

INT32_MAX = 2**31 - 1  # llama.cpp takes top_k, n, token counts and positions as int32_t
MAX_TOP_LOGPROBS = 20  # OpenAI's cap
MAX_SAMPLES = 4096  # n: samples of one prompt (a sequence and a sampler each; the server caps it lower)


def next_request_id() -> str:
    return f"req-{next(_ids)}"


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. temperature 0 means greedy (argmax)."""

    temperature: float = 0.8
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1.0 = off
    min_p: float = 0.05  # 0.0 = off
    repeat_penalty: float = 1.0  # 1.0 = off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # keep generating past end-of-generation tokens (benchmarks)

    def __post_init__(self) -> None:
        """Every number is range-checked here, so the CLI and the app get the same refusals
        as the server (which checks them again at its edge, to name the parameter)."""
        for name in ("top_k", "penalty_last_n", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) \
                    or int(value) > INT32_MAX:
                raise SettingsError(f"{name} must be an integer up to {INT32_MAX}, not {value!r}")
        for name in ("frequency_penalty", "presence_penalty", "repeat_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise SettingsError(f"{name} must be a finite number, not {getattr(self, name)}")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise SettingsError(f"seed must be between 0 and 2**64 - 1, not {self.seed}")
        if not 0.0 <= self.temperature <= 100.0:
            raise SettingsError(f"temperature must be between 0 and 100, not {self.temperature}")
        if self.top_k < 0:
            raise SettingsError(f"top_k must be 0 (off) or positive, not {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise SettingsError(f"top_p must be in (0, 1], not {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise SettingsError(f"min_p must be in [0, 1), not {self.min_p}")
        if self.repeat_penalty <= 0.0:
            raise SettingsError(f"repeat_penalty must be positive, not {self.repeat_penalty}")
        if self.penalty_last_n < 0:
            raise SettingsError(f"penalty_last_n must be 0 or positive, not {self.penalty_last_n}")
        if self.max_tokens < 1:
            raise SettingsError(f"max_tokens must be at least 1, not {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class ConstraintSpec:
    """What a sequence's output must match (runtime.sampling.constraint compiles it).

    kind: "json_schema" (`source` is the schema as JSON text), "json_object" (any JSON object;
    `source` ignored), "regex", "gbnf" (llama.cpp's grammar format), "lark" (llguidance's).
    `trigger`: a lazy constraint. The output is free until this text appears in it; from the
    trigger on (the trigger included) it must match the grammar — how `tool_choice: auto`
    lets a model talk, then forces a well-formed call once it starts one. `armed_after`: the
    trigger counts only after this text (a reasoning reply's end of thinking), so a call
    marker the model mentions while it thinks does not start the grammar."""

    kind: Literal["json_schema", "json_object", "regex", "gbnf", "lark"]
    source: str = ""
    trigger: str | None = None
    armed_after: str | None = None
    # What holds the reply instead when its prompt opened the thinking block (a template that
    # writes `<think>` itself): a forced call may come only after the thinking. The engine
    # knows which once it has rendered the prompt, so the edge never renders it.
    in_reasoning: ConstraintSpec | None = None


@dataclass(frozen=True)
class ToolCall:
    """One function call of an assistant message. `arguments` is the JSON text of the
    arguments object, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat. `tool_calls` (assistant), `tool_call_id` and `name` (tool
    results) and `reasoning` (an assistant's thinking, offered to templates that keep it as
    `reasoning_content`) are empty for plain text chats."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None
    # Images in this message, in order, as their encoded bytes (PNG, JPEG, WebP ...), already
    # checked by `runtime.media.images.check_image`; only a model with a projector takes them.
    images: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: a raw prompt (text or token ids) or a chat (rendered with the model's
    template). `n` > 1 asks for several samples of the same prompt (they share its cells)."""

    prompt: str | tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    truncate_middle: bool = False  # drop older turns instead of failing on overflow
    id: str = field(default_factory=next_request_id)
    constraint: ConstraintSpec | None = None  # structured output; None: free text
    # Logprobs: None off; 0 the sampled token's only; up to 20 also the most likely ones.
    logprobs: int | None = None
    # Chat only: function tools as OpenAI's JSON ({"type": "function", "function": {...}}),
    # handed to the template as `tools`; extra template variables (`enable_thinking`,
    # `reasoning_effort`, ...).
    tools: tuple[dict[str, Any], ...] = ()
    template_kwargs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise SettingsError("give either a prompt or chat messages, not both or neither")
        if not 1 <= self.n <= MAX_SAMPLES:
            raise SettingsError(f"n must be between 1 and {MAX_SAMPLES}, not {self.n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise SettingsError(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, not {self.logprobs}")


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the distribution it was sampled from."""

    token_id: int
    piece: bytes  # the token's bytes (a piece of a multi-byte character may be partial)
    logprob: float


@dataclass(frozen=True)
class ReasoningOpen:
    """The request's prompt ends inside the model's thinking block (a template that opens
    `<think>` itself), so its reply starts as thinking. Sent with the admission, before the
    first token, and only then: a reply without it starts as an answer."""

    request_id: str


@dataclass(slots=True)
class TokenEvent:
    """One generated token. `text` is the newly decodable text (may be "" while a multi-byte
    character is incomplete, or while a possible stop string is held back). `logprob` and
    `top_logprobs` only when the request asked for them.

    The one object the engine makes per token, so it is a plain slotted dataclass, not a
    frozen one like the other events: a frozen dataclass's __init__ costs 1.4-2.2 µs (one
    object.__setattr__ a field) against 0.3 µs, 1 % of a tiny model's step. Treat it as
    frozen all the same: nothing changes an event once it is emitted."""

    request_id: str
    index: int  # which of the n samples
    token_id: int
    text: str
    from_draft: bool = False
    logprob: TokenLogprob | None = None
    top_logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenRun:
    """Several tokens of one sequence, handed to its request's handle at once: what the
    engine thread gives for a native run's tokens (runtime.engine.native_step), one object
    for them all rather than one each. No caller sees one: the handle gives its tokens out
    as TokenEvents, one after the other, made on the reader's thread (`events`). Only plain
    tokens travel so: no draft tokens, no logprobs.

        >>> [e.text for e in TokenRun("req-1", 0, (72, 105), ["H", "i"]).events()]
        ['H', 'i']
    """

    request_id: str
    index: int
    token_ids: tuple[int, ...]
    texts: list[str]  # each token's new text, as `TokenEvent.text`

    def events(self) -> list[TokenEvent]:
        n = len(self.token_ids)
        return list(map(TokenEvent, itertools.repeat(self.request_id, n),
                        itertools.repeat(self.index, n), self.token_ids, self.texts))


@dataclass(frozen=True)
class StepStats:
    """Speculative statistics of one round for one sequence (absent when not drafting).

    `drafted`/`accepted` are this round's; the `reply_` counts and the rates are the whole
    reply's so far, this round included — so the last `StepStats` a client saw says what the
    reply's `SpecSummary` will, even when rounds arrive in bursts and only the last of each
    burst is passed on. Definitions: `runtime.speculative.stats`."""

    request_id: str
    index: int
    drafted: int  # this round (0: no round, drafting switched off or on)
    accepted: int  # this round
    reply_drafted: int  # the reply so far
    reply_accepted: int  # the reply so far
    k: int  # draft length chosen for this round
    acceptance_rate: float  # reply_accepted / reply_drafted
    mean_accepted_length: float  # tokens per speculative round, over the reply
    predicted_speedup: float
    measured_speedup: float
    drafting_off_reason: str | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from the cache (prefix sharing)
    truncated_tokens: int = 0  # prompt tokens dropped by middle truncation (never silent)
    resumed_tokens: int = 0  # of cached_tokens, those restored from a saved KV cache file


@dataclass(frozen=True)
class Timings:
    ttft_s: float  # request accepted → first token
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    total_s: float
    restore_s: float = 0.0  # reading a saved KV cache back (resumed_tokens), part of ttft_s


@dataclass(frozen=True)
class SpecSummary:
    """A reply's speculative statistics (`runtime.speculative.stats`): what its footer shows."""

    drafted: int
    accepted: int
    acceptance_rate: float  # accepted / drafted
    mean_accepted_length: float  # tokens per speculative round
    measured_speedup: float


# "stop": EOS, a stop string, or a constraint that is complete; "length": max_tokens or the
# context's end; "cancelled": the client went away or asked to stop.
FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class Finished:
    request_id: str
    index: int
    reason: FinishReason
    usage: Usage
    timings: Timings
    speculative: SpecSummary | None = None
    stop_sequence: str | None = None  # reason "stop" by a stop string: which one


@dataclass(frozen=True)
class ErrorEvent:
    """A request failed. `kind` is the exception's class name, `message` its one line."""

    request_id: str
    kind: str
    message: str


Event = ReasoningOpen | TokenEvent | StepStats | Finished | ErrorEvent
