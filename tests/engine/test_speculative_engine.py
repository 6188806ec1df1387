"""Speculative decoding in the engine on the tiny GGUFs: greedy output unchanged with every
drafter, the draft model's cache kept in step through rollbacks, an incompatible draft
refused with its reasons, statistics streamed and kept, drafting switched off out loud,
and the `run --draft` / `draft make` commands."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.cli.main import main
from runtime.engine.engine import Engine
from runtime.events import (
    Event,
    Finished,
    GenerationRequest,
    SamplingParams,
    StepStats,
    TokenEvent,
)
from runtime.sampling.sampler import Sampler
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.api import DraftProposal, DraftVerdict, SpecSetup
from runtime.speculative.pacing import CostMemory, Pacer
from runtime.speculative.speculation import SamplingVerifier, Speculation
from tests.engine.conftest import tiny_settings

PROMPTS = ["the cat went to the sea and then", "the dog went to the hill and then",
           "an owl, an owl, an owl and"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
EVERY_TOKEN = tuple(range(3, 271))  # every plain token once: a 1-gram lookup always hits


def exact(path: Path, **kw: Any) -> LoadSettings:
    """F32 cache, no flash attention: logits of a token evaluated alone and in a batch of
    k + 1 then agree to ~1e-6 (F16 K/V drift by ~1e-3), so a draft model that is the target
    itself gives q = p and near-ties cannot flip an argmax."""
    return tiny_settings(path, type_k="f32", type_v="f32", flash_attn="off", **kw)


def run_all(engine: Engine, prompts: Seq[str | tuple[int, ...]],
            sampling: SamplingParams = GREEDY) -> list[list[Event]]:
    """Submit every prompt at once (they are batched together), then collect."""
    handles = [engine.submit(GenerationRequest(prompt=p, sampling=sampling)) for p in prompts]
    return [list(h.events(timeout=60)) for h in handles]


def tokens_of(events: Seq[Event]) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent)]


def finished(events: Seq[Event]) -> Finished:
    done = events[-1]
    assert isinstance(done, Finished), done
    return done


@pytest.fixture(scope="module")
def reference(tiny_target: Path) -> list[list[int]]:
    engine = Engine()
    try:
        engine.load(exact(tiny_target, n_parallel=3))
        return [tokens_of(e) for e in run_all(engine, PROMPTS)]
    finally:
        engine.stop()


def spec_engine(settings: LoadSettings, speculation: Speculation | None = None) -> Iterator[Engine]:
    engine = Engine(speculation=speculation or Speculation())
    try:
        engine.load(settings)
        yield engine
    finally:
        engine.stop()


# ---- greedy output is unchanged -------------------------------------------------------------

DRAFTERS = {
    "ngram-adaptive": lambda d, t: DraftSettings(kind="ngram", ngram_min=1),
    "ngram-k3": lambda d, t: DraftSettings(kind="ngram", k=3, ngram_min=1),
    "draft-model-adaptive": lambda d, t: DraftSettings(kind="model", model_path=d),
    "draft-model-k4": lambda d, t: DraftSettings(kind="model", model_path=d, k=4, p_min=0.0),
    "self-draft-k5": lambda d, t: DraftSettings(kind="model", model_path=t, k=5, p_min=0.0),
    "self-draft-greedy-match": lambda d, t: DraftSettings(kind="model", model_path=t, k=3,
                                                          p_min=0.0, verifier="greedy_match"),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_output_is_token_identical_with_every_drafter(
        tiny_target: Path, tiny_draft: Path, reference: list[list[int]], name: str) -> None:
    draft = DRAFTERS[name](tiny_draft, tiny_target)
    for engine in spec_engine(exact(tiny_target, n_parallel=3, draft=draft)):
        results = run_all(engine, PROMPTS)
        assert [tokens_of(e) for e in results] == reference
        if name.startswith("self-draft"):
            # The target drafting for itself at T = 0: every draft is its own argmax.
            for events in results:
                spec = finished(events).speculative
                assert spec is not None and spec.drafted > 0 and spec.acceptance_rate == 1.0


def test_preemption_with_a_draft_model_keeps_the_output(tiny_target: Path) -> None:
    """Three replies that do not fit the cache together: the newest is preempted (its
    drafter closes and gives its draft slot back), recomputed later, and drafts again."""
    sampling = dataclasses.replace(GREEDY, max_tokens=100)
    settings = exact(tiny_target, n_ctx=256, n_parallel=3)
    plain = Engine()
    try:
        plain.load(settings)
        want = [tokens_of(run_all(plain, [p], sampling)[0]) for p in PROMPTS]
    finally:
        plain.stop()
    draft = DraftSettings(kind="model", model_path=tiny_target, k=4, p_min=0.0)
    for engine in spec_engine(dataclasses.replace(settings, draft=draft)):
        results = run_all(engine, PROMPTS, sampling)
        assert engine._loaded is not None and engine._loaded.scheduler.n_preemptions > 0
        assert [tokens_of(e) for e in results] == want
        for events in results:  # the draft's cache followed the recomputed sequence
            spec = finished(events).speculative
            assert spec is not None and spec.drafted > 0 and spec.acceptance_rate == 1.0


def test_greedy_with_a_repeat_penalty_is_unchanged(tiny_target: Path) -> None:
    """Penalties come from the accepted history plus the drafts before each position."""
    sampling = dataclasses.replace(GREEDY, repeat_penalty=1.5, penalty_last_n=16)
    plain = Engine()
    try:
        plain.load(exact(tiny_target))
        want = [tokens_of(e) for e in run_all(plain, PROMPTS[:2], sampling)]
    finally:
        plain.stop()
    draft = DraftSettings(kind="model", model_path=tiny_target, k=4, p_min=0.0)
    for engine in spec_engine(exact(tiny_target, draft=draft)):
        results = run_all(engine, PROMPTS[:2], sampling)
        assert [tokens_of(e) for e in results] == want
        assert all(finished(e).speculative.acceptance_rate == 1.0 for e in results)  # type: ignore[union-attr]


# ---- the draft model's cache follows the accepted tokens --------------------------------

class TruncatingVerifier:
    """Verifies only the first j of k drafts (j drawn at random), so rounds end early and
    the drafter must roll its cache back; records (j, accepted) per round."""

    def __init__(self) -> None:
        self.inner = SamplingVerifier()
        self.rng = np.random.default_rng(7)
        self.rounds: list[tuple[int, int, int]] = []

    def verify(self, proposal: DraftProposal, rows: np.ndarray, sampler: Sampler,
               history: Seq[int]) -> DraftVerdict:
        k = len(proposal.tokens)
        j = int(self.rng.integers(0, k + 1))
        q = None if proposal.q_rows is None else proposal.q_rows[:j]
        verdict = self.inner.verify(DraftProposal(proposal.tokens[:j], q), rows[:j + 1],
                                    sampler, history)
        self.rounds.append((k, j, verdict.n_accepted))
        return DraftVerdict(verdict.tokens, verdict.n_accepted, k - verdict.n_accepted)


class _WithVerifier(Speculation):
    def __init__(self, verifier: Any) -> None:
        super().__init__()
        self.verifier = verifier

    def attach(self, model: Any, settings: LoadSettings) -> SpecSetup | None:
        setup = super().attach(model, settings)
        assert setup is not None
        return dataclasses.replace(setup, verifier=self.verifier)


def test_the_draft_cache_follows_rollbacks_at_temperature(tiny_target: Path) -> None:
    """The target as its own draft at T > 0: q = p exactly while the draft's cache holds the
    accepted tokens, so min(1, p/q) = 1 and every judged draft is accepted — after rounds
    cut short and rolled back, after corrections, after all-accepted rounds (the draft
    then decodes x_k and the bonus together)."""
    verifier = TruncatingVerifier()
    sampling = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.02,
                              repeat_penalty=1.2, max_tokens=60, ignore_eos=True, seed=3)
    draft = DraftSettings(kind="model", model_path=tiny_target, k=4, p_min=0.0)
    for engine in spec_engine(exact(tiny_target, n_parallel=2, draft=draft),
                              _WithVerifier(verifier)):
        results = run_all(engine, PROMPTS[:2], sampling)
        assert all(len(tokens_of(e)) == 60 for e in results)
    cut_short = [r for r in verifier.rounds if r[1] < r[0]]
    assert len(cut_short) > 10
    assert all(accepted == j for _, j, accepted in verifier.rounds)


def test_seeded_speculative_sampling_is_reproducible(tiny_target: Path, tiny_draft: Path) -> None:
    sampling = SamplingParams(temperature=0.8, max_tokens=40, seed=11, ignore_eos=True)
    draft = DraftSettings(kind="model", model_path=tiny_target, k=3, p_min=0.0)
    runs = []
    for _ in range(2):
        for engine in spec_engine(exact(tiny_target, draft=draft)):
            runs.append(tokens_of(run_all(engine, PROMPTS[:1], sampling)[0]))
    assert runs[0] == runs[1] and len(runs[0]) == 40


# ---- pacing: what a round costs, what the next reply starts from --------------------------

class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_pacer_times_whole_cycles_and_keeps_one_off_costs_out() -> None:
    clock = ManualClock()
    pacer = Pacer(DraftSettings(kind="ngram"), clock=clock)
    assert pacer.start(8) == 8  # learning: the longest draft first
    clock.t += 0.005  # drafting 8 (0.003 of it a one-off prefill)
    pacer.proposed(8, one_off=0.003)
    clock.t += 0.030  # the target's batch, the verify, emitting
    pacer.observe(8, 3)
    assert pacer.start(8) == 0  # a plain step to time the yardstick
    ctl = pacer.controller
    assert ctl.t_draft == pytest.approx(0.002 / 8)
    assert ctl.verify_cost(8) == pytest.approx(0.030)
    assert pacer.timing.emitted == 4 and pacer.timing.seconds == pytest.approx(0.035)
    pacer.proposed(0)
    clock.t += 0.020
    assert pacer.start(8) == 4  # still learning: half as long, for the verify line's slope
    assert ctl.t_plain == pytest.approx(0.020)
    assert pacer.measured_speedup == pytest.approx(5 / 0.055 * 0.020)


def test_a_new_reply_starts_from_what_the_last_one_learned() -> None:
    clock, memory = ManualClock(), CostMemory()
    first = Pacer(DraftSettings(kind="ngram"), clock=clock, memory=memory)
    for _ in range(6):
        k = first.start(8)
        clock.t += 0.001 * k
        first.proposed(k)
        clock.t += 0.010
        first.observe(k, k)
    first.reset()
    assert memory.controller is not None and memory.t_plain is not None
    second = Pacer(DraftSettings(kind="ngram"), clock=clock, memory=memory)
    assert memory.controller.state == "on"
    # no learning phase again: the cheap, always-accepted drafts go straight to a long k
    assert second.start(8) == 8
    fixed = Pacer(DraftSettings(kind="ngram", k=3), clock=clock, memory=CostMemory())
    assert fixed.start(8) == 0  # a fixed k times one plain step per load ...
    fixed.proposed(0)
    clock.t += 0.01
    assert [fixed.start(8) for _ in range(3)] == [3, 3, 3]  # ... and then keeps k


# ---- refusal, statistics, switching off ---------------------------------------------------

def test_an_incompatible_draft_is_refused_with_reasons_and_the_target_runs(
        tiny_target: Path, alien_draft: Path) -> None:
    draft = DraftSettings(kind="model", model_path=alien_draft)
    for engine in spec_engine(tiny_settings(tiny_target, draft=draft)):
        info = engine.loaded
        assert info is not None and info.draft is None
        assert info.draft_refused is not None
        assert alien_draft.name in info.draft_refused
        # Same byte tokens, other specials: ids 0-4 are skipped by llama.cpp's token-text
        # check, so the BOS/EOS check is what catches it.
        assert "the target's EOS token '<|im_end|>' (id 2) is '<unk>' in the draft" \
            in info.draft_refused
        assert any(n.startswith("drafting off: ") for n in info.notes)
        events = run_all(engine, PROMPTS[:1])[0]
        assert len(tokens_of(events)) == GREEDY.max_tokens
        assert finished(events).speculative is None
        assert not any(isinstance(e, StepStats) for e in events)


def test_a_missing_draft_file_is_refused_not_fatal(tiny_target: Path, tmp_path: Path) -> None:
    draft = DraftSettings(kind="model", model_path=tmp_path / "nope.gguf")
    for engine in spec_engine(tiny_settings(tiny_target, draft=draft)):
        info = engine.loaded
        assert info is not None and info.draft is None and "nope.gguf" in (info.draft_refused or "")
        assert tokens_of(run_all(engine, PROMPTS[:1])[0])


def test_statistics_are_streamed_per_round_and_kept_per_reply(tiny_target: Path) -> None:
    draft = DraftSettings(kind="model", model_path=tiny_target, k=4, p_min=0.0)
    for engine in spec_engine(exact(tiny_target, draft=draft)):
        info = engine.loaded
        assert info is not None and info.draft == tiny_target.stem
        assert any("drafting with" in n for n in info.notes)
        events = run_all(engine, PROMPTS[:1])[0]
    steps = [e for e in events if isinstance(e, StepStats)]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    spec = finished(events).speculative
    assert spec is not None and steps
    rounds = [s for s in steps if s.drafted]
    assert sum(s.drafted for s in rounds) == spec.drafted
    assert sum(s.accepted for s in rounds) == spec.accepted
    assert sum(t.from_draft for t in tokens) == spec.accepted
    assert all(s.k <= 4 for s in steps)
    assert spec.mean_accepted_length > 1.0
    last = rounds[-1]
    assert (last.reply_drafted, last.reply_accepted) == (spec.drafted, spec.accepted)
    assert last.acceptance_rate == spec.acceptance_rate == spec.accepted / spec.drafted
    assert last.mean_accepted_length == spec.mean_accepted_length
    assert last.predicted_speedup > 0 and last.measured_speedup > 0  # a fixed k measures too


class StepClock:
    """A fake clock for the drafters' timings: each propose's start comes 1 s after the
    previous call (the target's work), its end 10 s after its start (drafting). Drafting
    then never pays, and the adaptive controller must switch it off and say why."""

    def __init__(self) -> None:
        self.t = 0.0
        self._steps = itertools.cycle((1.0, 10.0))

    def __call__(self) -> float:
        self.t += next(self._steps)
        return self.t


def test_adaptive_drafting_switches_off_out_loud(tiny_target: Path) -> None:
    draft = DraftSettings(kind="ngram", ngram_min=1)  # adaptive k
    for engine in spec_engine(tiny_settings(tiny_target, draft=draft),
                              Speculation(clock=StepClock())):
        sampling = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
        handle = engine.submit(GenerationRequest(prompt=EVERY_TOKEN, sampling=sampling))
        reason = metric = None
        for event in handle.events(timeout=60):
            if isinstance(event, StepStats) and event.drafting_off_reason:
                reason = event.drafting_off_reason
            if reason is not None and metric is None:
                metric = engine.metrics().drafting_off_reason
        assert reason is not None and reason.startswith("speculation off")
        assert "trying again in" in reason
        assert metric is not None and metric.startswith("speculation off")
        assert engine.metrics().drafting_off_reason is None  # nothing runs any more


# ---- the commands -----------------------------------------------------------------------------

def test_run_with_a_draft_prints_the_statistics(tiny_target: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(tiny_target), "-p", PROMPTS[0], "--raw", "--temp", "0",
                 "--max-tokens", "24", "--ctx", "256", "--threads", "1",
                 "--draft", str(tiny_target), "--draft-k", "3"])
    _, err = capsys.readouterr()
    assert code == 0
    assert f"draft {tiny_target.stem}" in err
    line = next(x for x in err.splitlines() if x.startswith("drafted "))
    assert "accepted" in line and "%" in line and "tokens per round" in line
    assert " · k " in line and "predicted" in line and "measured" in line


def test_run_with_ngram_and_a_bad_k(tiny_target: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(tiny_target), "-p", "x", "--draft", "ngram", "--draft-k", "many"])
    _, err = capsys.readouterr()
    assert code == 2 and "--draft-k must be auto or a number" in err
    code = main(["run", str(tiny_target), "-p", PROMPTS[2], "--raw", "--temp", "0",
                 "--max-tokens", "16", "--ctx", "256", "--threads", "1", "--draft", "ngram",
                 "--verifier", "greedy_match"])
    assert code == 0


def test_draft_make_writes_a_compatible_draft_next_to_the_target(
        tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "tiny.F32.gguf"
    target.write_bytes(tiny_target.read_bytes())
    assert main(["draft", "make", str(target), "--type", "Q8_0", "--threads", "1"]) == 0
    out, _ = capsys.readouterr()
    made = tmp_path / "tiny.Q8_0.gguf"
    assert made.is_file() and "next to the target" in out and "--draft" in out
    # it drafts for its target
    draft = DraftSettings(kind="model", model_path=made, k=2)
    for engine in spec_engine(tiny_settings(target, draft=draft)):
        assert engine.loaded is not None and engine.loaded.draft == made.stem
    # a quantized target needs --allow-requantize
    assert main(["draft", "make", str(made), "--type", "Q4_0"]) == 2
    assert "--allow-requantize" in capsys.readouterr().err


def test_info_says_which_sampling_kernels_run(tiny_target: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.sampling.native import native_status

    assert main(["info", str(tiny_target)]) == 0
    assert f"sampling and verify: {native_status()}" in capsys.readouterr().out
