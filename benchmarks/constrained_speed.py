"""What constrained decoding costs, and what prompt lookup earns under a JSON schema.

    nice python -m benchmarks.constrained_speed [--model FILE] [--threads 2] [--reps 5]

Two questions, each answered as a ratio of runs interleaved in one process:

1. Cost: the same chat prompt decoded with a typical 10-field object schema (`SCHEMA`) and
   without one, at T = 0.8. The constrained reply ends when its object is complete (N
   tokens); the free run then generates exactly N tokens (EOS ignored), so both decode the
   same number of tokens from the same context length. tok/s is the engine's decode rate
   (first token to last, prefill excluded); the ratio is constrained ÷ free — by best rep,
   by medians, and the median of each rep's own pair (the pairs run back to back, their
   order alternating, so a load change hits both). Mask time per token: what
   `Constraint._entry` (llguidance's fill and the `TokenMask` lookup) took, thread CPU time
   and wall, over the reply's tokens. Step time per token, for both runs: the engine's
   step profile (runtime.engine.step_profile: the period of each decode step, its
   `llama_decode`, the native step's C sampling, and the rest — Python, the mask included)
   summed over the reps' tokens. With the native step a constrained token is sampled in C
   under its mask (runtime.engine.native_step) and takes one step, where free decoding runs
   its steps back to back.
2. Prompt lookup: the schema's document written greedily (T = 0) by plain constrained
   decoding and by constrained decoding with prompt lookup (`--lookup-k`: adaptive k and a
   fixed k = 4 by default), each on a fresh engine, the configurations' order alternating
   per rep; the ratio is lookup ÷ plain — by best rep, the median of each rep's own pair,
   and by the process's CPU time per token (all threads; what other jobs on the machine
   disturb least). JSON repeats its keys, and a list of records repeats them per record
   (`LIST_SCHEMA`), which is where lookup pays. On a CPU a verify batch costs about half a
   decode step per draft (SmolLM2-135M Q4_1, 2 threads: 1.75 steps for 2 tokens, 3.05 for
   5), so only drafts accepted more often than not pay: see runtime/speculative/lookup_gate.

Identical output, and why it is checked twice. The lookup path is exact: each row is masked
with the grammar's state after the drafts before it, and the state rolls back with rejected
drafts (tests/unit/speculative/test_constrained_verify.py). But the target computes a
drafted token's logits in a (k + 1)-token verify batch, and ggml's CPU flash attention sums a
one-token decode's attention in another order than a batch's once the KV view is 512 cells
(llama.cpp pads it to 256, so from the 257th cell on): a single query splits the cells among
the threads and merges their partial softmaxes (`use_split_kv_path` in ggml-cpu/ops.cpp),
a batch gives each thread whole rows. On 2 threads the same token's logits then differ by up
to ~1.5 (median 0.5) between the two paths, enough to flip a top-2 gap of 0.04; on 1 thread
(one chunk) they are bit-identical at every length (700 positions checked). llama-server
has the same split: its plain decode's logprobs at 1 and 2 threads part at the 257th cell.
So:

- at `--threads` the timed replies are compared, and a difference is reported with its
  token, its KV cell and the top-2 gap of plain decoding's masked logits there; a
  difference before cell 257 would be a bug (the script says so);
- an untimed check at 1 thread, where both paths compute the same logits, must give the
  same tokens over the whole reply, for adaptive k and for a fixed k = 4 ("identical at
  1 thread" in the table).

Plain decoding (one shape only) must give the same tokens in every rep: the script stops if
not. Prompt lookup's reps may differ from each other at `--threads` > 1 — adaptive k picks
the draft lengths from measured times, so which tokens are computed in which batch varies.

Without `--model` the default model (SmolLM2-135M-Instruct Q4_1) is used, and the F32
conversion that `benchmarks/speculative.py` makes for the lookup row as well (`--f32`).
The machine's load average is printed before and after (other jobs only slow a run down).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.engine.build import build_engine
from runtime.engine.engine import Engine
from runtime.engine.step_profile import StepProfile
from runtime.events import (
    ChatMessage,
    ConstraintSpec,
    Finished,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from runtime.llama.stepper import ENV_SWITCH
from runtime.sampling import constraint as constraint_module
from runtime.sampling import sampler as sampler_module
from runtime.settings.load import DraftSettings, LoadSettings

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
        "city": {"type": "string"}, "country": {"type": "string"},
        "active": {"type": "boolean"}, "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "role": {"type": "string", "enum": ["admin", "editor", "viewer"]},
        "bio": {"type": "string", "maxLength": 200},
    },
    "required": ["name", "age", "email", "city", "country", "active", "score", "tags", "role",
                 "bio"],
    "additionalProperties": False,
}
RECORD = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24},
                   "city": {"type": "string", "maxLength": 24},
                   "age": {"type": "integer"}, "active": {"type": "boolean"}},
    "required": ["name", "city", "age", "active"], "additionalProperties": False,
}
LIST_SCHEMA = {"type": "object", "properties": {"people": {"type": "array", "items": RECORD,
                                                           "minItems": 8, "maxItems": 8}},
               "required": ["people"], "additionalProperties": False}
PROMPT = ("Invent a person for a test database and describe them as JSON with the fields "
          "name, age, email, city, country, active, score, tags, role and bio.")
LIST_PROMPT = ("List eight invented people for a test database as JSON: for each, name, city, "
               "age and whether the account is active.")


def _messages(text: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage("system", "You answer with JSON only."), ChatMessage("user", text))


def generate(engine: Engine, request: GenerationRequest) -> tuple[list[int], Finished]:
    events = list(engine.submit(request).events(timeout=1800))
    done = events[-1]
    if not isinstance(done, Finished):
        sys.exit(f"the engine failed: {done}")
    return [e.token_id for e in events if isinstance(e, TokenEvent)], done


def load(model: Path, threads: int, draft: DraftSettings, *, profile: bool = False,
         python_step: bool = False) -> Engine:
    """A loaded engine; `profile` keeps its step profile, `python_step` loads it on the
    Python step (the sampler sees every row: what GapRecorder reads)."""
    engine = build_engine(profile=profile)
    switch = os.environ.get(ENV_SWITCH)
    if python_step:
        os.environ[ENV_SWITCH] = "0"  # read at each load
    try:
        engine.load(LoadSettings(model_path=model, n_ctx=2048, n_threads=threads, gpu_layers=0,
                                 draft=draft))
    finally:
        if python_step:
            if switch is None:
                os.environ.pop(ENV_SWITCH, None)
            else:
                os.environ[ENV_SWITCH] = switch
    return engine


class StepClock:
    """Sums the engine's step profile (cumulative) over the runs made inside `timed()`."""

    FIELDS = ("tokens", "wall", "decode_wall", "sample_wall")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sums = dict.fromkeys(self.FIELDS, 0.0)

    def now(self) -> StepProfile:
        profile = self.engine.step_profile()
        if profile is None:
            sys.exit("the engine keeps no step profile")
        return profile

    def add(self, before: StepProfile) -> None:
        after = self.now()
        for name in self.FIELDS:
            self.sums[name] += getattr(after, name) - getattr(before, name)

    def cells(self) -> str:
        """µs per token: step, llama_decode, C sampling, the rest (Python, masks in)."""
        n = self.sums["tokens"] or 1.0
        step, decode, sample = (self.sums[k] / n * 1e6 for k in self.FIELDS[1:])
        return f"{step:.0f} | {decode:.0f} | {sample:.1f} | {step - decode - sample:.0f}"


