"""Python's cycle collector runs on the GUI thread only.

CPython collects garbage cycles in whichever thread happens to allocate when a threshold is
crossed: a download worker, a background runner, the Hub client. A Python-owned Qt object
caught in such a cycle (a QObject with no parent, a closed widget whose wrapper a lambda still
holds) is then destroyed on that thread while the GUI thread may be delivering its events —
which Qt forbids, and which shows as rare crashes and hangs (napari#1029 describes the same).
So automatic collection is switched off and the GUI thread collects on a timer instead, with
pyqtgraph's `GarbageCollector` (the same thresholds, checked every `interval_s`).

    app = QtWidgets.QApplication([])
    collect_on_gui_thread()        # once, on the GUI thread, after the application exists
"""

from __future__ import annotations

from pyqtgraph.util.garbage_collector import GarbageCollector

_collector: GarbageCollector | None = None  # kept alive: it owns the timer


def collect_on_gui_thread(interval_s: float = 1.0) -> None:
    """Disable automatic collection; collect from a GUI-thread timer. Idempotent."""
    global _collector
    if _collector is None:
        _collector = GarbageCollector(interval=interval_s)
