"""Speculative decoding: acceptance, tokens per target step and speed, against plain decoding,
llama.cpp's acceptance rule and `llama-speculative-simple`.

The pair is built from the default model: the target is SmolLM2-135M-Instruct converted to
F32 from the shipped Q4_1 with `llama_model_quantize` (allow_requantize; cached under the
user cache dir), the draft is the shipped Q4_1 itself. (An F16 target is too cheap to
verify-batch profitably on two cores.) For each temperature (0 and 0.8) the engine runs:

- off (plain decoding), prompt lookup (adaptive k), the draft model with fixed k = 2, 4, 8
  and adaptive k — all without the p_min early stop, so the rows differ only in k — and
  adaptive k with the settings' default early stop (p_min 0.3);
- at T > 0 also llama.cpp's acceptance rule (`verifier = greedy_match`: greedy drafts,
  accepted when the target's own sample equals them) at k = 4, against Outrider's
  min(1, p/q) at the same k.

Each run generates `--max-tokens` tokens (EOS ignored) after one chat prompt rendered with
the model's template; a short warm-up per load goes first. tok/s is per request, from the
first generated token to the last (prefill excluded); configurations are interleaved over
`--reps` repetitions and the ratios use the best rep of each (other jobs on a shared machine
only ever slow a run down), the median is shown beside it. At T = 0 every run is also compared
with plain decoding token by token ("= off"). With `--llama-speculative-simple PATH` the
same pair, prompt text, threads and token count go through
`llama-speculative-simple --spec-type draft-simple` at T = 0, with its default draft length
(3) and with 8; the faster of the two is the yardstick.

    nice python benchmarks/speculative.py --threads 2 \\
        --llama-speculative-simple ~/llama.cpp/build/bin/llama-speculative-simple

The same script runs on a GPU build: every layer of both models is offloaded when
llama.cpp can offload (and `-ngl/-ngld 999` is passed to llama.cpp's tool).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.engine.build import build_engine
from runtime.engine.engine import Engine
from runtime.events import ChatMessage, Finished, GenerationRequest, SamplingParams, TokenEvent
from runtime.llama.binding import supports_gpu_offload
from runtime.paths import user_dirs
from runtime.settings.load import DraftSettings, LoadSettings

PROMPT = ("Write a detailed, step-by-step guide to baking a loaf of bread at home: the "
          "ingredients, mixing, kneading, the first rise, shaping, the second rise, baking "
          "and cooling. Explain why each step matters.")
SYSTEM = "You are a helpful assistant."


@dataclass(frozen=True)
class Config:
    label: str
    draft: DraftSettings


@dataclass
class Result:
    config: Config
    temperature: float
    tok_s: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    rounds_len: list[float] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)

    @property
    def median_tok_s(self) -> float:
        return statistics.median(self.tok_s) if self.tok_s else 0.0

    @property
    def best_tok_s(self) -> float:
        """The fastest rep: on a shared machine other jobs only ever slow a run down."""
        return max(self.tok_s) if self.tok_s else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_len(self) -> float | None:
        return statistics.mean(self.rounds_len) if self.rounds_len else None


def f32_target(model: Path) -> Path:
    """The F32 conversion of `model`, made once and kept in the user cache."""
    from runtime.quality.quantize import QuantRecipe, quantize

    stem = model.name.split(".")[0]
    path = user_dirs().cache / "bench-models" / f"{stem}.F32.gguf"
    if not path.is_file():
        print(f"converting {model.name} to F32 → {path}", file=sys.stderr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize(model, path, QuantRecipe("F32", allow_requantize=True))
    return path


def configs(draft: Path, ks: list[int], temperature: float) -> list[Config]:
    out = [Config("off", DraftSettings()),
           Config("prompt lookup (adaptive)", DraftSettings(kind="ngram"))]
    for k in ks:
        out.append(Config(f"draft k={k}", DraftSettings(kind="model", model_path=draft, k=k,
                                                        p_min=0.0)))
    out.append(Config("draft adaptive", DraftSettings(kind="model", model_path=draft,
                                                      p_min=0.0)))
    out.append(Config("draft adaptive, p_min 0.3", DraftSettings(kind="model", model_path=draft,
                                                                 p_min=0.3)))
    if temperature > 0:
        out.append(Config("draft k=4, llama.cpp rule", DraftSettings(
            kind="model", model_path=draft, k=4, p_min=0.0, verifier="greedy_match")))
    return out


def load(target: Path, draft: DraftSettings, threads: int, gpu_layers: int | None,
         n_ctx: int) -> Engine:
    engine = build_engine()
    info = engine.load(LoadSettings(model_path=target, n_ctx=n_ctx, n_threads=threads,
                                    gpu_layers=gpu_layers, draft=draft))
    if draft.kind != "none" and info.draft is None:
        engine.stop()
        sys.exit(f"the draft was refused: {info.draft_refused}")
    return engine


def generate(engine: Engine, prompt: str, sampling: SamplingParams) -> tuple[list[int], Finished]:
    events = list(engine.submit(GenerationRequest(prompt=prompt, sampling=sampling)).events(timeout=1800))
    done = events[-1]
    if not isinstance(done, Finished):
        sys.exit(f"the engine failed: {done}")
    return [e.token_id for e in events if isinstance(e, TokenEvent)], done


def run_configs(target: Path, prompt: str, cfgs: list[Config], temperature: float, args: argparse.Namespace,
                gpu_layers: int | None) -> list[Result]:
    results = [Result(c, temperature) for c in cfgs]
    for rep in range(args.reps):
        for result in results:
            engine = load(target, result.config.draft, args.threads, gpu_layers, args.ctx)
            try:
                warm = SamplingParams(temperature=temperature, max_tokens=16, ignore_eos=True,
                                      seed=args.seed + 1000)
                generate(engine, prompt, warm)
                sampling = SamplingParams(temperature=temperature, max_tokens=args.max_tokens,
                                          ignore_eos=True, seed=args.seed + rep)
                tokens, done = generate(engine, prompt, sampling)
            finally:
                engine.stop()
            result.tok_s.append(done.timings.decode_tokens_per_s)
            result.tokens.append(tokens)
            spec = done.speculative
            if spec is not None:
                result.drafted += spec.drafted
                result.accepted += spec.accepted
                result.rounds_len.append(spec.mean_accepted_length)
            print(f"  T={temperature} {result.config.label}: {result.tok_s[-1]:.1f} tok/s"
                  + (f", acceptance {spec.acceptance_rate:.1%}" if spec else ""),
                  file=sys.stderr, flush=True)
    return results


def llama_speculative(binary: Path, target: Path, draft: Path, prompt: str, args: argparse.Namespace,
                      gpu: bool, n_max: int | None) -> dict[str, float]:
    cmd = [str(binary), "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple",
           "-p", prompt, "-n", str(args.max_tokens), "--ignore-eos", "--temp", "0",
           "-t", str(args.threads), "-c", str(args.ctx), "--seed", str(args.seed)]
    if n_max is not None:
        cmd += ["--spec-draft-n-max", str(n_max)]
    if gpu:
        cmd += ["-ngl", "999", "-ngld", "999"]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(binary.parent),
                                                          env.get("LD_LIBRARY_PATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"llama-speculative-simple failed ({proc.returncode}): {text.strip()[-800:]}")

    def grab(pattern: str) -> float:
        m = re.search(pattern, text)
        if m is None:
            sys.exit(f"no {pattern!r} in llama-speculative-simple's output")
        return float(m.group(1))

    return {"tok_s": grab(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s"),
            "drafted": grab(r"n_drafted\s*=\s*(\d+)"), "accepted": grab(r"n_accept\s*=\s*(\d+)"),
            "n_draft": grab(r"n_draft\s*=\s*(\d+)")}


def fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def table(results: list[Result]) -> list[str]:
    off = next(r for r in results if r.config.label == "off")
    lines = ["| T | drafter | acceptance | tokens / round | tok/s (best) | tok/s (median) | "
             "speedup vs off | = off |",
             "|---:|---|---:|---:|---:|---:|---:|:---:|"]
    for r in results:
        same = ""
        if r.temperature == 0 and r is not off:
            same = "yes" if r.tokens == off.tokens else "**no**"
        lines.append(
            f"| {r.temperature:g} | {r.config.label} | {fmt(r.acceptance, '.1%')} | "
            f"{fmt(r.mean_len)} | {r.best_tok_s:.1f} | {r.median_tok_s:.1f} | "
            f"{r.best_tok_s / off.best_tok_s:.2f}× | {same} |")
    return lines


def verdicts(by_temp: dict[float, list[Result]], llamas: list[dict[str, float]]) -> list[str]:
    out = []
    for temp, results in by_temp.items():
        named = {r.config.label: r for r in results}
        off, adaptive = named["off"], named["draft adaptive"]
        fixed = [r for r in results if r.config.label.startswith("draft k=") and "rule" not in r.config.label]
        best = max(fixed, key=lambda r: r.best_tok_s)
        out.append(f"- T={temp:g}: adaptive ÷ best fixed ({best.config.label}) = "
                   f"{adaptive.best_tok_s / best.best_tok_s:.3f} (goal ≥ 0.95); adaptive ÷ off = "
                   f"{adaptive.best_tok_s / off.best_tok_s:.3f} (goal ≥ 0.95)")
        rule = named.get("draft k=4, llama.cpp rule")
        ours = named.get("draft k=4")
        if rule is not None and ours is not None and rule.acceptance and ours.acceptance:
            out.append(f"- T={temp:g}: acceptance min(1, p/q) {ours.acceptance:.1%} vs llama.cpp's "
                       f"rule {rule.acceptance:.1%} at k=4: {ours.acceptance / rule.acceptance:.2f}× "
                       f"(goal ≥ 1.4); tok/s {ours.best_tok_s / rule.best_tok_s:.2f}×")
        if temp == 0 and llamas:
            for llama in llamas:
                out.append(f"- T=0: llama-speculative-simple, n_draft {llama['n_draft']:.0f}: "
                           f"{llama['tok_s']:.1f} tok/s, acceptance "
                           f"{llama['accepted'] / max(1.0, llama['drafted']):.1%}")
            top = max(llamas, key=lambda x: x["tok_s"])["tok_s"]
            bests = max((r for r in results if r.config.draft.kind == "model"),
                        key=lambda r: r.best_tok_s)
            out.append(f"- T=0: ÷ the faster llama-speculative-simple ({top:.1f} tok/s): "
                       f"Outrider adaptive {adaptive.best_tok_s / top:.3f}, best draft-model "
                       f"run ({bests.config.label}) {bests.best_tok_s / top:.3f} (goal ≥ 1.2); "
                       f"off {off.best_tok_s / top:.3f}")
    return out


def main() -> int:
    from runtime.library.default_model import default_model_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="the draft (default: the default model)")
    p.add_argument("--target", type=Path, default=None, help="the target (default: its F32 conversion)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ks", default="2,4,8", help="fixed draft lengths (2,4,8)")
    p.add_argument("--temps", default="0,0.8", help="temperatures (0,0.8)")
    p.add_argument("--llama-speculative-simple", type=Path, default=None)
    args = p.parse_args()

    draft = args.model or default_model_path()
    target = args.target or f32_target(draft)
    gpu = supports_gpu_offload()
    gpu_layers = 999 if gpu else None
    ks = [int(k) for k in args.ks.split(",")]
    temps = [float(t) for t in args.temps.split(",")]

    probe = load(target, DraftSettings(), args.threads, gpu_layers, args.ctx)
    prompt = probe.render_chat((ChatMessage("system", SYSTEM), ChatMessage("user", PROMPT)))
    probe.stop()
    load_avg = os.getloadavg()
    t0 = time.perf_counter()
    by_temp = {t: run_configs(target, prompt, configs(draft, ks, t), t, args, gpu_layers) for t in temps}
    llamas = []
    if args.llama_speculative_simple is not None and 0.0 in temps:
        for n_max in (None, 8):  # its default (3), and the longest fixed k here
            llamas.append(llama_speculative(args.llama_speculative_simple, target, draft,
                                            prompt, args, gpu, n_max))
    elapsed = time.perf_counter() - t0

    print(f"target {target.name}, draft {draft.name}, {args.threads} threads, "
          f"{args.max_tokens} tokens, {args.reps} rep(s), {'GPU' if gpu else 'CPU'}; "
          f"load average before {load_avg[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
          f"{elapsed:.0f} s\n")
    for results in by_temp.values():
        print("\n".join(table(results)))
        print()
    print("\n".join(verdicts(by_temp, llamas)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
