"""Speculative sampling through the whole engine is lossless: the tokens it emits are
distributed exactly as plain sampling from the target with the same settings.

On the tiny random models (the draft deliberately different from the target), one request
with n = N samples, each with its own seed, generates 4 tokens after a fixed prompt. The
draft length is fixed at 2 with no early stop, so positions 2-4 all come out of speculative
rounds (accepted drafts, residual corrections, bonus tokens, a second round). The joint
distribution of the 4 tokens is computed exactly from the target (every prefix evaluated
on its own context, the same `Sampler` math) and the samples are tested against it with a
chi-square test. Settings include top-k, top-p, min-p and a repeat penalty, so a verifier
that took penalties from the wrong history would fail too.

The same harness must fail for deliberately biased verifiers plugged into the same engine
path — accepting every draft, and drafting greedily but accepting with min(1, p/q) — which
shows it has the power to catch a wrong rule. One request per run and fixed seeds: the
engine thread sees the same batches every time, so the test is deterministic.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.engine.engine import Engine
from runtime.events import Finished, GenerationRequest, SamplingParams, StepStats, TokenEvent
from runtime.llama.binding import Batch, LlamaContext, LlamaModel
from runtime.llama.params import LlamaParams, to_llama_params
from runtime.sampling import native
from runtime.sampling.sampler import Sampler
from runtime.settings.load import DraftSettings, LoadSettings
from runtime.speculative.adaptive import DraftLengthController
from runtime.speculative.api import DraftProposal, DraftVerdict, SpecSetup
from runtime.speculative.speculation import SamplingVerifier, Speculation, target_distributions
from tests.conftest import tiny_model_path
from tests.engine.conftest import tiny_settings
from tests.fixtures.tiny_gguf import TARGET

N = 1000  # samples per run: both biased verifiers score p < 1e-300 with this many
ALPHA = 1e-3  # a correct verifier fails by chance one time in a thousand (fixed seeds: never)
N_TOKENS = 4
SAMPLING = SamplingParams(temperature=0.9, top_k=3, top_p=0.95, min_p=0.02, repeat_penalty=1.3,
                          max_tokens=N_TOKENS, ignore_eos=True, seed=1000)
PROMPT = (84, 104, 101, 32, 99, 97, 116)  # byte tokens
# The tiny draft shares no top-3 token with the target on this prompt (every draft is
# rejected, which is lossless but proves little), so the draft-model runs use a copy of the
# target with its weights scaled by 7/8: different (Σ min(p, q) ≈ 0.6-0.8 here), not unrelated.
NEAR_DRAFT = dataclasses.replace(TARGET, name="tiny-near-draft", weight_scale=0.07)
# Prompt lookup: no repeat penalty (it would punish exactly the tokens lookup proposes).
LOOKUP_SAMPLING = dataclasses.replace(SAMPLING, repeat_penalty=1.0)


# ---- the exact distribution ---------------------------------------------------------------

def settings_for(path: Path, **kw: Any) -> LoadSettings:
    """An F32 cache: an F16 one rounds K and V to 3 digits, so logits computed in other
    batches drift by ~1e-3 — enough to swap two near-tied tokens at the top-k cutoff (this
    prompt has one at 6e-4) and to make an exact comparison fail for the wrong reason."""
    return tiny_settings(path, type_k="f32", type_v="f32", flash_attn="off", **kw)


def exact_joint(path: Path, prompt: Sequence[int], params: SamplingParams,
                n_tokens: int, lp: LlamaParams | None = None,
                batch_size: int = 64) -> dict[tuple[int, ...], float]:
    """P(t1..tn) under plain sampling: every prefix evaluated alone, from scratch (with `lp`,
    llama.cpp's parameters, when the caller's model needs its own: an F32 cache else)."""
    lp = lp or to_llama_params(settings_for(path), 0)
    model = LlamaModel.load(path, lp)
    ctx = LlamaContext(model, lp)
    batch = Batch(batch_size)
    sampler = Sampler(params, 0)
    out: dict[tuple[int, ...], float] = {}

    def expand(generated: tuple[int, ...], prob: float) -> None:
        if len(generated) == n_tokens:
            out[generated] = prob
            return
        tokens = [*prompt, *generated]
        ctx.seq_rm(0, 0, -1)
        batch.clear()
        batch.add_tokens(tokens, 0, 0, True)
        assert ctx.decode(batch) == 0
        dist = sampler.distribution(ctx.logits(1)[0].copy(), tokens)
        for t in np.flatnonzero(dist > 0):
            expand((*generated, int(t)), prob * float(dist[t]))

    try:
        expand((), 1.0)
    finally:
        ctx.close()
        model.close()
    return out


def greedy_continuation(path: Path, prompt: Sequence[int], n: int) -> list[int]:
    """The target's own greedy text after `prompt`: quoting it makes a prompt whose
    continuation prompt lookup can guess (it repeats a few of its n-grams)."""
    joint = exact_joint(path, prompt, SamplingParams(temperature=0.0), n)
    (tokens,) = joint
    return list(tokens)


# ---- chi-square without scipy ---------------------------------------------------------------

def chi_square_p(counts: Counter[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> float:
    """p-value of the counts against the probabilities; outcomes expected fewer than 5
    times are pooled. An outcome of probability 0 gives 0.0."""
    n = sum(counts.values())
    if any(o not in expected for o in counts):
        return 0.0
    stat, bins = 0.0, 0
    pooled_obs = pooled_exp = 0.0
    for outcome, p in expected.items():
        e = n * p
        if e < 5:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += e
            continue
        stat += (counts.get(outcome, 0) - e) ** 2 / e
        bins += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        bins += 1
    return _upper_gamma_q((bins - 1) / 2, stat / 2)


def _upper_gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) (Numerical Recipes 6.2)."""
    if x <= 0.0:
        return 1.0
    front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        ap = a
        while abs(term) > abs(total) * 1e-15:
            ap += 1.0
            term *= x / ap
            total += term
        return max(0.0, 1.0 - total * math.exp(front))
    b, c, d = x + 1.0 - a, 1e300, 1.0 / (x + 1.0 - a)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return math.exp(front) * h


