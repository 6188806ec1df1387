"""First run: with no models yet, offer the default model (already fetched by `make run`, or
fetched here off the GUI thread) and the catalogue's recommendations for this machine's memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.qt import Qt, QtWidgets, Signal
from app.services.background import BackgroundRunner
from app.widgets import muted_label, page_column
from runtime.errors import OutriderError
from runtime.library.default_model import SMOLLM2
from runtime.units import fmt_bytes


def recommendations(limit: int = 4) -> tuple[int, list[tuple[str, str]]]:
    """(free bytes, [(name, detail)]) of catalogue chat models that fit free memory now.
    Runs on the background thread: it lists devices and reads the catalogue file."""
    from runtime.hub.catalog import load_catalog
    from runtime.planner.devices import list_devices

    free = max((d.free_bytes for d in list_devices()), default=0)
    models = load_catalog().for_memory(free, role="chat")[:limit]
    return free, [(m.name, f"{m.params_b:g}B · {m.default_quant} · needs ~{m.tier_gb:g} GB · "
                   f"{m.repo}") for m in models]


def _packaged() -> bool:
    return bool(getattr(sys, "frozen", False))  # a PyInstaller bundle (packaging/)


def fetch_default() -> Path:
    from runtime.library.default_model import default_model_path

    return default_model_path()


class FirstRunPage(QtWidgets.QWidget):
    """Signals:
        use_model(Path): load this model and go to the chat.
        browse_models(): show the Models page.
        skip(): go to the chat without a model.
    """

    use_model = Signal(object)
    browse_models = Signal()
    skip = Signal()

    def __init__(self, runner: BackgroundRunner, default_path: Path,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._runner = runner
        self._default_path = default_path
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
        self.status = muted_label()
        outer.addWidget(self.status)

        self.recommended_title = QtWidgets.QLabel("Recommended for this machine")
        self.recommended_title.setObjectName("panelTitle")
        outer.addWidget(self.recommended_title)
        self.recommended = muted_label("Checking free memory…")
        self.recommended.setTextFormat(Qt.TextFormat.RichText)
        outer.addWidget(self.recommended)
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
        job = self._runner.submit(fetch_default)
        job.done.connect(self._on_fetched)
        job.failed.connect(self._on_fetch_failed)

    def _on_fetched(self, path: Path) -> None:
        self.default_button.setEnabled(True)
        self._default_path = path
        self._update_default_button()
        self.status.setText(f"Saved to {path}")
        self.use_model.emit(path)

    def _on_fetch_failed(self, exc: object) -> None:
        self.default_button.setEnabled(True)
        message = str(exc) if isinstance(exc, OutriderError) else f"Download failed: {exc}"
        self.status.setText(message)

    def _on_recommendations(self, result: tuple[int, list[tuple[str, str]]]) -> None:
        free, models = result
        self.recommended_title.setText(
            f"Recommended for this machine ({fmt_bytes(free)} free)")
        if not models:
            self.recommended.setText("No catalogue model fits the free memory right now.")
            return
        items = "".join(f"<li><b>{name}</b><br><span>{detail}</span></li>" for name, detail in models)
        self.recommended.setText(f"<ul style='margin-left:-20px'>{items}</ul>")
