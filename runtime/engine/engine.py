"""The engine: one thread owns every llama.cpp object; everything else talks to it by queue.

Callers (the CLI, the HTTP server, tests) call `Engine` methods from any thread. Each call
becomes a command on the engine's inbox; generation results come back on the request's own
queue (`EventQueueHandle`). Between commands the thread runs `Scheduler.step()` — one batched
decode for every active sequence — for as long as there is work.

    engine = Engine()
    engine.start()
    engine.load(LoadSettings(model_path=path))
    handle = engine.submit(GenerationRequest(prompt="Once upon a time",
                                             sampling=SamplingParams(temperature=0)))
    text = "".join(e.text for e in handle.events() if isinstance(e, TokenEvent))
    engine.stop()

Every request is answered, and a request's failure is its own. The boundaries:

- preparing (render the chat template, tokenize, truncate, fit `max_tokens` to the cache)
  runs on a small worker pool, never on the engine thread, so a 10,000-message
  `truncate_middle` chat or a template that loops until its time limit delays nobody; any
  exception there — typed or not — becomes that request's `ErrorEvent`;
- admitting (sequences, samplers, drafters) runs on the engine thread inside the same
  boundary;
- inside a step the scheduler fails only the request whose sampling or drafting raised
  (`Scheduler.step`); only an exception from the batched decode itself — which no one
  request owns — fails the requests in flight and clears the cache.

Tokenizing on a worker thread while the engine thread decodes is safe: `llama_tokenize` only
reads the vocabulary (`llama_vocab::impl::tokenize` is `const`, keeps its state in a
per-call session object and has no `mutable` members; llama-vocab.cpp), and decoding never
writes the vocabulary. What is not safe is freeing the model under a tokenizing worker, so a
preparation holds a lease on its model (`_Loaded.lease`) and unloading waits for the leases
to end — a few seconds at most, since rendering is time-bounded (`runtime.engine.chat_template`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, assert_never

from runtime.engine.api import EmbeddingInput, Embeddings, EngineMetrics, EngineStatus, LoadedModel
from runtime.engine.chat_template import ChatTemplate
from runtime.engine.embeddings import Embedder, EmbeddingJob
from runtime.engine.handle import EventQueueHandle
from runtime.engine.kv_store import KvStore, KvStoreOptions, cache_key
from runtime.engine.media_prompt import DRAFTING_OFF, MediaPrompt, prepare_media_prompt
from runtime.engine.native_step import NativeStep
from runtime.engine.prompt import PreparedPrompt, answer_budget, prepare_prompt
from runtime.engine.scheduler import Scheduler, StepReport
from runtime.engine.sequence import Sequence
from runtime.engine.step_profile import StepProfile, StepProfiler, profiled
from runtime.engine.stops import StopMatcher
from runtime.errors import NoModelLoaded, OutriderError, SettingsError
from runtime.events import (
    ChatMessage,
    ErrorEvent,
    Event,
    Finished,
    GenerationRequest,
    ReasoningOpen,
    SamplingParams,
    TokenEvent,
    TokenRun,
)
from runtime.llama.binding import Batch, LlamaContext, LlamaModel, supports_gpu_offload
from runtime.llama.mtmd import Projector
from runtime.llama.params import LlamaParams, to_llama_params
from runtime.llama.stepper import Doorbell
from runtime.planner.gpu_layers import Offload
from runtime.sampling.constraint import Constraint, ConstraintCompiler
from runtime.sampling.sampler import Sampler
from runtime.settings.load import LoadSettings
from runtime.speculative.api import SpecSetup, SpeculationPolicy
from runtime.speculative.stats import acceptance_rate, mean_accepted_length

logger = logging.getLogger("outrider.engine")

_METRICS_WINDOW_S = 5.0
_PREPARE_WORKERS = 2  # prompts rendered and tokenized at once, off the engine thread
_IDLE_AFTER_S = 1.0  # no step for this long (and twice the last step): the rates read 0


@dataclass
class _Loaded:
    model: LlamaModel
    ctx: LlamaContext
    info: LoadedModel
    template: ChatTemplate
    scheduler: Scheduler
    spec: SpecSetup | None
    compiler: ConstraintCompiler  # structured output for this model's vocabulary
    embedder: Embedder  # /v1/embeddings: its own llama.cpp context, made on first use
    projector: Projector | None = None  # a vision model's mmproj (images in chats)
    # Preparations (worker threads) using `model` right now; unloading waits for 0.
    leases: int = 0
    closing: bool = False
    lease_changed: threading.Condition = field(default_factory=threading.Condition)

    def lease(self) -> bool:
        """Take a lease on the model for a preparation; False once it is being unloaded."""
        with self.lease_changed:
            if self.closing:
                return False
            self.leases += 1
            return True

    def release(self) -> None:
        with self.lease_changed:
            self.leases -= 1
            self.lease_changed.notify_all()

    def close_leases(self) -> None:
        """Refuse new leases and wait until every preparation has let go of the model."""
        with self.lease_changed:
            self.closing = True
            self.lease_changed.wait_for(lambda: self.leases == 0)


@dataclass(frozen=True)
class _Prepared:
    """A worker's answer for one request: its prompt and fitted sampling, or its error."""

    loaded: _Loaded
    request: GenerationRequest
    handle: EventQueueHandle
    prompt: PreparedPrompt | None = None
    sampling: SamplingParams | None = None
    error: ErrorEvent | None = None
    constraint: Constraint | None = None  # compiled here, off the engine thread
    media: MediaPrompt | None = None  # the prompt's images, tokenized here too