# ---- sampling through the engine -----------------------------------------------------------

class _BiasedSpeculation(Speculation):
    """The real drafters with another verifier plugged into the same engine path."""

    def __init__(self, verifier: Any) -> None:
        super().__init__()
        self.verifier = verifier

    def attach(self, model: Any, settings: LoadSettings) -> SpecSetup | None:
        setup = super().attach(model, settings)
        assert setup is not None and setup.refused is None
        return dataclasses.replace(setup, verifier=self.verifier)


class AcceptAll:
    """Biased: keeps every draft, then samples the bonus token from the target."""

    def verify(self, proposal: DraftProposal, rows: np.ndarray, sampler: Sampler,
               history: Sequence[int]) -> DraftVerdict:
        drafts = proposal.tokens
        p = target_distributions(rows, sampler, history, drafts)
        bonus = native.sample(np.ascontiguousarray(p[len(drafts)]), sampler.uniform())
        return DraftVerdict((*drafts, bonus), len(drafts), 0)


def sample_joint(engine: Engine, prompt: Sequence[int],
                 sampling: SamplingParams) -> tuple[Counter[tuple[int, ...]], int, int]:
    """N samples of the first N_TOKENS tokens (one request, n = N); and how many tokens
    were drafted and accepted in all."""
    request = GenerationRequest(prompt=tuple(prompt), sampling=sampling, n=N)
    tokens: dict[int, list[int]] = {i: [] for i in range(N)}
    drafted = accepted = 0
    for event in engine.submit(request).events(timeout=300):
        if isinstance(event, TokenEvent):
            tokens[event.index].append(event.token_id)
        elif isinstance(event, Finished):
            assert event.reason == "length"
            if event.speculative is not None:
                drafted += event.speculative.drafted
                accepted += event.speculative.accepted
        else:
            assert isinstance(event, StepStats), event
    return Counter(tuple(t) for t in tokens.values()), drafted, accepted


def run_engine(speculation: Speculation | None, target: Path, draft: DraftSettings,
               prompt: Sequence[int], sampling: SamplingParams = SAMPLING,
               ) -> tuple[Counter[tuple[int, ...]], int, int]:
    engine = Engine(speculation=speculation)
    try:
        info = engine.load(settings_for(target, n_parallel=16, draft=draft))
        assert (info.draft is not None) == (speculation is not None), info.draft_refused
        return sample_joint(engine, prompt, sampling)
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def near_draft() -> Path:
    return tiny_model_path(NEAR_DRAFT)


@pytest.fixture(scope="module")
def looping(tiny_target: Path) -> tuple[int, ...]:
    return (*PROMPT, *greedy_continuation(tiny_target, PROMPT, 50))


