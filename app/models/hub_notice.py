"""The line a Hub page shows when a call failed: what happened in words, Retry, and for no
connection a link to the mirror setting.

    notice = HubNotice()
    notice.show_error(HubUnreachable("cannot reach https://huggingface.co: ..."), "Search")
    notice.retry_clicked.connect(page.run_search)
    notice.settings_requested.connect(window.show_app_settings)

Why words and not the exception: "cannot reach https://huggingface.co: [Errno -2] Name or
service not known" tells a newcomer nothing they can act on.
"""

from __future__ import annotations

from app.qt import QtWidgets, Signal
from runtime.errors import HubUnreachable

NO_CONNECTION = ("No connection to the Hugging Face Hub. Check your network, or set a mirror in "
                 '<a href="settings:app">Settings → App</a>.')


class HubNotice(QtWidgets.QFrame):
    """Signals:
        retry_clicked(): the user pressed Retry.
        settings_requested(): the user followed the link to Settings → App.

    Attributes: text — the message label; retry — the Retry button.
    """

    retry_clicked = Signal()
    settings_requested = Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("hubNotice")
        self.text = QtWidgets.QLabel()
        self.text.setWordWrap(True)
        self.text.setOpenExternalLinks(False)
        self.text.linkActivated.connect(self._on_link)
        self.retry = QtWidgets.QPushButton("Retry")
        self.retry.clicked.connect(self.retry_clicked)
        row = QtWidgets.QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.text, 1)
        row.addWidget(self.retry)
        self.hide()

    def show_error(self, exc: object, what: str) -> None:
        """Show why `what` ("Search", "Listing org/repo") failed."""
        self.text.setText(NO_CONNECTION if isinstance(exc, HubUnreachable)
                          else f"{what} failed: {exc}")
        self.show()

    def _on_link(self, _href: str) -> None:
        self.settings_requested.emit()
