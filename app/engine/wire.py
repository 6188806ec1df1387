"""What the engine server says (docs/api.md), turned into frozen dataclasses at the edge.

Pure Python, no Qt: `SseParser` cuts a byte stream into server-sent events incrementally, and
the `parse_*` functions turn each JSON payload into the typed messages the app's signals carry.
Malformed input raises `WireError` (a protocol bug, never user text in the transcript).

    >>> parser = SseParser()
    >>> parser.feed(b'event: progress\\ndata: {"fraction": 0.5}\\n\\nda')
    [SseEvent(event='progress', data='{"fraction": 0.5}')]
    >>> parser.feed(b'ta: [DONE]\\n\\n')
    [SseEvent(event='message', data='[DONE]')]
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runtime.events import SpecSummary, StepStats, Timings, Usage


class WireError(ValueError):
    """The server sent something docs/api.md does not allow."""


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str


class SseParser:
    """Incremental server-sent-events parser: feed it bytes as they arrive, get whole events.

    Follows the WHATWG rules that matter here: lines end in LF, CRLF or CR; `data:` lines of
    one event join with newlines; a blank line dispatches; lines starting with `:` are comments.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SseEvent]:
        buf = self._buffer + chunk
        events: list[SseEvent] = []
        pos = 0
        # Positions of the next LF and CR, found once and refreshed only when passed, so a
        # large chunk of many lines is parsed in linear time.
        nl = buf.find(b"\n")
        cr = buf.find(b"\r")
        while True:
            if 0 <= nl < pos:
                nl = buf.find(b"\n", pos)
            if 0 <= cr < pos:
                cr = buf.find(b"\r", pos)
            if cr == -1 or 0 <= nl < cr:
                if nl == -1:
                    break
                end, after = nl, nl + 1
            else:
                if cr + 1 == len(buf):
                    break  # a CR at the end may be the first half of CRLF
                end, after = cr, cr + 2 if buf[cr + 1] == 0x0A else cr + 1
            self._line(buf[pos:end].decode("utf-8", errors="replace"), events)
            pos = after
        self._buffer = buf[pos:]
        return events

    def _line(self, line: str, events: list[SseEvent]) -> None:
        if not line:
            if self._data:
                events.append(SseEvent(self._event or "message", "\n".join(self._data)))
            self._event, self._data = "", []
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)


@dataclass(frozen=True)
class ServerAddress:
    """Where a started engine listens (from its `OUTRIDER_SERVER_READY {json}` line)."""

    url: str
    pid: int
    api_key: str


READY_PREFIX = "OUTRIDER_SERVER_READY "


def parse_ready_line(line: str, api_key: str) -> ServerAddress | None:
    """The address announced by `line`, or None when it is some other output.

    >>> parse_ready_line('OUTRIDER_SERVER_READY {"url": "http://127.0.0.1:8123", "pid": 7}', "k")
    ServerAddress(url='http://127.0.0.1:8123', pid=7, api_key='k')
    """
    if not line.startswith(READY_PREFIX):
        return None
    try:
        data = json.loads(line[len(READY_PREFIX):])
        return ServerAddress(str(data["url"]).rstrip("/"), int(data["pid"]), api_key)
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"unreadable ready line: {line!r}") from exc


@dataclass(frozen=True)
class TextDelta:
    """New text of a streaming reply, with the tokens behind it when the server says.
    `text` is answer text (`delta.content`), `reasoning` the model's thinking that the server
    split out of it (`delta.reasoning_content`); one chunk may carry either, both or neither
    (tokens whose text the server held back, such as a `</think>` marker)."""

    text: str
    token_ids: tuple[int, ...] = ()
    from_draft: tuple[bool, ...] = ()
    reasoning: str = ""

    @property
    def drafted(self) -> bool:
        """True when every token of this piece came from the draft (highlighted in the view)."""
        return bool(self.from_draft) and all(self.from_draft)


@dataclass(frozen=True)
class ReplyFinished:
    reason: str  # "stop", "length", "cancelled"
    usage: Usage | None = None
    timings: Timings | None = None
    speculative: SpecSummary | None = None


