"""The planner against reality: llama.cpp's own buffer sizes and the process's RSS growth.

Each model is loaded in a fresh process (`python -m benchmarks.planner_calibration --json`)
through llama-cpp-python's low-level API: RSS growth is only meaningful for a first load,
and llama.cpp's log callback (where the buffer sizes come from) is process-global.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
LOG_ROUNDING = 16 << 10  # sizes are logged in MiB with two decimals


def calibrate(model: Path, *cases: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.planner_calibration", "--json", str(model), *cases],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    assert len(rows) == len(cases)
    return rows


def check(row: dict[str, Any], compute_rel: float) -> None:
    planned, reported = row["planned"], row["reported"]
    case = f"{row['model']} n_ctx={row['n_ctx']} {row['type_k']}/{row['type_v']} fa={row['flash_attn']}"
    # Weights and KV are exact (up to the log's rounding); compute is a fitted estimate.
    assert planned["weights"] == pytest.approx(reported["weights"], abs=LOG_ROUNDING), case
    assert planned["kv"] == pytest.approx(reported["kv"], abs=LOG_ROUNDING), case
    assert planned["compute"] == pytest.approx(reported["compute"], rel=compute_rel, abs=LOG_ROUNDING), case
    total_p, total_r = sum(planned.values()), sum(reported.values())
    assert abs(total_p - total_r) <= max(0.05 * total_r, 32 * MIB), case
    # What becomes resident at load: mapped weights, the cleared KV cache, host overhead
    # (compute pages are touched only by the batches that need them).
    resident = planned["weights"] + planned["kv"] + row["planned_overhead"]
    grown = row["rss_growth_model"] + row["rss_growth_context"]
    assert abs(grown - resident) <= max(0.05 * resident, 32 * MIB), (case, grown, resident)


TINY_CASES = ("512,f16,f16,on", "2048,f16,f16,off", "4096,q8_0,q8_0,on", "2048,q4_0,q4_0,on")


def test_tiny_target(tiny_target: Path) -> None:
    for row in calibrate(tiny_target, *TINY_CASES):
        check(row, compute_rel=0.10)


def test_tiny_draft(tiny_draft: Path) -> None:
    for row in calibrate(tiny_draft, "512,f16,f16,on", "2048,q8_0,q8_0,on", "1024,f16,f16,off"):
        check(row, compute_rel=0.20)


@pytest.mark.e2e
def test_smollm2(default_model: Path) -> None:
    rows = calibrate(default_model, "512,f16,f16,on", "2048,f16,f16,off", "4096,q8_0,q8_0,on",
                     "8192,q4_0,q4_0,on", "8192,f16,f16,off")
    for row in rows:
        check(row, compute_rel=0.03)
    # Over 10% of the total is KV at 8K f16: q4_0 cuts it to 9/32.
    assert rows[3]["reported"]["kv"] * 32 == pytest.approx(rows[4]["reported"]["kv"] * 9, abs=LOG_ROUNDING * 32)
