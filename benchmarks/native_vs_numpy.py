"""Native kernels against their numpy references, per row, at real vocabulary sizes.

    .venv/bin/python setup.py build_ext --inplace        # build runtime._native first
    .venv/bin/python benchmarks/native_vs_numpy.py [--rows 30] [--vocab 49152 151936]

Prints a Markdown table: for each vocabulary size and setting, the median microseconds per
row of `runtime.sampling.kernels.transform` (numpy) and of the native transform writing into a
preallocated float64 row, and their ratio; then the same for one speculative verify round
(k = 4, dense p and q rows) and one inverse-CDF draw. The goal is native ≥ 5× numpy for the
transform at the typical settings.

Logits are synthetic: N(0, scale²) float32 (scale 2.5 by default, about as peaked as a small
chat model's logits at T = 1; at 152k tokens min-p 0.05 then keeps a few hundred).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.sampling import kernels, native
from runtime.sampling import verify as verify_mod

SETTINGS = [  # label, temperature, top_k, top_p, min_p
    ("T=0.8 top_k=40 top_p=0.95 min_p=0.05", 0.8, 40, 0.95, 0.05),
    ("T=0.8 top_k=0 top_p=0.95 min_p=0.05", 0.8, 0, 0.95, 0.05),
    ("T=0.8 top_k=0 top_p=0.95 (no min_p)", 0.8, 0, 0.95, 0.0),
    ("T=1 no filters (softmax only)", 1.0, 0, 1.0, 0.0),
    ("T=0 greedy", 0.0, 40, 0.95, 0.05),
]


def per_row_us(fn: Callable[[int], object], rows: int) -> float:
    """Median microseconds of fn(row) over the rows (one warm-up call first)."""
    fn(0)
    times = []
    for r in range(rows):
        t0 = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=30, help="rows timed per cell")
    parser.add_argument("--vocab", type=int, nargs="+", default=[49_152, 151_936])
    parser.add_argument("--scale", type=float, default=2.5, help="std of the logits")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    ext = native.native_kernels()
    if ext is None:
        print(f"runtime._native is not usable: {native.native_status()}", file=sys.stderr)
        return 1
    rng = np.random.default_rng(args.seed)
    print(f"kernels: {native.native_status()}; {args.rows} rows per cell, median\n")
    print("| vocab | operation | numpy µs/row | native µs/row | ratio |")
    print("|---:|---|---:|---:|---:|")
    for n in args.vocab:
        logits = (rng.standard_normal((args.rows, n)) * args.scale).astype(np.float32)
        for label, numpy_fn, native_fn in cells(ext, logits, rng):
            numpy_us, native_us = per_row_us(numpy_fn, args.rows), per_row_us(native_fn, args.rows)
            print(f"| {n:,} | {label} | {numpy_us:,.0f} | {native_us:,.0f} | "
                  f"{numpy_us / native_us:.1f}× |", flush=True)
    return 0


Cell = tuple[str, Callable[[int], object], Callable[[int], object]]


def cells(ext: native.NativeKernels, logits: np.ndarray, rng: np.random.Generator) -> list[Cell]:
    """(label, numpy per-row call, native per-row call) for one vocabulary size."""
    rows, n = logits.shape
    out = np.empty(n)
    result: list[Cell] = []
    for label, t, k, p, m in SETTINGS:
        result.append((
            label,
            lambda r, t=t, k=k, p=p, m=m: kernels.transform(logits[r], temperature=t, top_k=k,
                                                             top_p=p, min_p=m),
            lambda r, t=t, k=k, p=p, m=m: ext.transform(logits[r], out, t, k, p, m),
        ))
    # one verify round, k = 4: p is 5 rows, q 4 rows of transformed distributions
    k_draft = 4
    fresh = (rng.standard_normal((2 * k_draft + 1, n)) * float(logits.std())).astype(np.float32)
    dists = np.stack([kernels.transform(row, temperature=0.8, top_k=0, top_p=1.0, min_p=0.0)
                      for row in fresh])
    p_rows, q_rows = dists[:k_draft + 1].copy(), dists[k_draft + 1:].copy()
    drafts = np.array([int(np.argmax(row)) for row in q_rows], dtype=np.int32)
    draws = rng.random((rows, k_draft + 1))
    result.append((
        "verify round, k=4, dense p and q",
        lambda r: verify_mod.verify(drafts, p_rows, q_rows, draws[r]),
        lambda r: ext.verify(drafts, p_rows, q_rows, draws[r], "leviathan"),
    ))
    probs = dists[0]
    result.append((
        "sample (inverse CDF)",
        lambda r: kernels.sample(probs, float(draws[r, 0])),
        lambda r: ext.sample(probs, float(draws[r, 0])),
    ))
    return result


if __name__ == "__main__":
    sys.exit(main())
