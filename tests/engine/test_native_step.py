"""The native decode step (runtime.engine.native_step) against the Python step it replaces:
the same tokens for the same requests — greedy and seeded sampling, one sequence and eight,
with prompt lookup and with a draft model, stop strings, and a batch in which some
sequences take the Python sampler (logprobs, penalties) and one a grammar's mask (sampled
in C: tests/engine/test_native_step_constrained.py) — and still lossless
under speculation. The Python path is forced with OUTRIDER_NATIVE_STEP=0; the rest of the
engine tests run once with it forced too (Makefile), so both paths pass them all."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from runtime.cli.main import main
from runtime.engine import native_step
from runtime.engine.engine import Engine
from runtime.errors import InvalidLogits
from runtime.events import (
    ConstraintSpec,
    ErrorEvent,
    Finished,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from runtime.llama.stepper import ENV_SWITCH, ERR_INVALID, native_step_status
from runtime.settings.load import DraftSettings
from runtime.speculative.speculation import Speculation
from tests.conftest import tiny_model_path
from tests.engine.conftest import tiny_settings
from tests.engine.test_losslessness_engine import (
    NEAR_DRAFT,
    PROMPT,
    SAMPLING,
    chi_square_p,
    exact_joint,
    settings_for,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=40)
SAMPLED = SamplingParams(temperature=0.9, max_tokens=40, seed=5)  # top-k 40, top-p, min-p
LOOPING = "an owl, an owl, an owl, an owl and"  # prompt lookup finds its drafts here
PROMPTS = tuple(f"sample number {i} says that the" for i in range(8))
ALPHA = 1e-3


@dataclass(frozen=True)
class Case:
    requests: tuple[GenerationRequest, ...]
    draft: DraftSettings = field(default_factory=DraftSettings)
    n_parallel: int = 1


def _req(prompt: str, sampling: SamplingParams, **kw: Any) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, sampling=sampling, **kw)


def _cases(draft: Path) -> dict[str, Case]:
    ngram = DraftSettings(kind="ngram", k=3, ngram_min=1, ngram_max=3)
    model = DraftSettings(kind="model", model_path=draft, k_max=4)
    return {
        "greedy": Case((_req("the cat went to the sea", GREEDY),)),
        "eight greedy": Case(tuple(_req(p, GREEDY) for p in PROMPTS), n_parallel=8),
        "sampled": Case((_req("the cat went to the sea", SAMPLED),)),
        "eight sampled": Case(tuple(_req(p, replace(SAMPLED, seed=i))
                                    for i, p in enumerate(PROMPTS)), n_parallel=8),
        "stop strings": Case((_req("the cat went to the sea", replace(GREEDY, stop=("e t",))),)),
        "ngram greedy": Case((_req(LOOPING, GREEDY),), ngram),
        "ngram sampled": Case((_req(LOOPING, SAMPLED),), ngram),
        "draft greedy": Case((_req("the cat went to the sea", GREEDY),), model),
        "draft sampled": Case((_req("the cat went to the sea", SAMPLED),), model),
        "draft greedy_match": Case((_req("the cat went to the sea", SAMPLED),),
                                   replace(model, verifier="greedy_match")),
        # Python samples the first two inside a native step; the grammar's row (its mask
        # handed over) and the fourth are the C code's.
        "mixed batch": Case((_req("the cat went", SAMPLED, logprobs=2),
                             _req("the dog went", replace(SAMPLED, repeat_penalty=1.3)),
                             _req("the owl went", GREEDY,
                                  constraint=ConstraintSpec("regex", "[a-z ]{4,30}")),
                             _req("the fox went", SAMPLED)), n_parallel=4),
    }


def _run(case: Case, target: Path, native: bool,
         monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[int]], list[str], int]:
    """Token ids and text per request, and how many decodes the native step made."""
    monkeypatch.setenv(ENV_SWITCH, "1" if native else "0")
    engine = Engine(speculation=Speculation())
    try:
        info = engine.load(settings_for(target, n_parallel=case.n_parallel, draft=case.draft))
        assert info.draft_refused is None
        handles = [engine.submit(r) for r in case.requests]
        tokens, texts = [], []
        for handle in handles:
            events = list(handle.events(timeout=120))
            assert isinstance(events[-1], Finished), events[-1]
            tokens.append([e.token_id for e in events if isinstance(e, TokenEvent)])
            texts.append("".join(e.text for e in events if isinstance(e, TokenEvent)))
        loaded = engine._loaded
        assert loaded is not None
        native_step = loaded.scheduler.native
        decodes = native_step.timings().decodes if native_step is not None else 0
        if loaded.spec is not None and loaded.spec.stepper is not None:
            decodes += loaded.spec.stepper.timings().decodes
        return tokens, texts, decodes
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def near_draft() -> Path:
    return tiny_model_path(NEAR_DRAFT)


@pytest.mark.parametrize("name", ["greedy", "eight greedy", "sampled", "eight sampled",
                                  "stop strings", "ngram greedy", "ngram sampled",
                                  "draft greedy", "draft sampled", "draft greedy_match",
                                  "mixed batch"])
def test_native_and_python_steps_give_the_same_tokens(name: str, tiny_target: Path,
                                                      near_draft: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded sampling included: the native step draws each sequence's uniforms from its
    own generator in the order the Python path does, with the same C kernels."""
    case = _cases(near_draft)[name]
    native, native_text, decodes = _run(case, tiny_target, True, monkeypatch)
    python, python_text, none = _run(case, tiny_target, False, monkeypatch)
    assert decodes > 0 and none == 0  # each path really ran
    assert native == python
    assert native_text == python_text
    assert all(len(t) > 1 for t in native)


