"""The app's own settings: models folder, Hugging Face token, Hub endpoint, preferred quant,
parallel downloads, the local server, the disk kept for saved conversations' KV caches,
theme, and what the fit verdicts assume.

Each change is validated at once (`runtime.settings.user`); a refused value is explained in
one line and the saved settings stay as they were. Secrets are never put back into a widget:
the token field is empty and says whether a token is saved (`hf_…abcd`). The API key is the
exception the user asks for: Show puts the saved key in its field in clear text, and a
generated key is shown at once — the user has to copy it into a client — until Hide.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.qt import QtWidgets
from app.services.settings import SettingsController
from runtime.errors import SettingsError
from runtime.settings.load import KV_CACHE_TYPES
from runtime.settings.user import (
    MAX_PARALLEL_DOWNLOADS,
    MAX_SAVED_KV_GIB,
    QUANT_LEVELS,
    THEMES,
    AppSettings,
    FitDefaults,
    HubSettings,
    Secret,
    ServerSettings,
)

ChooseFolder = Callable[[QtWidgets.QWidget, str], "Path | None"]


def choose_folder(parent: QtWidgets.QWidget, start: str) -> Path | None:
    name = QtWidgets.QFileDialog.getExistingDirectory(parent, "Models folder", start)
    return Path(name) if name else None


class AppSettingsPage(QtWidgets.QWidget):
    """Attributes: problem — the label that explains a refused value (or a bad settings file
    found at start-up)."""

    def __init__(self, settings: SettingsController, *, default_models_dir: Path,
                 choose_folder: ChooseFolder = choose_folder,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.default_models_dir = default_models_dir
        self.choose_folder = choose_folder
        self._filling = False

        self.problem = QtWidgets.QLabel(settings.startup_problem or "")
        self.problem.setObjectName("errorText")
        self.problem.setWordWrap(True)
        self.problem.setVisible(bool(settings.startup_problem))

        self.models_dir = QtWidgets.QLineEdit()
        self.models_dir.setPlaceholderText(str(default_models_dir))
        browse = QtWidgets.QPushButton("Choose…")
        browse.clicked.connect(self._on_browse)
        self.token = QtWidgets.QLineEdit()
        self.token.setEchoMode(QtWidgets.QLineEdit.EchoMode.Password)
        self.token_state = QtWidgets.QLabel()
        self.token_state.setObjectName("muted")
        self.remove_token = QtWidgets.QPushButton("Remove")
        self.remove_token.clicked.connect(lambda: self.settings.set_token(None))
        self.endpoint = QtWidgets.QLineEdit()
        self.endpoint.setPlaceholderText("https://huggingface.co (or HF_ENDPOINT)")
        self.preferred = QtWidgets.QComboBox()
        self.preferred.addItems(list(QUANT_LEVELS))
        self.parallel = QtWidgets.QSpinBox()
        self.parallel.setRange(1, MAX_PARALLEL_DOWNLOADS)
        self.port = QtWidgets.QSpinBox()
        self.port.setRange(1, 65535)
        self.api_key = QtWidgets.QLineEdit()
        self.api_key.setEchoMode(QtWidgets.QLineEdit.EchoMode.Password)
        self.show_key = QtWidgets.QPushButton("Show")
        self.show_key.setCheckable(True)
        self.show_key.toggled.connect(self._on_show_key)
        generate = QtWidgets.QPushButton("Generate")
        generate.clicked.connect(self._on_generate_key)
        self.allow_network = QtWidgets.QCheckBox(
            "Allow other computers to connect (listen on every network interface)")
        self.saved_kv = QtWidgets.QDoubleSpinBox()
        self.saved_kv.setObjectName("saved_kv_gib")
        self.saved_kv.setRange(0, MAX_SAVED_KV_GIB)
        self.saved_kv.setDecimals(1)
        self.saved_kv.setSingleStep(0.5)
        self.saved_kv.setSuffix(" GiB")
        self.saved_kv.setSpecialValueText("off (every chat recomputes its prompt)")
        self.saved_kv_note = QtWidgets.QLabel(
            "A finished chat's KV cache is kept on disk, so coming back to it — after "
            "switching chats or restarting — skips recomputing the prompt. The least "
            "recently used go first. Applies when the engine next starts.")
        self.saved_kv_note.setObjectName("muted")
        self.saved_kv_note.setWordWrap(True)
        self.theme = QtWidgets.QComboBox()
        self.theme.addItems(list(THEMES))
        self.fit_ctx = QtWidgets.QSpinBox()
        self.fit_ctx.setRange(16, 1 << 20)
        self.fit_ctx.setSingleStep(1024)
        self.fit_ctx.setGroupSeparatorShown(True)
        self.fit_k = QtWidgets.QComboBox()
        self.fit_v = QtWidgets.QComboBox()
        for combo in (self.fit_k, self.fit_v):
            combo.addItems(list(KV_CACHE_TYPES))

        library = QtWidgets.QFormLayout()
        library.addRow("Models folder", _row(self.models_dir, browse))
        library.addRow("Hugging Face token", _row(self.token, self.remove_token))
        library.addRow("", self.token_state)
        library.addRow("Hub endpoint (mirror)", self.endpoint)
        library.addRow("Preferred quant level", self.preferred)
        library.addRow("Parallel downloads", self.parallel)
        server = QtWidgets.QFormLayout()
        server.addRow("Port", self.port)
        server.addRow("API key", _row(self.api_key, self.show_key, generate))
        server.addRow("", self.allow_network)
        saved = QtWidgets.QFormLayout()
        saved.addRow("Disk for KV caches", self.saved_kv)
        saved.addRow(self.saved_kv_note)
        look = QtWidgets.QFormLayout()
        look.addRow("Theme", self.theme)
        fit = QtWidgets.QFormLayout()
        self.fit_note = QtWidgets.QLabel("A repository's quant table judges fit with these, "
                                         "and a model not set up yet starts from them.")
        self.fit_note.setObjectName("muted")
        self.fit_note.setWordWrap(True)
        fit.addRow(self.fit_note)
        fit.addRow("Context length", self.fit_ctx)
        fit.addRow("K cache type", self.fit_k)
        fit.addRow("V cache type", self.fit_v)
        layout = QtWidgets.QVBoxLayout(self)
        layout.addWidget(self.problem)
        for title, form in (("Models and the Hub", library), ("Local server", server),
                            ("Saved conversations", saved), ("Appearance", look),
                            ("Fit verdicts", fit)):
            box = QtWidgets.QGroupBox(title)
            box.setLayout(form)
            layout.addWidget(box)
        layout.addStretch(1)

        self.show_settings(settings.settings)
        for edit in (self.models_dir, self.endpoint):
            edit.editingFinished.connect(self.apply)
        self.token.editingFinished.connect(self._on_token_entered)
        self.api_key.editingFinished.connect(self._on_key_entered)
        for spin in (self.parallel, self.port, self.fit_ctx):
            spin.valueChanged.connect(self.apply)
        self.saved_kv.valueChanged.connect(self.apply)
        for combo in (self.preferred, self.theme, self.fit_k, self.fit_v):
            combo.currentIndexChanged.connect(self.apply)
        self.allow_network.toggled.connect(self.apply)
        settings.changed.connect(self.show_settings)
        settings.save_failed.connect(self._show_problem)

    # -- showing ---------------------------------------------------------------------------

    def show_settings(self, s: AppSettings) -> None:
        self._filling = True
        try:
            self.models_dir.setText(str(s.models_dir) if s.models_dir else "")
            self.endpoint.setText(s.hub.endpoint or "")
            self.preferred.setCurrentText(s.hub.preferred_quant)
            self.parallel.setValue(s.hub.parallel_downloads)
            self.port.setValue(s.server.port)
            self.allow_network.setChecked(s.server.allow_network)
            self.saved_kv.setValue(s.saved_kv_gib)
            self.theme.setCurrentText(s.theme)
            self.fit_ctx.setValue(s.fit.n_ctx)
            self.fit_k.setCurrentText(s.fit.type_k)
            self.fit_v.setCurrentText(s.fit.type_v)
            self.token.clear()
            self.token.setPlaceholderText(
                f"saved: {s.hf_token.masked} — paste a new one to replace" if s.hf_token
                else "paste a token (hf_…) for gated models")
            self.token_state.setText("A token is saved, readable by you alone."
                                     if s.hf_token else "No token: gated repositories will ask.")
            self.remove_token.setEnabled(s.hf_token is not None)
            key = s.server_api_key.reveal() if s.server_api_key else ""
            if not (self.show_key.isChecked() and self.api_key.text() == key):
                self.api_key.clear()  # unless it shows the saved key, at the user's wish
            self.api_key.setPlaceholderText("saved (hidden)" if s.server_api_key
                                            else "none: anyone who can connect may use it")
        finally:
            self._filling = False

    def _show_problem(self, text: str) -> None:
        self.problem.setText(text)
        self.problem.setVisible(bool(text))

    # -- changing --------------------------------------------------------------------------

    def collect(self) -> AppSettings:
        """The settings the widgets show; SettingsError if a value is refused."""
        s = self.settings.settings
        folder = self.models_dir.text().strip()
        return dataclasses.replace(
            s,
            models_dir=Path(folder).expanduser() if folder else None,
            theme=self.theme.currentText(),  # type: ignore[arg-type]
            hub=HubSettings(endpoint=self.endpoint.text().strip().rstrip("/") or None,
                            preferred_quant=self.preferred.currentText(),
                            parallel_downloads=self.parallel.value()),
            server=ServerSettings(port=self.port.value(),
                                  allow_network=self.allow_network.isChecked()),
            saved_kv_gib=self.saved_kv.value(),
            fit=FitDefaults(n_ctx=self.fit_ctx.value(), type_k=self.fit_k.currentText(),
                            type_v=self.fit_v.currentText()))

    def apply(self, *_: Any) -> None:
        if self._filling:
            return
        try:
            new = self.collect()
        except SettingsError as exc:
            self._show_problem(f"Not saved: {exc}")
            return
        self._show_problem("")
        self.settings.update(new)

    def _on_token_entered(self) -> None:
        text = self.token.text().strip()
        if text:
            self.settings.set_token(text)
        self.token.clear()

    def _on_key_entered(self) -> None:
        text = self.api_key.text().strip()
        if text:
            self._set_key(text)

    def _on_generate_key(self) -> None:
        key = "sk-outrider-" + secrets.token_urlsafe(24)
        self.show_key.setChecked(True)  # in clear text at once, until the user hides it
        self._set_key(key)
        self.api_key.setText(key)

    def _set_key(self, key: str) -> None:
        current = self.settings.settings
        self.settings.update(dataclasses.replace(current, server_api_key=Secret(key)))
        if self.show_key.isChecked():
            self.api_key.setText(key)

    def _on_show_key(self, shown: bool) -> None:
        """Show: the saved key in clear text; Hide: dots, and the field empty again."""
        self.show_key.setText("Hide" if shown else "Show")
        saved = self.settings.settings.server_api_key
        if shown:
            self.api_key.setEchoMode(QtWidgets.QLineEdit.EchoMode.Normal)
            if saved is not None and not self.api_key.text():
                self.api_key.setText(saved.reveal())
        else:
            self.api_key.setEchoMode(QtWidgets.QLineEdit.EchoMode.Password)
            if saved is not None and self.api_key.text() == saved.reveal():
                self.api_key.clear()

    def _on_browse(self) -> None:
        start = self.models_dir.text() or str(self.default_models_dir)
        chosen = self.choose_folder(self, start)
        if chosen is not None:
            self.models_dir.setText(str(chosen))
            self.apply()


def _row(*widgets: QtWidgets.QWidget) -> QtWidgets.QWidget:
    box = QtWidgets.QWidget()
    row = QtWidgets.QHBoxLayout(box)
    row.setContentsMargins(0, 0, 0, 0)
    for i, w in enumerate(widgets):
        row.addWidget(w, 1 if i == 0 else 0)
    return box
