"""A `Sequence`: one sample of one request as it moves through the scheduler.

`tokens` is the whole accepted sequence (prompt, then generated tokens). Its KV cells hold
positions 0..n_computed−1 in slot `slot`; whatever follows is still to be evaluated, so
prefill and decode are the same operation — evaluate `tokens[n_computed:]` (in chunks),
asking logits for the last one:

    prompt 5 tokens, nothing cached       pending = tokens[0:5]  → prefill (maybe chunked)
    after the prompt: 1 sampled token      pending = tokens[5:6]  → a decode step
    preempted after 3 generated tokens     n_computed = 0, pending = all 8 (recompute)

A preempted sequence keeps its generated tokens, sampler and constraint state, so after
recomputation it carries on exactly where it stopped.

`constraint` (structured output; runtime.sampling.constraint) is the same object its sampler
masks with: the scheduler advances it on every accepted token. `logprobs` is the request's
(None: off; 0: the sampled token's own; up to 20: that many alternatives too).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from runtime.engine.media_prompt import MediaPrompt
from runtime.engine.stops import StopMatcher
from runtime.events import FinishReason, SamplingParams, Timings
from runtime.llama.binding import Utf8Stream
from runtime.sampling.constraint import Constraint
from runtime.sampling.sampler import Sampler
from runtime.speculative.api import Drafter
from runtime.speculative.stats import ReplySpecStats


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    index: int  # which of the request's n samples
    tokens: list[int]
    prompt_len: int
    sampling: SamplingParams
    sampler: Sampler
    arrival: float = field(default_factory=time.perf_counter)
    status: Status = Status.WAITING
    slot: int = -1
    n_computed: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the cache at first admission
    truncated_tokens: int = 0  # prompt tokens dropped by middle truncation
    resumed_tokens: int = 0  # of cached_tokens, those restored from a saved KV cache file
    restore_s: float = 0.0  # how long restoring them took
    admitted_once: bool = False
    order: int = 0  # admission counter: the largest is the newest (preempted first)
    last_step: int = 0  # the scheduler step that last decoded it (fair rotation)
    leader: Sequence | None = None  # sample 0 of the same request, for n > 1
    drafter: Drafter | None = None  # speculative hook (runtime.speculative.api)
    constraint: Constraint | None = None  # structured output: also sampler.constraint
    logprobs: int | None = None  # top logprobs per token (None: none asked)
    media: MediaPrompt | None = None  # the prompt's images (runtime.engine.media_prompt)
    native: Any = None  # how the native step samples it, once known (runtime.engine.native_step)
    finish_reason: FinishReason | None = None
    utf8: Utf8Stream = field(default_factory=Utf8Stream)
    stops: StopMatcher = field(default_factory=lambda: StopMatcher(()))
    # statistics
    t_scheduled: float | None = None  # first time any of its prompt was evaluated
    t_first_token: float | None = None
    t_last_token: float | None = None
    prefill_computed: int = 0  # prompt tokens evaluated before the first token
    n_preempted: int = 0
    spec: ReplySpecStats = field(default_factory=ReplySpecStats)  # drafted, accepted, rounds
    spec_off_said: str | None = None  # the drafting-off reason last sent in a StepStats

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def pending(self) -> int:
        """Tokens still to evaluate before the next sample."""
        return len(self.tokens) - self.n_computed

    @property
    def decoding(self) -> bool:
        """Past the prompt: one pending token, a plain decode step."""
        return self.pending == 1 and self.n_computed > 0

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def timings(self, now: float) -> Timings:
        ttft = (self.t_first_token - self.arrival) if self.t_first_token is not None else 0.0
        prefill_s = ((self.t_first_token - self.t_scheduled)
                     if self.t_first_token is not None and self.t_scheduled is not None else 0.0)
        prefill_rate = self.prefill_computed / prefill_s if prefill_s > 0 else 0.0
        decode_s = ((self.t_last_token - self.t_first_token)
                    if self.t_last_token is not None and self.t_first_token is not None else 0.0)
        decode_rate = (self.n_generated - 1) / decode_s if decode_s > 0 and self.n_generated > 1 else 0.0
        return Timings(ttft_s=ttft, prefill_tokens_per_s=prefill_rate,
                       decode_tokens_per_s=decode_rate, total_s=now - self.arrival,
                       restore_s=self.restore_s)
