"""Garbage cycles holding Qt objects are freed on the GUI thread, never by whichever worker
thread happened to allocate when CPython's collector would have run (app/gui_gc.py)."""

from __future__ import annotations

import gc
import threading
import weakref

from app.gui_gc import collect_on_gui_thread
from app.qt import QtCore


class _Holder:
    pass


def _orphan_a_qobject_in_a_cycle(freed_on: list[str]) -> None:
    holder = _Holder()
    holder.me = holder  # a cycle: only the collector can free it
    holder.obj = QtCore.QObject()  # Python-owned: freeing the wrapper deletes the C++ object
    weakref.finalize(holder.obj, lambda: freed_on.append(threading.current_thread().name))


def test_a_cycle_holding_a_qobject_is_freed_on_the_gui_thread(qtbot) -> None:
    collect_on_gui_thread()  # the GUI tests' fixture did this already; the app does it at start
    assert not gc.isenabled()
    freed_on: list[str] = []
    _orphan_a_qobject_in_a_cycle(freed_on)
    # With automatic collection on, these allocations make the worker collect the cycle (and
    # delete the QObject on the worker thread): freed_on == ["worker"].
    worker = threading.Thread(target=lambda: [[] for _ in range(100_000)], name="worker")
    worker.start()
    worker.join()
    assert freed_on == []
    young = [[] for _ in range(2_000)]  # past the first threshold: the next check collects
    qtbot.waitUntil(lambda: bool(freed_on), timeout=5_000)
    assert freed_on == [threading.current_thread().name]
    assert threading.current_thread() is threading.main_thread()
    del young
