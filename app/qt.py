"""The one module through which the app imports Qt (as qutebrowser's `qutebrowser.qt`).

Keeping every Qt import here makes the binding a single decision (PySide6) and gives one
place to adapt to API differences between Qt versions.

    from app.qt import QtCore, QtWidgets, Signal, Slot, Qt
    if isValid(widget): ...          # the C++ object still exists (not deleted by Qt)
"""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtNetwork, QtWidgets
from PySide6.QtCore import Qt, Signal, Slot
from shiboken6 import isValid

__all__ = ["Qt", "QtCore", "QtGui", "QtNetwork", "QtWidgets", "Signal", "Slot", "isValid"]
