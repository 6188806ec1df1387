"""Time from process start to the first painted main window (goal: under 1.5 s on 2 cores).

Each run starts a fresh Python process that runs the app's real `main()` (without loading a
model: model loading is the engine's time, not the window's) and prints a line from an event
filter when the main window gets its first paint event; the parent measures from just before
it spawned the process to that line, so interpreter start-up and every import count.

    python benchmarks/gui_startup.py --runs 5              # offscreen
    xvfb-run -a python benchmarks/gui_startup.py --platform xcb
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 1.5

CHILD = r"""
import sys
from PySide6 import QtCore, QtWidgets

class FirstPaint(QtCore.QObject):
    done = False
    def eventFilter(self, obj, event):
        if (not self.done and event.type() == QtCore.QEvent.Type.Paint
                and isinstance(obj, QtWidgets.QMainWindow)):
            self.done = True
            print("FIRST_PAINT", flush=True)
            QtCore.QTimer.singleShot(0, obj.close)
        return False

app = QtWidgets.QApplication(sys.argv[:1])
probe = FirstPaint()
app.installEventFilter(probe)
from app.main import main
sys.exit(main(["--no-model"]))
"""


def run_once(platform: str) -> float:
    with tempfile.TemporaryDirectory(prefix="outrider-bench-") as home:
        env = dict(os.environ, OUTRIDER_HOME=home, QT_QPA_PLATFORM=platform,
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                              if p))
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        elapsed = None
        for line in proc.stdout:
            if line.strip() == "FIRST_PAINT":
                elapsed = time.perf_counter() - start
                break
        proc.wait(timeout=60)
        if elapsed is None:
            raise SystemExit(f"the app exited ({proc.returncode}) without painting a window")
        return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--platform", default="offscreen", help="Qt platform (offscreen, xcb)")
    args = parser.parse_args()
    run_once(args.platform)  # warm the OS file cache; not counted
    times = [run_once(args.platform) for _ in range(args.runs)]
    median = statistics.median(times)
    print(f"{'measure':<34}{'value':>10}{'goal':>10}{'ratio':>8}")
    print(f"{'start → first paint, median (s)':<34}{median:>10.3f}{GOAL_S:>10.2f}"
          f"{median / GOAL_S:>8.2f}")
    print(f"{'min / max (s)':<34}{min(times):>5.3f} / {max(times):.3f}")
    print(f"runs: {args.runs}, platform: {args.platform}, python: {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
