"""BackgroundRunner and Inbox under the app's patterns for 5,000 rounds, in a child process
(tests/gui/background_stress.py): no crash, and no runner's worker thread left behind.

The design before (a QObject per job, a child of its runner) crashed this within its first four
rounds, every time (40 runs of 4 and 8 rounds: 40 crashes; glibc's "malloc_consolidate():
unaligned fastbin chunk detected", or a segmentation fault, after Qt's "shared QObject was
deleted directly").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 5000


def test_five_thousand_rounds_without_a_crash() -> None:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONFAULTHANDLER="1")
    run = subprocess.run([sys.executable, "-m", "tests.gui.background_stress",
                          "--rounds", str(ROUNDS)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"exit {run.returncode}:\n{output[-6000:]}"
    assert f"{ROUNDS} rounds, 0 worker threads left" in run.stdout
    assert "Traceback" not in output, output[-6000:]