@pytest.fixture(scope="module")
def exact(tiny_target: Path, looping: tuple[int, ...]) -> dict[str, dict[tuple[int, ...], float]]:
    return {"prompt": exact_joint(tiny_target, PROMPT, SAMPLING, N_TOKENS),
            "looping": exact_joint(tiny_target, looping, LOOKUP_SAMPLING, N_TOKENS)}


def _model_draft(path: Path, verifier: str = "leviathan") -> DraftSettings:
    # Fixed k = 2 and no early stop: every round drafts, whatever the timings.
    return DraftSettings(kind="model", model_path=path, k=2, p_min=0.0,
                         verifier=verifier)  # type: ignore[arg-type]


# ---- the proofs -----------------------------------------------------------------------------

def test_plain_sampling_matches_the_exact_distribution(tiny_target: Path, exact: Any) -> None:
    """The harness itself: the engine without speculation passes."""
    counts, _, _ = run_engine(None, tiny_target, DraftSettings(), PROMPT)
    assert chi_square_p(counts, exact["prompt"]) > ALPHA


@pytest.mark.parametrize("verifier", ["leviathan", "greedy_match"])
def test_draft_model_speculation_is_lossless(tiny_target: Path, near_draft: Path, exact: Any,
                                             verifier: str) -> None:
    counts, drafted, accepted = run_engine(Speculation(), tiny_target,
                                           _model_draft(near_draft, verifier), PROMPT)
    assert drafted >= N and 0.2 * drafted < accepted < drafted  # both paths exercised
    assert chi_square_p(counts, exact["prompt"]) > ALPHA


def test_draft_lengths_that_change_between_rounds_are_lossless(
        tiny_target: Path, near_draft: Path, exact: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adaptive k changes the draft length from round to round (and the draft's cache then
    holds a different number of unverified tokens); a deterministic 1, 3, 2, ... per
    sequence stands in for it here, since the real controller follows timings."""
    lengths = (1, 3, 2)

    def next_k(self: DraftLengthController) -> int:
        n = self.__dict__.get("test_round", 0)
        self.__dict__["test_round"] = n + 1
        return lengths[n % len(lengths)]

    monkeypatch.setattr(DraftLengthController, "next_k", next_k)
    draft = DraftSettings(kind="model", model_path=near_draft, k_max=3, p_min=0.0)
    counts, drafted, accepted = run_engine(Speculation(), tiny_target, draft, PROMPT)
    assert drafted >= N and 0.2 * drafted < accepted < drafted
    assert chi_square_p(counts, exact["prompt"]) > ALPHA


def test_a_draft_that_is_always_rejected_is_lossless(tiny_target: Path, tiny_draft: Path,
                                                      exact: Any) -> None:
    """The tiny draft's top 3 never meet the target's: every round ends in a correction
    drawn from the residual, which must be p itself."""
    counts, drafted, accepted = run_engine(Speculation(), tiny_target, _model_draft(tiny_draft),
                                           PROMPT)
    assert drafted >= N and accepted == 0
    assert chi_square_p(counts, exact["prompt"]) > ALPHA


def test_prompt_lookup_speculation_is_lossless(tiny_target: Path, looping: tuple[int, ...],
                                               exact: Any) -> None:
    draft = DraftSettings(kind="ngram", k=2, ngram_min=1, ngram_max=3)
    counts, drafted, accepted = run_engine(Speculation(), tiny_target, draft, looping,
                                           LOOKUP_SAMPLING)
    assert drafted >= N and 0.2 * drafted < accepted < drafted
    assert chi_square_p(counts, exact["looping"]) > ALPHA


@pytest.mark.parametrize("biased", ["accept_all", "greedy_draft_min_p_over_q"])
def test_the_same_test_fails_a_biased_verifier(tiny_target: Path, near_draft: Path, exact: Any,
                                               biased: str) -> None:
    if biased == "accept_all":
        speculation, draft = _BiasedSpeculation(AcceptAll()), _model_draft(near_draft)
    else:
        # Greedy drafts (greedy_match in the settings makes the drafter take argmax q)
        # judged by min(1, p/q) as if they had been sampled from q: not lossless.
        speculation = _BiasedSpeculation(SamplingVerifier("leviathan"))
        draft = _model_draft(near_draft, "greedy_match")
    counts, _, _ = run_engine(speculation, tiny_target, draft, PROMPT)
    assert chi_square_p(counts, exact["prompt"]) < 1e-9