SPLIT_KV_CELLS = 256  # from cell 257 on, a one-token decode sums attention another way


class MaskClock:
    """Wraps `Constraint._entry` (where every mask is computed, or read from the per-position
    cache the verifier shares with the drafter) to time what the engine pays: wall and the
    engine thread's CPU time, summed."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self._original = constraint_module.Constraint._entry

    def __enter__(self) -> MaskClock:
        original, clock = self._original, self

        def timed(self_: object) -> object:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return original(self_)  # type: ignore[arg-type]
            finally:
                clock.wall += time.perf_counter() - w0
                clock.cpu += time.thread_time() - c0

        constraint_module.Constraint._entry = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_: object) -> None:
        constraint_module.Constraint._entry = self._original  # type: ignore[method-assign]


class GapRecorder:
    """Records, per generated position, the gap between the two best masked logits of the
    row greedy sampling picked from (where a near-tie could flip). Python's sampler sees
    those rows only on the Python step (`load(..., python_step=True)`)."""

    def __init__(self) -> None:
        self.gaps: dict[int, float] = {}
        self._original = sampler_module.Sampler.sample

    def __enter__(self) -> GapRecorder:
        original, gaps = self._original, self.gaps

        def sample(self_: sampler_module.Sampler, row: Any, history: Any) -> int:
            token = original(self_, row, history)
            c = self_.constraint
            if c is not None:
                row_, _, _ = self_.prepared(row, history)
                top = np.partition(row_, row_.size - 2)[-2:] if row_.size > 1 else row_
                gaps[len(c._tokens)] = float(top.max() - top.min())
            return token

        sampler_module.Sampler.sample = sample  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_: object) -> None:
        sampler_module.Sampler.sample = self._original  # type: ignore[method-assign]


def _ratios(bound: list[float], free: list[float]) -> str:
    pairs = [b / f for b, f in zip(bound, free, strict=True)]
    return (f"**{max(bound) / max(free):.3f}** / {statistics.median(bound) / statistics.median(free):.3f}"
            f" / {statistics.median(pairs):.3f}")


def cost(model: Path, args: argparse.Namespace) -> list[str]:
    engine = load(model, args.threads, DraftSettings(), profile=True)
    bound_steps, free_steps = StepClock(engine), StepClock(engine)
    spec = ConstraintSpec("json_schema", json.dumps(SCHEMA))
    free_rates: list[float] = []
    bound_rates: list[float] = []
    mask_cpu = mask_wall = 0.0
    n_tokens: list[int] = []
    try:
        warm = SamplingParams(temperature=0.8, max_tokens=16, seed=999)
        generate(engine, GenerationRequest(messages=_messages(PROMPT), sampling=warm,
                                           constraint=spec))
        generate(engine, GenerationRequest(messages=_messages(PROMPT), sampling=warm))
        for rep in range(args.reps):
            seed = args.seed + rep
            # The constrained run decides N; the free run's rate is kept for the same rep.
            sampling = SamplingParams(temperature=0.8, max_tokens=400, seed=seed)
            before = bound_steps.now()
            with MaskClock() as clock:
                tokens, done = generate(engine, GenerationRequest(
                    messages=_messages(PROMPT), sampling=sampling, constraint=spec))
            n = len(tokens)
            free = SamplingParams(temperature=0.8, max_tokens=n, ignore_eos=True, seed=seed)
            bound_rate = done.timings.decode_tokens_per_s
            if rep % 2:  # alternate the order: free, then constrained again
                free_before = free_steps.now()
                _, done = generate(engine, GenerationRequest(messages=_messages(PROMPT),
                                                             sampling=free))
                free_steps.add(free_before)
                free_rate = done.timings.decode_tokens_per_s
                before = bound_steps.now()
                with MaskClock() as clock:
                    tokens, done = generate(engine, GenerationRequest(
                        messages=_messages(PROMPT), sampling=sampling, constraint=spec))
                bound_steps.add(before)
                bound_rate = done.timings.decode_tokens_per_s
            else:
                bound_steps.add(before)
                free_before = free_steps.now()
                _, done = generate(engine, GenerationRequest(messages=_messages(PROMPT),
                                                             sampling=free))
                free_steps.add(free_before)
                free_rate = done.timings.decode_tokens_per_s
            mask_cpu += clock.cpu
            mask_wall += clock.wall
            bound_rates.append(bound_rate)
            free_rates.append(free_rate)
            n_tokens.append(n)
            print(f"  rep {rep}: constrained {bound_rate:.1f} tok/s ({n} tokens), free "
                  f"{free_rate:.1f} tok/s, masks {clock.cpu / n * 1e6:.0f} µs/token CPU",
                  file=sys.stderr, flush=True)
    finally:
        engine.stop()
    total = sum(n_tokens)
    return [
        f"| {model.name} | {statistics.median(n_tokens):.0f} | {max(free_rates):.1f} "
        f"({statistics.median(free_rates):.1f}) | {max(bound_rates):.1f} "
        f"({statistics.median(bound_rates):.1f}) | {_ratios(bound_rates, free_rates)} "
        f"| {mask_cpu / total * 1e6:.0f} / {mask_wall / total * 1e6:.0f} |",
        "",
        "| run | step µs/token | llama_decode | sampling (C) | Python, masks in |",
        "|---|---:|---:|---:|---:|",
        f"| free | {free_steps.cells()} |",
        f"| constrained | {bound_steps.cells()} |"]


def _greedy(model: Path, threads: int, draft: DraftSettings, spec: ConstraintSpec,
            gaps: bool = False) -> tuple[list[int], Finished, float, dict[int, float]]:
    """One greedy reply under `spec` on a fresh engine: tokens, Finished, the process's CPU
    seconds for the reply (all threads: a load-robust second opinion on the rate), and
    (`gaps`) plain decoding's top-2 gaps per position."""
    engine = load(model, threads, draft, python_step=gaps)
    try:
        generate(engine, GenerationRequest(messages=_messages(LIST_PROMPT),
                                           sampling=SamplingParams(temperature=0.0,
                                                                   max_tokens=16),
                                           constraint=spec))
        request = GenerationRequest(messages=_messages(LIST_PROMPT), constraint=spec,
                                    sampling=SamplingParams(temperature=0.0, max_tokens=600))
        recorder = GapRecorder() if gaps else None
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        if recorder is None:
            tokens, done = generate(engine, request)
        else:
            with recorder:
                tokens, done = generate(engine, request)
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
        return tokens, done, cpu, recorder.gaps if recorder is not None else {}
    finally:
        engine.stop()