@dataclass(frozen=True)
class ReplyError:
    """Why a request failed. Shown beside the reply, never inside its text. `code` is the
    server's error code where it gave one ("worker_lost", "model_not_found"; docs/api.md),
    what the app acts on; "" for errors of the app's own making."""

    kind: str  # the server's error type/kind, or "EngineDied", "NetworkError" ...
    message: str
    code: str = ""


ChunkItem = TextDelta | StepStats | ReplyFinished


def _num(data: dict[str, Any], key: str, default: float = 0.0) -> float:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) else default


def _opt_num(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) else None


def parse_usage(data: dict[str, Any] | None) -> Usage | None:
    if not data:
        return None
    details = data.get("prompt_tokens_details") or {}
    return Usage(int(data.get("prompt_tokens", 0)), int(data.get("completion_tokens", 0)),
                 int(details.get("cached_tokens", 0) or 0),
                 truncated_tokens=int(data.get("truncated_tokens", 0) or 0),
                 resumed_tokens=int(data.get("resumed_tokens", 0) or 0))


def parse_timings(data: dict[str, Any] | None) -> Timings | None:
    if not data:
        return None
    return Timings(_num(data, "ttft_s"), _num(data, "prefill_tokens_per_s"),
                   _num(data, "decode_tokens_per_s"), _num(data, "total_s"),
                   _num(data, "restore_s"))


def parse_spec_summary(data: dict[str, Any] | None) -> SpecSummary | None:
    if not data:
        return None
    return SpecSummary(int(data.get("drafted", 0)), int(data.get("accepted", 0)),
                       _num(data, "acceptance_rate"), _num(data, "mean_accepted_length"),
                       _num(data, "measured_speedup", 1.0))


def parse_step(request_id: str, index: int, data: dict[str, Any]) -> StepStats:
    """An `outrider.step` object: this round's counts and the reply's so far (docs/api.md)."""
    k = data.get("k")
    return StepStats(
        request_id=request_id, index=index,
        drafted=int(data.get("drafted", 0)), accepted=int(data.get("accepted", 0)),
        reply_drafted=int(data.get("reply_drafted", 0)),
        reply_accepted=int(data.get("reply_accepted", 0)),
        k=int(k) if isinstance(k, int) else 0,
        acceptance_rate=_num(data, "acceptance_rate"),
        mean_accepted_length=_num(data, "mean_accepted_length"),
        predicted_speedup=_num(data, "predicted_speedup", 1.0),
        measured_speedup=_num(data, "measured_speedup", 1.0),
        drafting_off_reason=data.get("drafting_off_reason"),
    )


def parse_chat_chunk(payload: dict[str, Any]) -> list[ChunkItem]:
    """The typed items of one streamed `chat.completion.chunk` (first choice only).

    >>> parse_chat_chunk({"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hi"},
    ...     "finish_reason": None}], "outrider": {"token_ids": [5], "from_draft": [True]}})
    [TextDelta(text='Hi', token_ids=(5,), from_draft=(True,), reasoning='')]
    >>> parse_chat_chunk({"choices": [{"index": 0, "delta": {"reasoning_content": "Hm"}}],
    ...     "outrider": {"token_ids": [7, 8]}})[0].reasoning
    'Hm'
    """
    if "error" in payload:
        raise WireError(str(payload["error"]))
    items: list[ChunkItem] = []
    extra = payload.get("outrider") or {}
    choices = payload.get("choices") or []
    choice = next((c for c in choices if c.get("index", 0) == 0), None)
    if choice is None:
        return items  # e.g. the trailing usage-only chunk of include_usage
    extra = choice.get("outrider") or extra
    delta = choice.get("delta") or {}
    text = delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or ""
    if not isinstance(text, str) or not isinstance(reasoning, str):
        raise WireError("delta content and reasoning_content must be text")
    token_ids = tuple(int(t) for t in extra.get("token_ids") or ())
    from_draft = tuple(bool(f) for f in extra.get("from_draft") or ())
    if text or reasoning or token_ids:
        items.append(TextDelta(text, token_ids, from_draft, reasoning))
    if isinstance(extra.get("step"), dict):
        items.append(parse_step(str(payload.get("id", "")), 0, extra["step"]))
    reason = choice.get("finish_reason")
    if reason:
        usage = parse_usage(extra.get("usage") or payload.get("usage"))
        items.append(ReplyFinished(str(reason), usage, parse_timings(extra.get("timings")),
                                   parse_spec_summary(extra.get("speculative"))))
    return items


