"""First run: with no models yet, offer the default model (already fetched by `make run`, or
fetched here off the GUI thread) and the catalogue's recommendations for this machine's memory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.qt import Qt, QtWidgets, Signal
from app.services.background import BackgroundRunner
from app.services.inbox import Inbox
from app.widgets import muted_label, page_column
from runtime.errors import OutriderError
from runtime.hub.catalog import load_catalog
from runtime.library.default_model import (
    SMOLLM2,
    ProgressCallback,
    WheelProgress,
    default_model_path,
)
from runtime.planner.devices import list_devices
from runtime.units import GIB, fmt_bytes, fmt_rate


@dataclass(frozen=True)
class Recommendation:
    """One catalogue model offered on the first run; `repo` is what its link opens."""

    name: str
    repo: str
    detail: str


def recommendations(limit: int = 4) -> tuple[int, list[Recommendation]]:
    """(free bytes, the catalogue chat models that run well here), best first (the catalogue's
    `for_machine`: fits in memory, then expected tok/s from this machine's cores or GPU).
    Runs on the background thread: it lists devices and reads the catalogue file."""
    devices = list_devices()
    roomiest = max(devices, key=lambda d: d.free_bytes, default=None)
    free = roomiest.free_bytes if roomiest is not None else 0
    gpu = roomiest is not None and roomiest.is_gpu
    rated = load_catalog().for_machine(free, cores=os.cpu_count() or 1, gpu=gpu, role="chat")
    return free, [Recommendation(m.name, m.repo,
                                 f"{m.params_b:g}B · {m.default_quant} · needs ~"
                                 f"{fmt_bytes(m.tier_gb * GIB, digits=2)} · about "
                                 f"{fmt_rate(tok_s)} here · {m.repo}")
                  for m, tok_s in rated[:limit]]


def _packaged() -> bool:
    return bool(getattr(sys, "frozen", False))  # a PyInstaller bundle (packaging/)


def fetch_default(on_progress: ProgressCallback) -> Path:
    """The default model's path, fetched with pip if missing; runs on the background thread
    and calls `on_progress` there (the page posts it to the GUI thread)."""
    return default_model_path(on_progress)


class FirstRunPage(QtWidgets.QWidget):
    """Signals:
        use_model(Path): load this model and go to the chat.
        open_repo(str): show this repository's quants (a recommendation's link).
        browse_models(): show the Models page.
        skip(): go to the chat without a model.
    """

    use_model = Signal(object)
    open_repo = Signal(str)
    browse_models = Signal()
    skip = Signal()

    def __init__(self, runner: BackgroundRunner, default_path: Path,
                 parent: QtWidgets.QWidget | None = None,
                 fetch: Callable[[ProgressCallback], Path] = fetch_default) -> None:
        super().__init__(parent)
        self._runner = runner
        self._default_path = default_path
        self._fetch = fetch
        self._fetch_inbox = Inbox(self)  # pip's progress: the background thread → the GUI thread
        self._fetch_inbox.received.connect(self._on_fetch_progress)
        outer = page_column(
            self, "Welcome to Outrider",
            "Run language models on your own machine. Nothing you type leaves it. "
            "Start with the small default model, or pick one that suits this machine.",
            margins=(48, 40, 48, 40), spacing=16, title_name="welcomeTitle")

        card = QtWidgets.QFrame()
        card.setObjectName("card")
        row = QtWidgets.QHBoxLayout(card)
        row.setContentsMargins(18, 14, 18, 14)
        text = QtWidgets.QLabel(
            f"<b>SmolLM2 135M Instruct</b> (Q4_1, {fmt_bytes(SMOLLM2.gguf_size)})<br>"
            "<span>Tiny and fast on any computer — good for trying Outrider, "
            "not for serious work.</span>")
        text.setWordWrap(True)
        row.addWidget(text, 1)
        self.default_button = QtWidgets.QPushButton()
        self.default_button.setObjectName("primary")
        self.default_button.clicked.connect(self._on_default)
        row.addWidget(self.default_button)
        outer.addWidget(card)
        self.download_bar = QtWidgets.QProgressBar()
        self.download_bar.setTextVisible(False)  # the theme's bar is a 6 px line: text below
        self.download_bar.hide()
        outer.addWidget(self.download_bar)
        self.status = muted_label()
        outer.addWidget(self.status)

        self.recommended_title = QtWidgets.QLabel("Recommended for this machine")
        self.recommended_title.setObjectName("panelTitle")
        outer.addWidget(self.recommended_title)
        self.recommended = muted_label("Checking free memory…")
        self.recommended.setTextFormat(Qt.TextFormat.RichText)
        self.recommended.linkActivated.connect(self._on_link)
        outer.addWidget(self.recommended)
        self._recommended: list[str] = []
        links = QtWidgets.QHBoxLayout()
        browse = QtWidgets.QPushButton("Browse models…")
        browse.clicked.connect(self.browse_models)
        skip = QtWidgets.QPushButton("Skip for now")
        skip.clicked.connect(self.skip)
        links.addWidget(browse)
        links.addWidget(skip)
        links.addStretch(1)
        outer.addLayout(links)
        outer.addStretch(1)
        self._update_default_button()
        job = runner.submit(recommendations)
        job.done.connect(self._on_recommendations)
        job.failed.connect(lambda exc: self.recommended.setText(f"No recommendations: {exc}"))

    def _update_default_button(self) -> None:
        if self._default_path.is_file():
            self.default_button.setText("Use this model")
        elif _packaged():
            self.default_button.setText("Find it on the Hub")
        else:
            self.default_button.setText(f"Download and use ({fmt_bytes(SMOLLM2.gguf_size)})")

    def _on_default(self) -> None:
        if self._default_path.is_file():
            self.use_model.emit(self._default_path)
            return
        if _packaged():
            # The packaged app has no pip to take the model out of its PyPI wheel: point to
            # the Hub (the same model, as bartowski/SmolLM2-135M-Instruct-GGUF) and to import.
            self.status.setText("Search the Hub for SmolLM2-135M-Instruct on the Models page, "
                                "or import a .gguf file you already have (Models → Library).")
            self.browse_models.emit()
            return
        self.default_button.setEnabled(False)
        self.status.setText("Downloading the default model from the package index…")
        # At 0 until pip reports bytes (it reports none for a wheel it has cached), never a
        # made-up fraction. Not Qt's "busy" bar (range 0..0): its Fusion animation crashed
        # the GUI tests now and then (heap corruption as a busy bar's page went away, ~1 run in
        # 20 of test_first_run_download_progress; none in 40 without it).
        self._waiting()
        self.download_bar.show()
        job = self._runner.submit(self._fetch, self._fetch_inbox.post)
        job.done.connect(self._on_fetched)
        job.failed.connect(self._on_fetch_failed)

    def _waiting(self) -> None:
        self.download_bar.setRange(0, 1)
        self.download_bar.setValue(0)
        self.download_bar.setFormat("waiting for the package index…")

    def _on_fetch_progress(self, progress: WheelProgress) -> None:
        # QProgressBar holds ints: KiB, as on the Downloads page. No total: still waiting.
        self.status.setText(progress.text())
        if not progress.total:
            self._waiting()
            return
        self.download_bar.setFormat("%p%")
        self.download_bar.setRange(0, max(progress.total // 1024, 1))
        self.download_bar.setValue(min(progress.received // 1024, self.download_bar.maximum()))

    def _on_fetched(self, path: Path) -> None:
        self.download_bar.setFormat("%p%")
        self.download_bar.setRange(0, 1)  # done, whether or not pip said how far it was
        self.download_bar.setValue(1)
        self.default_button.setEnabled(True)
        self._default_path = path
        self._update_default_button()
        self.status.setText(f"Saved to {path}")
        self.use_model.emit(path)

    def _on_fetch_failed(self, exc: object) -> None:
        self.download_bar.hide()
        self.default_button.setEnabled(True)
        message = str(exc) if isinstance(exc, OutriderError) else f"Download failed: {exc}"
        self.status.setText(message)

    def _on_recommendations(self, result: tuple[int, list[Recommendation]]) -> None:
        free, models = result
        self.recommended_title.setText(
            f"Recommended for this machine ({fmt_bytes(free)} free)")
        if not models:
            self.recommended.setText("No catalogue model fits the free memory right now.")
            return
        # One rich-text label with a link per model (as compact as the list it replaces);
        # a link opens the repository's quants on the Models page.
        items = "".join(f"<li><a href=\"{m.repo}\"><b>{m.name}</b></a><br>"
                        f"<span>{m.detail}</span></li>" for m in models)
        self.recommended.setText("Open one to see its quants and download it:"
                                 f"<ul style='margin-left:-20px'>{items}</ul>")
        self._recommended = [m.repo for m in models]

    def _on_link(self, repo_id: str) -> None:
        self.open_repo.emit(repo_id)

    def recommendation_links(self) -> list[str]:
        """The repositories the recommendations link to, best first."""
        return list(self._recommended)