def _first_difference(a: list[int], b: list[int]) -> int | None:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return at if at is not None or len(a) == len(b) else min(len(a), len(b))


def _lookup_configs(ks: str) -> dict[str, DraftSettings]:
    configs = {}
    for k in ks.split(","):
        if k == "auto":
            configs["adaptive k"] = DraftSettings(kind="ngram")
        else:
            configs[f"k {int(k)}"] = DraftSettings(kind="ngram", k=int(k))
    return configs


def lookup(model: Path, args: argparse.Namespace) -> list[str]:
    spec = ConstraintSpec("json_schema", json.dumps(LIST_SCHEMA))
    configs = {"plain": DraftSettings(), **_lookup_configs(args.lookup_k)}
    rates: dict[str, list[float]] = {label: [] for label in configs}
    cpu_rates: dict[str, list[float]] = {label: [] for label in configs}
    outputs: dict[str, list[list[int]]] = {label: [] for label in configs}
    accept: dict[str, list[float]] = {label: [] for label in configs}
    prompt_len = 0
    for rep in range(args.reps):
        order = list(configs.items())
        for label, draft in order if rep % 2 == 0 else order[::-1]:
            tokens, done, cpu, _ = _greedy(model, args.threads, draft, spec)
            prompt_len = done.usage.prompt_tokens
            rates[label].append(done.timings.decode_tokens_per_s)
            cpu_rates[label].append(len(tokens) / cpu)
            outputs[label].append(tokens)
            if done.speculative is not None:
                accept[label].append(done.speculative.acceptance_rate)
            print(f"  rep {rep} {label}: {rates[label][-1]:.1f} tok/s, {cpu_rates[label][-1]:.1f} "
                  f"tok/CPU-s ({len(tokens)} tokens)", file=sys.stderr, flush=True)
    plain = outputs["plain"][0]
    if any(o != plain for o in outputs["plain"]):
        sys.exit("plain decoding at T = 0 gave different tokens in two reps: a bug")
    gaps: dict[int, float] | None = None
    one_thread: list[int] | None = None
    lines = []
    for label, draft in configs.items():
        if label == "plain":
            continue
        notes = []
        for i, tokens in enumerate(outputs[label]):
            at = _first_difference(plain, tokens)
            if at is None:
                continue
            cell = prompt_len + at + 1  # the cells the attention saw for that token's row
            if gaps is None:
                gaps = _greedy(model, args.threads, DraftSettings(), spec, gaps=True)[3]
            where = (f"token {at} (cell {cell}: BEFORE the split-KV boundary, not numerics)"
                     if cell <= SPLIT_KV_CELLS else f"token {at} (cell {cell})")
            notes.append(f"rep {i} from {where}, plain's top-2 gap there "
                         f"{gaps.get(at, float('nan')):.3f}")
        if one_thread is None:
            one_thread = _greedy(model, 1, DraftSettings(), spec)[0]
        exact = _greedy(model, 1, draft, spec)[0] == one_thread
        pairs = statistics.median(a / b for a, b in zip(rates[label], rates["plain"],
                                                         strict=True))
        cpu = statistics.median(cpu_rates[label]) / statistics.median(cpu_rates["plain"])
        lines.append(
            f"| {model.name} | {label} | {len(plain)} | {max(rates['plain']):.1f} "
            f"({statistics.median(rates['plain']):.1f}) | {max(rates[label]):.1f} "
            f"({statistics.median(rates[label]):.1f}) | {statistics.mean(accept[label]):.1%} "
            f"| **{max(rates[label]) / max(rates['plain']):.2f}×** / {pairs:.2f}× / {cpu:.2f}× "
            f"| {'yes' if not notes else 'no: ' + '; '.join(notes)} "
            f"| {'yes' if exact else 'NO'} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--f32", action="store_true", help="also the lookup row on the F32 target")
    p.add_argument("--skip-cost", action="store_true", help="only the prompt-lookup table")
    p.add_argument("--skip-lookup", action="store_true", help="only the cost table")
    p.add_argument("--lookup-k", default="auto,4",
                   help="prompt-lookup draft lengths to time, comma-separated (auto: adaptive)")
    args = p.parse_args()
    if args.model is None:
        from runtime.library.default_model import fetch_default_model
        from runtime.paths import user_dirs

        dirs = user_dirs()
        args.model = fetch_default_model(dirs.models, dirs.cache)
    print("load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    if not args.skip_cost:
        print("\n| model | tokens | free tok/s (median) | constrained tok/s (median) "
              "| constrained ÷ free (best / medians / pairs) | mask µs/token (CPU / wall) |")
        print("|---|---:|---:|---:|---:|---:|")
        for line in cost(args.model, args):
            print(line, flush=True)
    if not args.skip_lookup:
        models = [args.model]
        if args.f32:
            from benchmarks.speculative import f32_target

            models.append(f32_target(args.model))
        print("\n| model | lookup | tokens | plain tok/s (median) | prompt lookup tok/s (median) "
              "| acceptance | lookup ÷ plain (best / pairs / CPU) | identical at T = 0 "
              "| identical at 1 thread |")
        print("|---|---|---:|---:|---:|---:|---:|---|---|")
        for model in models:
            for line in lookup(model, args):
                print(line, flush=True)
    print("load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