def parse_error_body(body: bytes, status: int) -> ReplyError:
    """An OpenAI-shaped error answer (`{"error": {"message", "type", "code"}}`).

    >>> parse_error_body(b'{"error": {"message": "worker 10.0.0.2:50052 stopped answering",'
    ...                  b' "type": "server_error", "code": "worker_lost"}}', 503).code
    'worker_lost'
    """
    try:
        error = json.loads(body.decode("utf-8"))["error"]
        return ReplyError(str(error.get("type") or error.get("code") or status),
                          str(error.get("message") or "the engine refused the request"),
                          str(error.get("code") or ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", errors="replace").strip()[:200]
        return ReplyError(f"HTTP {status}", text or f"the engine answered HTTP {status}")


@dataclass(frozen=True)
class DeviceMemory:
    """One device in a metrics snapshot: its memory and what the plan put on it. A worker's
    device (`remote`, kind "rpc") lends its memory to this engine alone while the model is
    loaded, so it cannot be asked again: its figures are as of the load (`as_of` "load")."""

    id: str
    name: str
    kind: str  # "cpu", "cuda", "metal", "rpc" (another machine's, `outrider worker`)
    total_bytes: int
    free_bytes: int
    planned_weights: int = 0
    planned_kv: int = 0
    planned_compute: int = 0
    planned_other: int = 0  # outside those buffers: vocabulary tables, the CUDA runtime
    remote: bool = False
    as_of: str = ""  # "load": the free memory is what the worker said before the load

    @property
    def used_bytes(self) -> int:
        return max(0, self.total_bytes - self.free_bytes)

    @property
    def planned_bytes(self) -> int:
        """The plan's whole share of this device (the model picker's "planned" too)."""
        return self.planned_weights + self.planned_kv + self.planned_compute + self.planned_other


@dataclass(frozen=True)
class MetricsSnapshot:
    time: float
    devices: tuple[DeviceMemory, ...] = ()
    engine_rss_bytes: int = 0
    decode_tokens_per_s: float = 0.0
    prefill_tokens_per_s: float = 0.0
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    draft_k: int | None = None
    drafting_off_reason: str | None = None
    kv_cells_used: int = 0
    kv_cells_total: int = 0
    active_sequences: int = 0
    waiting_sequences: int = 0


def parse_metrics(data: dict[str, Any]) -> MetricsSnapshot:
    devices = []
    for dev in data.get("devices") or ():
        planned = dev.get("planned") or {}
        devices.append(DeviceMemory(
            str(dev.get("id", "?")), str(dev.get("name", dev.get("id", "?"))),
            str(dev.get("kind", "cpu")), int(dev.get("total_bytes", 0)),
            int(dev.get("free_bytes", 0)), int(planned.get("weights", 0) or 0),
            int(planned.get("kv", 0) or 0), int(planned.get("compute", 0) or 0),
            int(planned.get("overhead", 0) or 0),
            remote=bool(dev.get("remote")) or dev.get("kind") == "rpc",
            as_of=str(dev.get("as_of") or "")))
    k = data.get("draft_k")
    return MetricsSnapshot(
        time=_num(data, "time"), devices=tuple(devices),
        engine_rss_bytes=int(data.get("engine_rss_bytes", 0) or 0),
        decode_tokens_per_s=_num(data, "decode_tokens_per_s"),
        prefill_tokens_per_s=_num(data, "prefill_tokens_per_s"),
        acceptance_rate=_opt_num(data, "acceptance_rate"),
        mean_accepted_length=_opt_num(data, "mean_accepted_length"),
        draft_k=int(k) if isinstance(k, int) else None,
        drafting_off_reason=data.get("drafting_off_reason"),
        kv_cells_used=int(data.get("kv_cells_used", 0) or 0),
        kv_cells_total=int(data.get("kv_cells_total", 0) or 0),
        active_sequences=int(data.get("active_sequences", 0) or 0),
        waiting_sequences=int(data.get("waiting_sequences", 0) or 0),
    )


@dataclass(frozen=True)
class ServedModel:
    """The model the engine process is serving, as it describes it (`event: loaded` /
    `GET /api/status`). Not `runtime.gguf.info.ModelInfo` (a GGUF header's facts): this is
    what the engine reports after loading, its plan and measured memory included."""

    name: str
    path: str = ""
    quant: str = ""
    n_ctx: int = 0
    draft: str | None = None  # draft model name, "ngram", or None
    draft_refused: str | None = None  # why a requested draft was refused
    notes: tuple[str, ...] = ()
    plan: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    # What the model can be asked for (`LoadedModel.capabilities`): "vision" (it has a
    # projector: images), "embeddings", "tools", "reasoning", "structured_output".
    capabilities: tuple[str, ...] = ()
    # A vision model's projector (its file name) and the context one image takes, in tokens
    # (the chat counts them against the context); None for a text-only model.
    projector: str | None = None
    image_tokens: int | None = None


def parse_model(model: dict[str, Any] | None, plan: Any = None, measured: Any = None) -> ServedModel | None:
    """The served model of a `loaded` event or `/api/status` (`LoadedModel` as JSON).

    >>> m = parse_model({"name": "gemma-3-4b", "n_ctx": 8192, "capabilities": ["vision"],
    ...                  "projector": "mmproj-F16.gguf", "image_tokens": 256})
    >>> m.n_ctx, m.projector, m.image_tokens
    (8192, 'mmproj-F16.gguf', 256)
    >>> parse_model({"name": "smol"}).image_tokens is None
    True
    """
    if not model:
        return None
    image_tokens = model.get("image_tokens")
    projector = model.get("projector")
    path = str(model.get("path", ""))
    name = str(model.get("name") or model.get("id") or path.rsplit("/", 1)[-1] or "model")
    return ServedModel(
        name=name, path=path, quant=str(model.get("quant", "") or ""),
        n_ctx=int(model.get("n_ctx", 0) or 0),
        draft=model.get("draft"),
        draft_refused=model.get("draft_refused"),
        notes=tuple(str(n) for n in model.get("notes") or ()),
        plan=plan if isinstance(plan, dict) else {},
        measured=measured if isinstance(measured, dict) else {},
        capabilities=tuple(str(c) for c in model.get("capabilities") or ()),
        projector=str(projector) if projector else None,
        image_tokens=int(image_tokens) if isinstance(image_tokens, int) and image_tokens > 0
        else None,
    )


def parse_embeddings(payload: Any) -> list[list[float]]:
    """The vectors of a `/v1/embeddings` answer (float encoding), in input order.

    >>> parse_embeddings({"data": [{"index": 1, "embedding": [0.0, 1.0]},
    ...                            {"index": 0, "embedding": [1.0, 0.0]}]})
    [[1.0, 0.0], [0.0, 1.0]]
    """
    try:
        items = sorted(payload["data"], key=lambda item: int(item["index"]))
        return [[float(x) for x in item["embedding"]] for item in items]
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"unreadable embeddings answer: {exc}") from exc


@dataclass(frozen=True)
class TokenCount:
    """A `/tokenize` answer: how many tokens a text is for `model`."""

    count: int
    model: str


def parse_token_count(payload: Any) -> TokenCount:
    """The count of a `POST /tokenize` answer (`count`, else the length of `tokens`).

    >>> parse_token_count({"tokens": [19556, 11], "count": 2, "model": "smol"})
    TokenCount(count=2, model='smol')
    >>> parse_token_count({"tokens": [1, 2, 3]}).count
    3
    """
    try:
        count = payload.get("count")
        if not isinstance(count, int):
            count = len(payload["tokens"])
        return TokenCount(int(count), str(payload.get("model") or ""))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise WireError(f"unreadable tokenize answer: {exc}") from exc
