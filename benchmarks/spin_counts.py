"""libgomp's spin (`GOMP_SPINCOUNT`) against time to first token and decode speed, the
machine quiet or running two busy processes: the table in `runtime/openmp.py`'s docstring
that chose `CROWDED_SPIN`.

    .venv/bin/python benchmarks/spin_counts.py [--model M] [--spins 300000,10000,3000,1000,300,0]

Each spin count runs in a fresh process (libgomp reads it once, as it loads): the engine
with the default thread count, three 64-token greedy replies to "Once upon a time"; the last
reply's TTFT and decode rate are printed. "busy" starts two CPU-bound processes first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ONE = """
import json, sys
from pathlib import Path
from runtime.engine.build import build_engine
from runtime.events import Finished, GenerationRequest, SamplingParams
from runtime.settings.load import LoadSettings
engine = build_engine()
engine.start()
engine.load(LoadSettings(model_path=Path(sys.argv[1])))
for _ in range(3):
    request = GenerationRequest(prompt="Once upon a time",
                                sampling=SamplingParams(temperature=0.0, max_tokens=64))
    done = [e for e in engine.submit(request).events(timeout=300) if isinstance(e, Finished)][0]
print(json.dumps({"ttft_ms": done.timings.ttft_s * 1e3,
                  "tok_s": done.timings.decode_tokens_per_s}))
engine.stop()
"""


def one(model: Path, spin: str) -> dict[str, float]:
    env = {**os.environ, "GOMP_SPINCOUNT": spin}
    done = subprocess.run([sys.executable, "-c", ONE, str(model)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--spins", default="300000,10000,3000,1000,300,0")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from runtime.library.default_model import default_model_path  # after the path

    model = args.model or default_model_path()
    spins = args.spins.split(",")
    rows = {spin: {"quiet": one(model, spin)} for spin in spins}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for spin in spins:
            rows[spin]["busy"] = one(model, spin)
    finally:
        for process in busy:
            process.kill()
    print("| GOMP_SPINCOUNT | quiet | busy |\n|---:|---|---|")
    for spin, seen in rows.items():
        cells = [f"{seen[m]['ttft_ms']:.0f} ms / {seen[m]['tok_s']:.0f} tok/s"
                 for m in ("quiet", "busy")]
        print(f"| {spin} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
