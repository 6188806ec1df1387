"""The GUI event loop's longest stalls while a reply streams at full speed (goal: p99 < 50 ms).

A timer probe fires every 5 ms on the GUI thread and records how late each tick is; the
stalls are the lateness beyond the 5 ms period. By default the reply comes from the fake
engine (tests/gui/fake_server.py) with no delay between tokens — faster than any real engine
on this machine, so the worst case for the transcript's rendering — with paragraphs and code
blocks (Markdown and pygments on every repaint). `--model FILE` streams from the real engine.

    python benchmarks/gui_stall.py --tokens 3000
    python benchmarks/gui_stall.py --model ~/.local/share/outrider/models/.../SmolLM2.gguf
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GOAL_P99_MS = 50.0
PERIOD_MS = 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3000, help="reply length (fake engine)")
    parser.add_argument("--token-delay", type=float, default=0.0,
                        help="seconds between tokens of the fake engine (0: as fast as it can)")
    parser.add_argument("--model", type=Path, help="stream from the real engine with this model")
    parser.add_argument("--max-tokens", type=int, default=400, help="reply length (real engine)")
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    home = tempfile.mkdtemp(prefix="outrider-stall-")
    os.environ["OUTRIDER_HOME"] = home

    from app.chat.store import ChatStore
    from app.engine.client import EngineClient, EngineState
    from app.qt import QtCore, QtWidgets
    from app.theme import LIGHT, apply_theme
    from app.window import MainWindow
    from runtime.events import SamplingParams
    from runtime.paths import user_dirs
    from runtime.settings.load import LoadSettings
    from tests.gui.conftest import fake_command

    app = QtWidgets.QApplication(sys.argv[:1])
    apply_theme(app, LIGHT)
    dirs = user_dirs()
    store = ChatStore(dirs.chats_db)
    command = None if args.model else fake_command(token_delay=args.token_delay,
                                                   metrics_interval=1.0)
    window = MainWindow(EngineClient(command, dirs.logs), store, dirs, LIGHT)
    window.resize(1400, 880)
    window.show()
    model = args.model
    if model is None:
        model = Path(home) / "fake.gguf"
        model.write_bytes(b"GGUF")
    window.load_model(LoadSettings(model_path=model, n_ctx=4096))

    ticks: list[float] = []
    state = {"streaming": False, "tokens": 0, "started": 0.0, "ended": 0.0}
    probe = QtCore.QTimer(interval=PERIOD_MS)
    probe.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
    probe.timeout.connect(lambda: ticks.append(time.perf_counter()) if state["streaming"] else None)

    def on_state(s: EngineState) -> None:
        if s != EngineState.READY or state["started"]:
            return
        c = window.controller
        c.new_conversation()
        c.set_sampling(SamplingParams(temperature=0.0, max_tokens=args.max_tokens
                                      if args.model else args.tokens + 10))
        state["streaming"] = True
        state["started"] = time.perf_counter()
        probe.start()
        c.send("Write a long essay about rivers." if args.model else f"[[tokens={args.tokens}]]")

    def on_finished(message: object) -> None:
        state["ended"] = time.perf_counter()
        state["streaming"] = False
        state["tokens"] = getattr(message, "stats", {}).get("tokens", 0)
        probe.stop()
        QtCore.QTimer.singleShot(0, window.close)

    window.client.state_changed.connect(on_state)
    window.controller.reply_finished.connect(on_finished)
    QtCore.QTimer.singleShot(300_000, window.close)
    window.destroyed.connect(app.quit)
    app.lastWindowClosed.connect(app.quit)
    app.exec()
    store.close()
    shutil.rmtree(home, ignore_errors=True)

    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(ticks)]
    stalls = [max(0.0, g - PERIOD_MS) for g in gaps]
    if not stalls:
        print("no samples: the reply never streamed")
        return 1
    seconds = state["ended"] - state["started"]
    p99 = percentile(stalls, 0.99)
    print(f"{'measure':<30}{'value':>10}{'goal':>10}{'ratio':>8}")
    print(f"{'stall p99 (ms)':<30}{p99:>10.1f}{GOAL_P99_MS:>10.1f}{p99 / GOAL_P99_MS:>8.2f}")
    print(f"{'stall p50 (ms)':<30}{statistics.median(stalls):>10.1f}")
    print(f"{'stall max (ms)':<30}{max(stalls):>10.1f}")
    print(f"{'tokens / s streamed':<30}{state['tokens'] / seconds:>10.0f}")
    fake = f"fake, {args.token_delay * 1000:g} ms between tokens"
    print(f"engine: {'real, ' + str(args.model) if args.model else fake}; "
          f"{state['tokens']} tokens in {seconds:.2f} s; {len(gaps)} probe ticks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
