"""Outrider's perplexity (runtime.quality.evaluate) against llama.cpp's `llama-perplexity`.

Same model, same text, same context: the two should agree within 0.5% (they implement the
same method; differences come from batch shapes and float summation order). With
`--kld-model`, also compares the KL divergence of a second model against the first, with
llama-perplexity's --kl-divergence-base / --kl-divergence (full 16-bit log-probs) against
Outrider's top-k reference.

    python benchmarks/perplexity_vs_llamacpp.py --llama-perplexity /tmp/llama-tools/bin/llama-perplexity \\
        --model SmolLM2-135M-Instruct.Q4_1.gguf --text runtime/data/eval.txt --ctx 256
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.openmp import reference_env
from runtime.quality.evaluate import EvalOptions, evaluate


def llama_perplexity(binary: Path, args: list[str]) -> tuple[str, float]:
    started = time.perf_counter()
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, check=False,
                          env=reference_env())
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"llama-perplexity failed ({proc.returncode}):\n{out[-2000:]}")
    return out, time.perf_counter() - started


def grab(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    if match is None:
        raise SystemExit(f"could not find {pattern!r} in llama-perplexity's output")
    return float(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-perplexity", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--text", type=Path, default=Path("runtime/data/eval.txt"))
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=None, help="score only the first N chunks")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--kld-model", type=Path, default=None,
                        help="a second model to compare by KL divergence against --model")
    args = parser.parse_args()

    common = ["-f", str(args.text), "-c", str(args.ctx), "--no-warmup"]
    if args.chunks:
        common += ["--chunks", str(args.chunks)]
    if args.threads:
        common += ["-t", str(args.threads)]
    text = args.text.read_text(encoding="utf-8")
    opts = EvalOptions(n_ctx=args.ctx, n_threads=args.threads, max_chunks=args.chunks)

    rows: list[tuple[str, float, float, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        ref_llama = Path(tmp) / "base.kld"
        ref_ours = Path(tmp) / "base.npz"
        extra = ["--kl-divergence-base", str(ref_llama)] if args.kld_model else []
        out, t_llama = llama_perplexity(args.llama_perplexity, ["-m", str(args.model), *common, *extra])
        ppl_llama = grab(r"Final estimate: PPL = ([0-9.]+)", out)
        ours = evaluate(args.model, text, opts, save_kld_base=ref_ours if args.kld_model else None)
        rows.append((f"PPL {args.model.name}", ppl_llama, ours.ppl, f"{t_llama:.1f}s / {ours.seconds:.1f}s"))
        if args.kld_model:
            out, t_llama = llama_perplexity(args.llama_perplexity, [
                "-m", str(args.kld_model), *common, "--kl-divergence-base", str(ref_llama),
                "--kl-divergence"])
            theirs_ppl = grab(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)", out)
            theirs_kld = grab(r"Mean\s+KLD:\s*([0-9.]+)", out)
            theirs_top = grab(r"Same top p:\s*([0-9.]+)", out)
            q = evaluate(args.kld_model, text, opts, kld_base=ref_ours)
            timing = f"{t_llama:.1f}s / {q.seconds:.1f}s"
            rows.append((f"PPL {args.kld_model.name}", theirs_ppl, q.ppl, timing))
            rows.append(("mean KLD", theirs_kld, q.kld or 0.0, "(top-64 + 64 tail samples vs all, 16-bit)"))
            rows.append(("same top token %", theirs_top, q.same_top_pct or 0.0, ""))

    print(f"text {args.text} ({len(text):,} chars), ctx {args.ctx}, "
          f"{ours.n_chunks} chunks, {ours.n_scored} scored tokens")
    print(f"| {'measure':<44} | {'llama-perplexity':>16} | {'outrider':>12} | {'ratio':>8} | time (llama / ours) |")
    print(f"|{'-' * 46}|{'-' * 18}|{'-' * 14}|{'-' * 10}|---------------------|")
    worst = 0.0
    for name, theirs, mine, note in rows:
        ratio = mine / theirs if theirs else float("nan")
        if name.startswith("PPL"):
            worst = max(worst, abs(ratio - 1.0))
        print(f"| {name:<44} | {theirs:>16.6f} | {mine:>12.6f} | {ratio:>8.5f} | {note} |")
    verdict = "PASS" if worst <= 0.005 else "FAIL"
    print(f"largest PPL difference: {100 * worst:.4f}% (limit 0.5%) -> {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
