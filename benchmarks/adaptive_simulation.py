"""The adaptive draft-length controller offline: its throughput against every fixed k and
against plain decoding, on measured CPU costs, over acceptance rates a real pair rarely
shows in one benchmark (a poor draft, a mediocre one, acceptance that comes in runs).

The real `Pacer` and `DraftLengthController` drive a simulated engine: each round drafts k
tokens at the measured per-token draft cost, accepts each with probability α (or, for the
"runs" rows, with α_hard in a fraction h of rounds and α_easy in the rest), and verifies at
the measured cost for k; a plain step costs the measured plain step. As in
`benchmarks/speculative.py`, a 16-token reply warms the load up and a 256-token reply is
measured; each cell averages 40 seeds. ±5% noise on every cost.

Costs measured on SmolLM2-135M (F32 target, Q4_1 draft), per round from the engine (2
threads) and straight from llama_decode (1 thread):

    2 threads: plain 25 ms, draft 14 ms/token, verify k = 1, 2, 4, 8: 40, 43, 46, 60 ms
    1 thread:  plain 38 ms, draft 17.3 ms/token, verify 45, 51.4, 54.2, 65.4 ms

    .venv/bin/python benchmarks/adaptive_simulation.py

This checks the controller's logic, not the engine: the goals themselves are measured by
`benchmarks/speculative.py` on the real pair.
"""

from __future__ import annotations

import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.settings.load import DraftSettings
from runtime.speculative.pacing import CostMemory, Pacer

MS = 1e-3
NOISE = 0.05
SEEDS = 40


@dataclass(frozen=True)
class Costs:
    name: str
    plain: float
    draft: float  # per drafted token
    verify: dict[int, float]  # measured points; linear in between, last slope beyond

    def verify_cost(self, k: int) -> float:
        pts = self.verify
        if k in pts:
            return pts[k]
        lo = max(x for x in pts if x < k)
        above = [x for x in pts if x > k]
        if not above:
            prev = max(x for x in pts if x < lo)
            return pts[lo] + (k - lo) * (pts[lo] - pts[prev]) / (lo - prev)
        hi = min(above)
        return pts[lo] + (pts[hi] - pts[lo]) * (k - lo) / (hi - lo)


COSTS = (
    Costs("2 threads", 25 * MS, 14 * MS, {1: 40 * MS, 2: 43 * MS, 4: 46 * MS, 8: 60 * MS}),
    Costs("1 thread", 38 * MS, 17.3 * MS, {1: 45 * MS, 2: 51.4 * MS, 4: 54.2 * MS, 8: 65.4 * MS}),
)
# α, or (h, α_hard, α_easy): acceptance in runs
ACCEPTANCE: tuple[float | tuple[float, float, float], ...] = (
    0.97, 0.94, 0.8, 0.6, 0.3, (0.12, 0.6, 0.995), (0.3, 0.5, 0.98))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def reply(pacer: Pacer, clock: Clock, costs: Costs, n: int,
          acceptance: float | tuple[float, float, float], rng: random.Random) -> float:
    """Generate n tokens through `pacer`; tokens per simulated second."""
    def noisy(x: float) -> float:
        return x * rng.uniform(1 - NOISE, 1 + NOISE)

    made, t0 = 0, clock.t
    while made < n:
        k = pacer.start(n - made)
        if k == 0:
            pacer.proposed(0)
            clock.t += noisy(costs.plain)
            made += 1
            continue
        clock.t += noisy(k * costs.draft)
        pacer.proposed(k)
        alpha = acceptance
        if isinstance(acceptance, tuple):
            h, hard, easy = acceptance
            alpha = hard if rng.random() < h else easy
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        clock.t += noisy(costs.verify_cost(k))
        pacer.observe(k, accepted)
        made += accepted + 1
    pacer.start(0)  # closes the last cycle
    pacer.reset()
    return made / (clock.t - t0)


def rate(costs: Costs, acceptance: float | tuple[float, float, float], k: int | None) -> float:
    rates = []
    for seed in range(SEEDS):
        rng, clock, memory = random.Random(seed), Clock(), CostMemory()
        draft = DraftSettings(kind="ngram", k=k, p_min=0.0)
        reply(Pacer(draft, clock=clock, memory=memory), clock, costs, 16, acceptance, rng)
        rates.append(reply(Pacer(draft, clock=clock, memory=memory), clock, costs, 256,
                           acceptance, rng))
    return statistics.mean(rates)


def main() -> int:
    print(f"{SEEDS} seeds, 16-token warm-up, 256 tokens measured, ±{NOISE:.0%} cost noise\n")
    print("| costs | acceptance | plain tok/s | best fixed k | its tok/s | adaptive tok/s "
          "| ÷ best fixed | ÷ plain |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for costs in COSTS:
        for acceptance in ACCEPTANCE:
            fixed = {k: rate(costs, acceptance, k) for k in (1, 2, 4, 8)}
            best = max(fixed, key=lambda k: fixed[k])
            adaptive = rate(costs, acceptance, None)
            plain = 1.0 / costs.plain
            label = (f"α {acceptance}" if not isinstance(acceptance, tuple) else
                     f"runs: {acceptance[0]:.0%} of rounds at α {acceptance[1]}, "
                     f"the rest {acceptance[2]}")
            print(f"| {costs.name} | {label} | {plain:.1f} | {best} | {fixed[best]:.1f} | "
                  f"{adaptive:.1f} | {adaptive / fixed[best]:.3f} | {adaptive / plain:.3f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
