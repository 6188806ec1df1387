"""The engine's face: what the server, the CLI and tests call. `runtime.engine.engine.Engine`
implements it; one engine thread owns every llama.cpp object behind it.

    engine = Engine()
    engine.start()
    loaded = engine.load(LoadSettings(model_path=path), on_progress=print)  # blocks
    handle = engine.submit(GenerationRequest(messages=(ChatMessage("user", "Hi"),)))
    for event in handle.events():          # TokenEvent / StepStats / Finished / ErrorEvent
        ...
    handle.cancel()                         # any time; frees the sequence's cells at once
    engine.stop()
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from runtime.chat.families import PLAIN, Family
from runtime.events import Event, GenerationRequest
from runtime.settings.load import LoadSettings


@dataclass(frozen=True)
class LoadedModel:
    """What a successful load reports."""

    path: Path
    name: str  # file stem, the OpenAI model id
    architecture: str
    n_params: int
    size_bytes: int
    quant: str  # e.g. "Q4_1"
    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    settings: LoadSettings
    chat_template_source: Literal["model", "fallback"]
    flash_attn: bool  # as actually used
    notes: tuple[str, ...] = ()  # things said out loud ("flash attention on for quantized V")
    allocated: dict[str, int] = field(default_factory=dict)  # llama.cpp's buffers, from its log
    draft: str | None = None  # draft model name, "ngram", or None
    draft_refused: str | None = None  # why a requested draft model was refused
    # The template's tool-call / reasoning family (runtime.chat.families): how the server
    # reads the replies, known from the load, so no request asks the engine for it.
    family: Family = PLAIN
    # The family's call markers that the vocabulary holds as one special token (text → id):
    # a call grammar asks for the token the model was trained to write, not its spelling.
    call_tokens: dict[str, int] = field(default_factory=dict)
    # What the model can be asked for (runtime.chat.families.capabilities): "chat" (it writes
    # text; an encoder-only model such as BERT does not), "tools" (its family's calls are
    # rendered and parsed), "reasoning" (its thinking is split from the answer),
    # "structured_output" (any model that writes), "embeddings" (it can embed).
    capabilities: tuple[str, ...] = ("chat", "structured_output")
    # A vision model: its projector's file name, and the tokens one image takes ("vision"
    # is in capabilities then).
    projector: str | None = None
    image_tokens: int | None = None

    @property
    def chat_family(self) -> str:
        """The family's name, as /v1/models and /api/status say it."""
        return self.family.name


@dataclass(frozen=True)
class EngineStatus:
    state: Literal["empty", "loading", "ready"]
    model: LoadedModel | None
    active_sequences: int
    waiting_sequences: int
    kv_cells_used: int
    kv_cells_total: int


@dataclass(frozen=True)
class EngineMetrics:
    """Rolling rates over the last few seconds, for the live panels and /api/metrics. The
    speculative ones cover every sequence's rounds in the window (not one reply): the same
    definitions as a reply's (`runtime.speculative.stats`), another span."""

    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    acceptance_rate: float | None  # accepted / drafted; None: no round in the window
    mean_accepted_length: float | None  # tokens per speculative round
    draft_k: int | None
    drafting_off_reason: str | None
    kv_cells_used: int
    kv_cells_total: int
    active_sequences: int
    waiting_sequences: int


EmbeddingInput = str | Sequence[int]  # a text, or token ids used as they are


@dataclass(frozen=True)
class Embeddings:
    """What `EngineAPI.embed` answers: a unit-length float32 vector per input, in order."""

    vectors: tuple[np.ndarray, ...]
    n_tokens: tuple[int, ...]  # tokens of each input, specials included
    pooling: str  # "mean", "cls", "last" (runtime.engine.embeddings.pooling_for)

    @property
    def prompt_tokens(self) -> int:
        return sum(self.n_tokens)


class RequestHandle(Protocol):
    id: str

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Blocking iterator; ends after the last `Finished` (all n) or an `ErrorEvent`."""
        ...

    def get(self, timeout: float | None = None) -> Event | None:
        """Next event, or None on timeout (for async callers polling from a thread)."""
        ...

    def cancel(self) -> None: ...


class EngineAPI(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...

    def load(self, settings: LoadSettings,
             on_progress: Callable[[float], None] | None = None) -> LoadedModel:
        """Blocks until loaded; raises a typed OutriderError. Replaces any loaded model."""
        ...

    def unload(self) -> None: ...

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request; raises NoModelLoaded. Errors of the request itself (context
        overflow ...) arrive as an ErrorEvent on the handle."""
        ...

    def status(self) -> EngineStatus: ...

    def metrics(self) -> EngineMetrics: ...

    def render_chat(self, messages: Any, *, tools: Any = (), extra: Any = None) -> str:
        """The prompt text the loaded model's chat template makes of `messages` (with
        `tools` and the template kwargs `extra`, as a request's prompt is rendered)."""
        ...

    def tokenize(self, text: str, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        """The loaded model's token ids for `text` (what a document costs of the context).
        Raises NoModelLoaded."""
        ...

    def embed(self, inputs: Sequence[EmbeddingInput]) -> Embeddings:
        """An embedding of each input, batched with generation on the engine thread.
        Blocks; raises NoModelLoaded, ContextOverflow (an input over the limit, named),
        SettingsError (no input, an empty one, a token id beyond the vocabulary) or
        EmbeddingsUnsupported (a reranker, an encoder-decoder model)."""
        ...
