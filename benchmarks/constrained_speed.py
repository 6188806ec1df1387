"""What constrained decoding costs, and what prompt lookup earns under a JSON schema.

    nice python -m benchmarks.constrained_speed [--model FILE] [--threads 2] [--reps 3]

Two questions, each answered as a ratio of runs interleaved in one process:

1. Cost: the same chat prompt decoded with a typical 10-field object schema (`SCHEMA`) and
   without one. The constrained reply ends when its object is complete (N tokens); the free run
   then generates exactly N tokens (EOS ignored), so both decode the same number of tokens from
   the same context length. tok/s is the engine's decode rate (first token to last, prefill
   excluded); the ratio is constrained ÷ free. The engine's own mask time per token comes
   from timing the constraint's mask computation in the same run.
2. Prompt lookup: the schema's document written greedily (T = 0) by plain constrained decoding
   and by constrained decoding with prompt lookup (adaptive k); the tokens must be identical,
   and the ratio is lookup ÷ plain. JSON repeats its keys, and a list of records repeats them
   per record (`LIST_SCHEMA`), which is where lookup pays.

Without `--model` the default model (SmolLM2-135M-Instruct Q4_1) is used, and the F32
conversion that `benchmarks/speculative.py` makes for the lookup row as well (`--f32`).
Ratios use each configuration's best rep (other jobs only slow a run down); medians beside.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.engine.build import build_engine
from runtime.engine.engine import Engine
from runtime.events import (
    ChatMessage,
    ConstraintSpec,
    Finished,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from runtime.sampling import constraint as constraint_module
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


def load(model: Path, threads: int, draft: DraftSettings) -> Engine:
    engine = build_engine()
    engine.load(LoadSettings(model_path=model, n_ctx=2048, n_threads=threads, gpu_layers=0,
                             draft=draft))
    return engine


class MaskClock:
    """Wraps `Constraint._entry` (where every mask is computed, or read from the per-position
    cache the verifier shares with the drafter) to time what the engine pays per token."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._original = constraint_module.Constraint._entry

    def __enter__(self) -> MaskClock:
        original, seconds = self._original, self.seconds

        def timed(self_: object) -> object:
            t0 = time.perf_counter()
            try:
                return original(self_)  # type: ignore[arg-type]
            finally:
                seconds.append(time.perf_counter() - t0)

        constraint_module.Constraint._entry = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_: object) -> None:
        constraint_module.Constraint._entry = self._original  # type: ignore[method-assign]


def cost(model: Path, args: argparse.Namespace) -> list[str]:
    engine = load(model, args.threads, DraftSettings())
    spec = ConstraintSpec("json_schema", json.dumps(SCHEMA))
    free_rates: list[float] = []
    bound_rates: list[float] = []
    masks: list[float] = []
    n_tokens: list[int] = []
    try:
        warm = SamplingParams(temperature=0.8, max_tokens=16, seed=999)
        generate(engine, GenerationRequest(messages=_messages(PROMPT), sampling=warm,
                                           constraint=spec))
        for rep in range(args.reps):
            sampling = SamplingParams(temperature=0.8, max_tokens=400, seed=args.seed + rep)
            with MaskClock() as clock:
                tokens, done = generate(engine, GenerationRequest(
                    messages=_messages(PROMPT), sampling=sampling, constraint=spec))
            masks.extend(clock.seconds)
            bound_rates.append(done.timings.decode_tokens_per_s)
            n_tokens.append(len(tokens))
            free = SamplingParams(temperature=0.8, max_tokens=len(tokens), ignore_eos=True,
                                  seed=args.seed + rep)
            _, done = generate(engine, GenerationRequest(messages=_messages(PROMPT),
                                                         sampling=free))
            free_rates.append(done.timings.decode_tokens_per_s)
            print(f"  rep {rep}: constrained {bound_rates[-1]:.1f} tok/s ({len(tokens)} tokens),"
                  f" free {free_rates[-1]:.1f} tok/s", file=sys.stderr, flush=True)
    finally:
        engine.stop()
    mask_us = [s * 1e6 for s in masks]
    return [
        f"| {model.name} | {statistics.median(n_tokens):.0f} | {max(free_rates):.1f} "
        f"({statistics.median(free_rates):.1f}) | {max(bound_rates):.1f} "
        f"({statistics.median(bound_rates):.1f}) | **{max(bound_rates) / max(free_rates):.3f}** "
        f"| {statistics.mean(mask_us):.0f} / {statistics.median(mask_us):.0f} |"]


def lookup(model: Path, args: argparse.Namespace) -> list[str]:
    spec = ConstraintSpec("json_schema", json.dumps(LIST_SCHEMA))
    rates: dict[str, list[float]] = {"plain": [], "lookup": []}
    outputs: dict[str, list[int]] = {}
    accept: list[float] = []
    for rep in range(args.reps):
        for label, draft in (("plain", DraftSettings()), ("lookup", DraftSettings(kind="ngram"))):
            engine = load(model, args.threads, draft)
            try:
                greedy = SamplingParams(temperature=0.0, max_tokens=600)
                generate(engine, GenerationRequest(messages=_messages(LIST_PROMPT),
                                                   sampling=SamplingParams(temperature=0.0,
                                                                           max_tokens=16),
                                                   constraint=spec))
                tokens, done = generate(engine, GenerationRequest(
                    messages=_messages(LIST_PROMPT), sampling=greedy, constraint=spec))
            finally:
                engine.stop()
            rates[label].append(done.timings.decode_tokens_per_s)
            if label in outputs and outputs[label] != tokens:
                sys.exit(f"{label}: T = 0 output changed between reps")
            outputs[label] = tokens
            if done.speculative is not None:
                accept.append(done.speculative.acceptance_rate)
            print(f"  rep {rep} {label}: {rates[label][-1]:.1f} tok/s ({len(tokens)} tokens)",
                  file=sys.stderr, flush=True)
    same = outputs["plain"] == outputs["lookup"]
    ratio = max(rates["lookup"]) / max(rates["plain"])
    return [f"| {model.name} | {len(outputs['plain'])} | {max(rates['plain']):.1f} "
            f"({statistics.median(rates['plain']):.1f}) | {max(rates['lookup']):.1f} "
            f"({statistics.median(rates['lookup']):.1f}) | {statistics.mean(accept):.1%} "
            f"| **{ratio:.2f}×** | {'yes' if same else 'NO'} |"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--f32", action="store_true", help="also the lookup row on the F32 target")
    args = p.parse_args()
    if args.model is None:
        from runtime.library.default_model import fetch_default_model
        from runtime.paths import user_dirs

        dirs = user_dirs()
        args.model = fetch_default_model(dirs.models, dirs.cache)
    print("| model | tokens | free tok/s (median) | constrained tok/s (median) "
          "| constrained ÷ free | mask µs/token (mean / median) |")
    print("|---|---:|---:|---:|---:|---:|")
    for line in cost(args.model, args):
        print(line, flush=True)
    models = [args.model]
    if args.f32:
        from benchmarks.speculative import f32_target

        models.append(f32_target(args.model))
    print("\n| model | tokens | plain tok/s (median) | prompt lookup tok/s (median) "
          "| acceptance | lookup ÷ plain | identical at T = 0 |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for model in models:
        for line in lookup(model, args):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