def test_a_draft_models_rounds_through_the_native_step_are_lossless(
        tiny_target: Path, near_draft: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """test_losslessness_engine's exact joint distribution (top-k, top-p and min-p; without
    its repeat penalty, which takes the Python sampler), with the draft's k-step rounds and
    the verifies native: 63 requests of 16 samples, one after another, so that after each
    prompt's step every step only decodes (a step that evaluates a prompt is Python's)."""
    monkeypatch.setenv(ENV_SWITCH, "1")  # (the whole file runs with the switch off in CI too)
    sampling = replace(SAMPLING, repeat_penalty=1.0)
    expected = exact_joint(tiny_target, PROMPT, sampling, 4)
    counts: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    engine = Engine(speculation=Speculation())
    try:
        draft = DraftSettings(kind="model", model_path=near_draft, k=2, p_min=0.0)
        engine.load(settings_for(tiny_target, n_parallel=16, draft=draft))
        loaded = engine._loaded
        assert loaded is not None and loaded.scheduler.native is not None
        assert loaded.spec is not None and loaded.spec.stepper is not None
        for r in range(63):
            request = GenerationRequest(prompt=PROMPT, n=16,
                                        sampling=replace(sampling, seed=1000 + 16 * r))
            samples: dict[int, list[int]] = {i: [] for i in range(16)}
            for event in engine.submit(request).events(timeout=120):
                if isinstance(event, TokenEvent):
                    samples[event.index].append(event.token_id)
                elif isinstance(event, Finished) and event.speculative is not None:
                    drafted += event.speculative.drafted
                    accepted += event.speculative.accepted
            counts.update(tuple(t) for t in samples.values())
        assert loaded.spec.stepper.timings().decodes > 1000  # the draft rounds ran natively
        assert loaded.scheduler.native.timings().decodes > 100  # and the verifies
    finally:
        engine.stop()
    assert sum(counts.values()) == 1008 and all(len(t) == 4 for t in counts)
    assert drafted >= 1000 and 0.2 * drafted < accepted < drafted
    assert chi_square_p(counts, expected) > ALPHA


def test_the_switch_selects_the_python_step(tiny_target: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert native_step_status() == f"Python step ({ENV_SWITCH}=0)"
    engine = Engine()
    try:
        engine.load(tiny_settings(tiny_target))
        assert engine._loaded is not None and engine._loaded.scheduler.native is None
    finally:
        engine.stop()
    monkeypatch.delenv(ENV_SWITCH)
    assert native_step_status().startswith("native step")


@pytest.mark.parametrize("native", [True, False])
def test_run_profile_says_where_each_tokens_time_went(tiny_target: Path, native: bool,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV_SWITCH, "1" if native else "0")
    code = main(["run", str(tiny_target), "-p", "the cat went to the sea", "--raw", "--temp",
                 "0", "--max-tokens", "12", "--ctx", "256", "--threads", "1", "--profile"])
    _, err = capsys.readouterr()
    assert code == 0
    line = next(x for x in err.splitlines() if x.startswith("profile ("))
    assert line.startswith("profile (native step)" if native else "profile (Python step)")
    assert "per token: Python" in line and "llama_decode" in line and "sampling" in line


def test_rows_a_run_cannot_sample_fail_that_request_alone(tiny_target: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose C sampling refused one sequence's rows (NaN: ERR_INVALID) after two
    tokens: that request ends with InvalidLogits, its neighbour's tokens are those it
    gets alone, and the victim's cells are gone."""
    monkeypatch.setenv(ENV_SWITCH, "1")
    engine = Engine()
    try:
        engine.load(settings_for(tiny_target, n_parallel=2))
        neighbour = _req("the neighbour says", GREEDY)
        alone = [e.token_id for e in engine.submit(neighbour).events(timeout=60)
                 if isinstance(e, TokenEvent)]
        loaded = engine._loaded
        assert loaded is not None and loaded.scheduler.native is not None
        native, sched = loaded.scheduler.native, loaded.scheduler
        real_run = native._run
        victim = _req("the victim says", replace(GREEDY, max_tokens=200))

        def poisoned(entries: list[Any], *rest: Any) -> Any:
            rc, steps, results = real_run(entries, *rest)
            for i, (slot, *_) in enumerate(entries):
                seq = next(s for s in sched.running if s.slot == slot)
                if seq.request_id == victim.id and steps >= 3:
                    results[i] = (results[i][0][:2], ERR_INVALID)
            return rc, steps, results

        monkeypatch.setattr(native, "_run", poisoned)
        handles = [engine.submit(replace(neighbour, id="again")), engine.submit(victim)]
        events = [list(h.events(timeout=60)) for h in handles]
        assert [e.token_id for e in events[0] if isinstance(e, TokenEvent)] == alone
        error = events[1][-1]
        assert isinstance(error, ErrorEvent) and error.kind == InvalidLogits.__name__
        assert engine.status().active_sequences == 0
    finally:
        engine.stop()


def test_a_cancel_ends_a_run_after_the_step_in_progress(tiny_target: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel rings the engine's doorbell: a run of native decode steps allowed to go on
    for the whole reply (no step or time limit) ends after the step in progress, and the
    reply ends cancelled, far short of its max_tokens — without the doorbell the run would
    decode all of them and the reply end with "length"."""
    monkeypatch.setenv(ENV_SWITCH, "1")
    monkeypatch.setattr(native_step, "RUN_STEPS", 100_000)
    monkeypatch.setattr(native_step, "RUN_SECONDS", 1e9)
    engine = Engine()
    try:
        engine.load(tiny_settings(tiny_target, n_ctx=2048))
        handle = engine.submit(_req("a long one", SamplingParams(temperature=0, max_tokens=2000,
                                                                 ignore_eos=True)))
        events = []
        for event in handle.events(timeout=60):
            events.append(event)
            if len(events) == 1:
                handle.cancel()
        done = events[-1]
        assert isinstance(done, Finished) and done.reason == "cancelled"
        assert done.usage.completion_tokens < 1000
        assert engine.status().active_sequences == 0
    finally:
        engine.stop()