# The engine thread's commands, one class each, dispatched by type (`Engine._handle`). One with
# a future answers the caller waiting on it; a request's (submit, admit) answer on its handle.

@dataclass(frozen=True)
class _Load:
    settings: LoadSettings
    on_progress: Callable[[float], None] | None
    future: concurrent.futures.Future[LoadedModel]


@dataclass(frozen=True)
class _Unload:
    future: concurrent.futures.Future[None]


@dataclass(frozen=True)
class _Submit:
    request: GenerationRequest
    handle: EventQueueHandle


@dataclass(frozen=True)
class _Admit:
    """A prepared request (or its preparation's error), back from the worker pool."""

    prepared: _Prepared

    @property
    def handle(self) -> EventQueueHandle:
        return self.prepared.handle


@dataclass(frozen=True)
class _Cancel:
    request_id: str


@dataclass(frozen=True)
class _Embed:
    loaded: _Loaded
    job: EmbeddingJob


@dataclass(frozen=True)
class _Stop:
    future: concurrent.futures.Future[None]


_Command = _Load | _Unload | _Submit | _Admit | _Cancel | _Embed | _Stop


class Engine:
    """Implements `runtime.engine.api.EngineAPI`.

    Collaborators are passed in: `speculation` sets up drafting per load (None: plain
    decoding), `plan_gpu_layers` answers "auto" GPU layers, or an `Offload` with the "auto"
    MoE experts in RAM too (None: CPU only, said in notes),
    `probe` loads a file once in a child process before the engine does (None: no probe;
    `runtime.engine.probe`), `saved_kv` keeps idle conversations' KV cells on disk and
    resumes them (None: the prefix cache ends with the slots; `runtime.engine.kv_store`).
    `on_progress` of `load` is called on the engine thread.
    """

    def __init__(self, *, speculation: SpeculationPolicy | None = None,
                 plan_gpu_layers: Callable[[LoadSettings], Offload | int | None] | None = None,
                 probe: Callable[[Path, LlamaParams], None] | None = None,
                 saved_kv: KvStoreOptions | None = None, profile: bool = False) -> None:
        self._speculation = speculation
        self._profile = profile  # time each decode step (runtime.engine.step_profile)
        self._profiler: StepProfiler | None = None
        self._plan_gpu_layers = plan_gpu_layers
        self._probe = probe
        self._saved_kv = saved_kv
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        # Rung with every command: ends a native run of decode steps (native_step) early.
        self._doorbell = Doorbell()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._loaded: _Loaded | None = None
        self._state = "empty"
        self._info: LoadedModel | None = None
        self._template: ChatTemplate | None = None
        self._handles: dict[str, EventQueueHandle] = {}
        self._preparing: set[str] = set()  # request ids on the worker pool
        self._cancel_on_admit: set[str] = set()  # cancelled while preparing
        self._prepare_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._steps: deque[tuple[float, StepReport, int | None]] = deque()
        self._steps_lock = threading.Lock()  # written by the engine thread, read by metrics()
        self._counts = (0, 0, 0, 0)  # active, waiting, cells used, cells total
        self._off_reason: str | None = None  # why a running sequence's drafting is off

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            if self._prepare_pool is None:
                self._prepare_pool = concurrent.futures.ThreadPoolExecutor(
                    _PREPARE_WORKERS, thread_name_prefix="outrider-prepare")
            self._thread = threading.Thread(target=self._run, name="outrider-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Cancel everything, free llama.cpp's objects and join the thread."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._post(_Stop(future))
        thread.join()
        self._thread = None
        pool, self._prepare_pool = self._prepare_pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def load(self, settings: LoadSettings,
             on_progress: Callable[[float], None] | None = None) -> LoadedModel:
        self.start()
        future: concurrent.futures.Future[LoadedModel] = concurrent.futures.Future()
        self._post(_Load(settings, on_progress, future))
        return future.result()

    def unload(self) -> None:
        self.start()
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._post(_Unload(future))
        future.result()

    def submit(self, request: GenerationRequest) -> EventQueueHandle:
        if self._state != "ready":
            raise NoModelLoaded("no model is loaded; load one first")
        handle = EventQueueHandle(request.id, request.n, self._cancel)
        self._post(_Submit(request, handle))
        return handle

    def _cancel(self, request_id: str) -> None:
        self._post(_Cancel(request_id))

    # ---- snapshots (any thread) ------------------------------------------------------------------

    def status(self) -> EngineStatus:
        active, waiting, used, total = self._counts
        state = self._state
        return EngineStatus(state=state, model=self._info if state == "ready" else None,  # type: ignore[arg-type]
                            active_sequences=active, waiting_sequences=waiting,
                            kv_cells_used=used, kv_cells_total=total)

    def metrics(self) -> EngineMetrics:
        """Rates over the busy time of the last `_METRICS_WINDOW_S` seconds; 0 once the engine
        has been idle for a moment (more than `_IDLE_AFTER_S` and twice its last step): a
        window of old steps, emptying from its oldest end, would otherwise drift up or down
        while nothing runs."""
        now = time.perf_counter()
        with self._steps_lock:
            steps = [s for s in self._steps if now - s[0] <= _METRICS_WINDOW_S]
        idle = bool(steps) and now - steps[-1][0] > max(_IDLE_AFTER_S, 2 * steps[-1][1].seconds)
        rate_steps = [] if idle else steps
        busy_decode = sum(r.seconds for _, r, _ in rate_steps if r.decoded)
        busy_prefill = sum(r.seconds for _, r, _ in rate_steps if r.prefilled)
        decoded = sum(r.decoded for _, r, _ in rate_steps)
        prefilled = sum(r.prefilled for _, r, _ in rate_steps)
        drafted = sum(r.drafted for _, r, _ in steps)
        accepted = sum(r.accepted for _, r, _ in steps)
        rounds = sum(1 for _, r, _ in steps if r.drafted)
        last_k = next((k for _, _, k in reversed(steps) if k), None)
        active, waiting, used, total = self._counts
        return EngineMetrics(
            decode_tokens_per_s=decoded / busy_decode if busy_decode > 0 else 0.0,
            prefill_tokens_per_s=prefilled / busy_prefill if busy_prefill > 0 else 0.0,
            acceptance_rate=acceptance_rate(accepted, drafted) if drafted else None,
            mean_accepted_length=mean_accepted_length(accepted, rounds) if rounds else None,
            draft_k=last_k, drafting_off_reason=self._off_reason,
            kv_cells_used=used, kv_cells_total=total,
            active_sequences=active, waiting_sequences=waiting)

    def render_chat(self, messages: Any, *, tools: Any = (), extra: Any = None) -> str:
        template = self._template
        if template is None:
            raise NoModelLoaded("no model is loaded; load one first")
        return template.render(messages, tools=tools, extra=extra)

    def tokenize(self, text: str, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        """The loaded model's token ids for `text`; read-only, any thread, under a lease."""
        loaded = self._loaded
        if loaded is None or not loaded.lease():
            raise NoModelLoaded("no model is loaded; load one first")
        try:
            return list(loaded.model.tokenize(text, add_special=add_special,
                                              parse_special=parse_special))
        finally:
            loaded.release()

    def embed(self, inputs: Seq[EmbeddingInput]) -> Embeddings:
        """Unit-length vectors for `inputs` (texts or token id lists), computed on the engine
        thread between generation steps (`runtime.engine.embeddings`). Blocks; raises a
        typed error (NoModelLoaded, ContextOverflow, SettingsError, EmbeddingsUnsupported)."""
        loaded = self._loaded
        if loaded is None or not loaded.lease():
            raise NoModelLoaded("no model is loaded; load one first")
        try:
            job = loaded.embedder.prepare(inputs)  # tokenizing: here, not on the engine thread
        finally:
            loaded.release()
        self._post(_Embed(loaded, job))
        while True:
            try:
                return job.future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                thread = self._thread
                if thread is None or not thread.is_alive():  # stopped before it got to it
                    raise NoModelLoaded("the engine stopped") from None

    def _embed_now(self, loaded: _Loaded, job: EmbeddingJob) -> None:
        if loaded is not self._loaded:
            job.fail(NoModelLoaded("the model was unloaded"))
            return
        loaded.embedder.add(job)

    def step_profile(self) -> StepProfile | None:
        """Where the decode steps' time went since the model loaded (Python, llama_decode,
        sampling: runtime.engine.step_profile); None unless made with `profile=True`."""
        profiler = self._profiler
        return profiler.snapshot() if profiler is not None else None

    @property
    def loaded(self) -> LoadedModel | None:
        return self._info if self._state == "ready" else None

    # ---- the engine thread -----------------------------------------------------------------------

    def _post(self, command: _Command) -> None:
        """Hand `command` to the engine thread (any thread)."""
        self._inbox.put(command)
        self._doorbell.ring()

    def _run(self) -> None:
        while True:
            self._doorbell.clear()  # before the look at the inbox: see Doorbell
            busy = self._loaded is not None and (self._loaded.scheduler.has_work()
                                                 or self._loaded.embedder.has_work())
            if (not busy and self._loaded is not None and self._inbox.empty()
                    and self._loaded.scheduler.kv.save_next_idle()):
                continue  # a finished conversation went to disk (kv_slots); look again
            # Busy: a look, not a wait (and no exception raised per step while it is empty).
            command = None if busy and self._inbox.empty() else self._inbox.get(block=not busy)
            while command is not None:
                if isinstance(command, _Stop):
                    self._unload_now()
                    command.future.set_result(None)
                    return
                self._handle(command)
                try:
                    command = self._inbox.get_nowait()
                except queue.Empty:
                    command = None
            if self._loaded is not None and self._loaded.scheduler.has_work():
                self._step(self._loaded)
            if self._loaded is not None and self._loaded.embedder.has_work():
                self._loaded.embedder.step()  # one batch between two steps: streams go on

    def _handle(self, command: _Load | _Unload | _Submit | _Admit | _Cancel | _Embed) -> None:
        """Carry out one command (`_Stop` is `_run`'s). Its error goes to whoever waits for
        it: the caller's future, else the request's handle, else the log."""
        future = command.future if isinstance(command, _Load | _Unload) else None
        result: Any = None
        try:
            match command:
                case _Load():
                    result = self._load_now(command.settings, command.on_progress)
                case _Unload():
                    self._unload_now()
                case _Submit():
                    self._submit_now(command.request, command.handle)
                case _Admit():
                    self._admit_now(command.prepared)
                case _Cancel():
                    self._cancel_now(command.request_id)
                case _Embed():
                    self._embed_now(command.loaded, command.job)
                case _:
                    assert_never(command)
        except BaseException as exc:  # delivered to the caller, never kills the thread
            name = type(command).__name__
            if future is not None:
                future.set_exception(exc)
            elif isinstance(command, _Submit | _Admit):  # the request's own error, answered
                logger.debug("engine command %s failed", name, exc_info=True)
                self._answer_error(command.handle, exc)
            else:
                logger.exception("engine command %s failed", name)
            return
        if future is not None:
            future.set_result(result)

    def _step(self, loaded: _Loaded) -> None:
        profiler = self._profiler
        if profiler is not None:
            profiler.begin()
        try:
            report = loaded.scheduler.step()
        except Exception as exc:  # a bug or a llama.cpp surprise: fail the work, keep serving
            logger.exception("engine step failed")
            sched = loaded.scheduler
            message = f"the engine failed: {exc}" if str(exc) else f"the engine failed: {type(exc).__name__}"
            kind = type(exc).__name__ if isinstance(exc, OutriderError) else "EngineError"
            for request_id in {s.request_id for s in sched.running + list(sched.waiting)}:
                sched.fail(request_id, kind, message)
            loaded.ctx.clear()
            sched.kv.clear()
            report = StepReport(0, 0, 0.0)
        if report.decoded or report.prefilled:
            now = time.perf_counter()
            with self._steps_lock:
                self._steps.append((now, report, report.drafted or None))
                while self._steps and now - self._steps[0][0] > _METRICS_WINDOW_S:
                    self._steps.popleft()
        self._update_counts(loaded)
        if profiler is not None:
            profiler.end(report.decoded, not report.prefilled, loaded.scheduler.has_work())

    def _update_counts(self, loaded: _Loaded) -> None:
        sched = loaded.scheduler
        self._counts = (len(sched.running), len(sched.waiting), sched.kv.used, sched.kv.n_cells)
        self._off_reason = next((s.drafter.off_reason for s in sched.running
                                 if s.drafter is not None and s.drafter.off_reason), None)

    def _emit(self, seq: Sequence, event: Event | TokenRun) -> None:
        handle = self._handles.get(seq.request_id)
        if handle is None:
            return
        handle._put(event)
        if type(event) is TokenRun or type(event) is TokenEvent:  # most: they end nothing
            return
        if isinstance(event, ErrorEvent) or (
                isinstance(event, Finished) and self._all_finished(seq.request_id)):
            del self._handles[seq.request_id]

    def _all_finished(self, request_id: str) -> bool:
        loaded = self._loaded
        if loaded is None:
            return True
        sched = loaded.scheduler
        return not any(s.request_id == request_id for s in sched.running + list(sched.waiting))

    # ---- commands ----------------------------------------------------------------------------------

    def _load_now(self, settings: LoadSettings,
                  on_progress: Callable[[float], None] | None) -> LoadedModel:
        from runtime.engine.loader import load_model  # keeps this module about the thread

        self._unload_now()
        self._state = "loading"
        try:
            if self._plan_gpu_layers is not None:
                plan = self._plan_gpu_layers(settings)
            else:
                plan = None if supports_gpu_offload() or settings.workers else 0  # CPU build: nothing to decide
            offload = plan if isinstance(plan, Offload) else Offload(plan)
            params = to_llama_params(settings, offload.gpu_layers, plan_cpu_moe=offload.cpu_moe)
            result = load_model(settings, params, on_progress, self._speculation, self._probe)
        except BaseException:
            self._state = "empty"
            raise
        store = None
        if self._saved_kv is not None and self._saved_kv.budget_bytes > 0:
            try:
                key = cache_key(settings.model_path, params, n_ctx=result.ctx.n_ctx,
                                flash_attn=result.info.flash_attn)
                store = KvStore(self._saved_kv, key, result.ctx)
            except OSError as exc:  # the file vanished after loading: resume nothing
                logger.warning("saved KV caches are off for this load: %s", exc)
        native = NativeStep.for_context(result.ctx, result.spec.verifier if result.spec else None,
                                        self._doorbell)
        draft_stepper = result.spec.stepper if result.spec else None
        ctx, self._profiler = (profiled(result.ctx, native, draft_stepper) if self._profile
                               else (result.ctx, None))
        scheduler = Scheduler(
            ctx, result.model, Batch(result.ctx.n_batch), emit=self._emit,
            budget=result.ctx.n_batch,
            verifier=result.spec.verifier if result.spec else None,
            k_max=result.spec.k_max if result.spec else 0, store=store, native=native)
        self._loaded = _Loaded(result.model, result.ctx, result.info, result.template,
                               scheduler, result.spec, ConstraintCompiler.from_llama(result.model),
                               Embedder(result.model, params), projector=result.projector)
        self._info, self._template = result.info, result.template
        self._update_counts(self._loaded)
        self._state = "ready"
        return result.info

    def _unload_now(self) -> None:
        loaded = self._loaded
        if loaded is None:
            return
        self._state = "empty"
        loaded.close_leases()  # no worker may tokenize with a freed model
        loaded.scheduler.cancel_all()
        loaded.scheduler.kv.save_idle()  # finished conversations resume from disk next time
        for handle in list(self._handles.values()):  # requests not yet turned into sequences
            handle._put(ErrorEvent(handle.id, "NoModelLoaded", "the model was unloaded"))
        self._handles.clear()
        if loaded.spec is not None:
            loaded.spec.close()
        loaded.embedder.close()
        loaded.ctx.close()
        if loaded.projector is not None:
            loaded.projector.close()
        loaded.model.close()
        self._loaded = None
        self._info = None
        self._template = None
        self._counts = (0, 0, 0, 0)
        self._off_reason = None

    def _submit_now(self, request: GenerationRequest, handle: EventQueueHandle) -> None:
        """Hand the request to the preparation pool; its answer comes back as "admit"."""
        loaded = self._loaded
        pool = self._prepare_pool
        if loaded is None or pool is None:
            handle._put(ErrorEvent(request.id, "NoModelLoaded", "no model is loaded; load one first"))
            return
        if request.id in self._handles:
            handle._put(ErrorEvent(request.id, "SettingsError",
                                   f"a request with id {request.id!r} is already running"))
            return
        self._handles[request.id] = handle
        self._preparing.add(request.id)
        pool.submit(self._prepare, loaded, request, handle)

    def _prepare(self, loaded: _Loaded, request: GenerationRequest,
                 handle: EventQueueHandle) -> None:
        """On a worker thread: the prompt's tokens and the sampling fitted to the cache, or the
        request's error. Never raises: whatever happens is posted back as "admit"."""
        if not loaded.lease():
            error = ErrorEvent(request.id, "NoModelLoaded", "the model was unloaded")
            self._post(_Admit(_Prepared(loaded, request, handle, error=error)))
            return
        try:
            n_ctx = loaded.ctx.n_ctx
            media = prepare_media_prompt(request, loaded.model, loaded.template, n_ctx,
                                         loaded.projector, loaded.info.name)
            prompt = (media.prompt if media is not None
                      else prepare_prompt(request, loaded.model, loaded.template, n_ctx))
            kv = loaded.scheduler.kv
            sampling = answer_budget(request.sampling, prompt_len=len(prompt.tokens), n=request.n,
                                     n_ctx=n_ctx, n_slots=kv.n_slots, shares_prefixes=kv.sharing)
            # A schema can take a while to compile (and the first one builds the tokenizer).
            spec = request.constraint
            if spec is not None and prompt.in_reasoning and spec.in_reasoning is not None:
                spec = spec.in_reasoning  # a forced call only after the opened thinking
            constraint = loaded.compiler.start(spec) if spec is not None else None
            result = _Prepared(loaded, request, handle, prompt, sampling, constraint=constraint,
                               media=media)
        except BaseException as exc:  # whatever it is, the request's answer
            result = _Prepared(loaded, request, handle, error=_error_event(request.id, exc))
        finally:
            loaded.release()
        self._post(_Admit(result))

    def _admit_now(self, prepared: _Prepared) -> None:
        request, handle = prepared.request, prepared.handle
        self._preparing.discard(request.id)
        cancelled = request.id in self._cancel_on_admit
        self._cancel_on_admit.discard(request.id)
        if self._handles.get(request.id) is not handle or prepared.loaded is not self._loaded:
            return  # already answered: the model was unloaded meanwhile
        if prepared.error is not None:
            del self._handles[request.id]
            handle._put(prepared.error)
            return
        assert prepared.prompt is not None and prepared.sampling is not None
        loaded = prepared.loaded
        if prepared.prompt.in_reasoning:
            handle._put(ReasoningOpen(request.id))
        seqs = self._sequences(request, prepared.prompt, prepared.sampling, loaded,
                               prepared.constraint, prepared.media)
        loaded.scheduler.add(seqs)
        if prepared.media is not None and loaded.spec is not None:
            for seq in seqs:  # said once per sample (runtime.engine.media_prompt)
                self._emit(seq, seq.spec.step_stats(seq.request_id, seq.index, drafted=0,
                                                    accepted=0, cost_ratio=0.0,
                                                    measured_speedup=0.0,
                                                    drafting_off_reason=DRAFTING_OFF))
        if cancelled:
            loaded.scheduler.cancel(request.id)
        self._update_counts(loaded)

    def _cancel_now(self, request_id: str) -> None:
        if request_id in self._preparing:
            self._cancel_on_admit.add(request_id)
        if self._loaded is not None:
            self._loaded.scheduler.cancel(request_id)
            self._update_counts(self._loaded)

    def _answer_error(self, handle: EventQueueHandle, exc: BaseException) -> None:
        """A submit or admit that raised: the request ends with its error, nothing else does."""
        if self._handles.get(handle.id) is handle:
            del self._handles[handle.id]
        self._preparing.discard(handle.id)
        if self._loaded is not None:
            # Drops any sequences it has; their ErrorEvent goes nowhere (the handle is detached
            # above), the one below says what happened.
            self._loaded.scheduler.fail(handle.id, "EngineError", "")
        handle._put(_error_event(handle.id, exc))

    def _sequences(self, request: GenerationRequest, prepared: PreparedPrompt,
                   sampling: SamplingParams, loaded: _Loaded,
                   constraint: Constraint | None = None,
                   media: MediaPrompt | None = None) -> list[Sequence]:
        seqs: list[Sequence] = []
        now = time.perf_counter()
        for i in range(request.n):
            seed = None if sampling.seed is None else sampling.seed + i
            # n > 1: each sample its own grammar state, forked before any of them moves.
            own = constraint if constraint is None or i == request.n - 1 else constraint.fork()
            seq = Sequence(
                request_id=request.id, index=i, tokens=list(prepared.tokens),
                prompt_len=len(prepared.tokens), sampling=sampling,
                sampler=Sampler(sampling, seed, own), arrival=now,
                truncated_tokens=prepared.truncated_tokens,
                leader=seqs[0] if seqs else None, stops=StopMatcher(sampling.stop),
                constraint=own, logprobs=request.logprobs, media=media)
            if loaded.spec is not None and media is None:  # no drafting over images
                seq.drafter = loaded.spec.drafter_for(seq)
            seqs.append(seq)
        return seqs


def _error_event(request_id: str, exc: BaseException) -> ErrorEvent:
    """A request's failure as its event: a typed error keeps its class and line; anything
    else is labelled an engine failure, with its class, in one line."""
    if isinstance(exc, OutriderError):
        return ErrorEvent(request_id, type(exc).__name__, str(exc))
    detail = str(exc).splitlines()[0] if str(exc) else ""
    return ErrorEvent(request_id, "EngineError",
                      f"the engine failed on this request: {type(exc).__name__}"
                      + (f": {detail}" if detail else ""))


def messages_of(data: Seq[ChatMessage | dict[str, str]]) -> tuple[ChatMessage, ...]:
    """ChatMessages from dicts or ChatMessages (the CLI and tests use both)."""
    out = []
    for m in data:
        if isinstance(m, ChatMessage):
            out.append(m)
        elif isinstance(m, dict) and "role" in m and "content" in m:
            out.append(ChatMessage(m["role"], m["content"]))  # type: ignore[arg-type]
        else:
            raise SettingsError(f"a chat message needs a role and content, not {m!r}")
    return tuple(out)
