"""A sequence's sampling as the native step takes it (`runtime.llama.stepper`), or None
where the Python sampler must run instead.

The native step samples exactly what `Sampler.sample` and the speculative verifier do —
the same C transform and inverse-CDF draw, the uniforms drawn from the sequence's own
numpy generator through its BitGenerator capsule, so a seeded reply is the same on both
paths. Penalties from the history stay in Python (`Sampler.penalise`), so such a sampler
gets None. So does a constrained one, unless the caller hands the step each row's mask
(`masks=True`: runtime.engine.native_step gives `TokenMask.step_form` with every
constrained token; a draft model's native round has no way to, so it drafts in Python):

    >>> from runtime.events import SamplingParams
    >>> step_config(Sampler(SamplingParams(temperature=0.0), seed=None), "greedy")
    (0, 0.0, 0, 1.0, 0.0, None)
    >>> cfg = step_config(Sampler(SamplingParams(temperature=0.7), seed=1), "leviathan")
    >>> cfg[:5]
    (1, 0.7, 40, 0.95, 0.05)
    >>> step_config(Sampler(SamplingParams(repeat_penalty=1.2), seed=1), "leviathan") is None
    True
"""

from __future__ import annotations

from typing import Any

from runtime.errors import ConstraintError, InvalidLogits, SettingsError
from runtime.sampling.sampler import INVALID_LOGITS, NOTHING_ALLOWED, Sampler
from runtime.sampling.verify import VerifyMode

# The step's modes (native/step.h): how a round is verified, and whether anything is drawn.
_MODES: dict[str, int] = {"greedy": 0, "leviathan": 1, "greedy_match": 2}

StepConfig = tuple[Any, ...]


def step_config(sampler: Sampler, rule: VerifyMode, *, masks: bool = False) -> StepConfig | None:
    """(mode, temperature, top_k, top_p, min_p, rng capsule, rng) for `sampler`, whose
    rounds the verifier judges by `rule` (greedy at temperature 0 whatever the rule); None
    when the sampler needs the Python path (penalties; a constraint unless `masks`: the
    caller then gives the step the constraint's mask for each token, and the same settings
    apply to what the mask leaves). The capsule points into the generator without holding
    it: the generator rides along, so the tuple keeps it."""
    if (sampler.constraint is not None and not masks) or sampler.penalised:
        return None
    p = sampler.params
    if p.greedy:
        return (0, 0.0, 0, 1.0, 0.0, None)
    mode = _MODES[rule if rule != "greedy" else "leviathan"]
    return (mode, float(p.temperature), int(p.top_k), float(p.top_p), float(p.min_p),
            sampler.rng.bit_generator.capsule, sampler.rng)


def step_error(code: int) -> Exception:
    """The exception the Python path raises where the native step returned `code` (< 0)
    for a sequence's rows (native/sampling.h, verify.h, step.h)."""
    if code in (-1, -20):  # a NaN, or a +inf where a token must be picked
        return InvalidLogits(INVALID_LOGITS)
    if code == -2:
        return SettingsError("every logit is -inf: nothing can be sampled")
    if code == -3:
        return MemoryError("no memory for the sampling buffers")
    if code == -10:
        return ValueError("a draft token has zero probability under its draft distribution q")
    if code == -30:  # the mask left no finite logit
        return ConstraintError(NOTHING_ALLOWED)
    return RuntimeError(f"the native step failed (code {code})")
