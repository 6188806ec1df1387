"""One repository: its quants with a fit badge each, the recommended one marked, Download per row.

The listing comes from `runtime.hub.quants.list_quants` on the network thread: each file's header
read remotely (quant type, parameters, bits per weight), judged by the memory planner with
the fit defaults from the settings (context, K and V cache types) against the memory free now.
A gated repository without a token asks for one first (`ask_token`, injectable); the token is
kept in the user settings.

A vision model's repository shows each quant's projector in the Vision column ("vision:
projector F16, 812 MiB"), counted in the fit; Download fetches it with the model (the same
queue), and a model already in the library without it offers "Get projector".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.fit_badge import BADGE_ROLE, badge_text, badge_tooltip
from app.models.hub_notice import HubNotice
from app.qt import Qt, QtGui, QtWidgets, Signal
from app.services.models import ModelServices
from app.services.outcome import on_result
from app.token_dialog import TokenPrompt, ask_token
from app.widgets import cell, read_only_table
from runtime.downloads.manager import DownloadJob
from runtime.hub.client import Hub, RepoDetails
from runtime.hub.quants import QuantEntry, QuantListing, list_quants
from runtime.settings.load import LoadSettings
from runtime.settings.user import AppSettings
from runtime.units import fmt_bytes, fmt_count

COLUMNS = ("Quant", "Bits/weight", "Size", "Fit", "File", "Vision", "")
VISION, BUTTON = 5, 6  # the Vision column shows only for a repository with projectors
_COLORS = {"ok": "#1a7f37", "warn": "#9a6700", "accent": "#3b6fd8", "error_text": "#cf222e"}


@dataclass(frozen=True)
class NeedsToken:
    """The repository is gated and no token is set: nothing more can be read."""

    details: RepoDetails


def fetch_listing(hub: Hub, repo_id: str, settings: AppSettings, devices: list[Any],
                  cache_dir: Path) -> QuantListing | NeedsToken:
    """The quant listing (on the network thread), or NeedsToken for a gated repository."""
    details = hub.repo_details(repo_id)
    if details.gated and not hub.has_token:
        return NeedsToken(details)
    fit = settings.fit
    load = LoadSettings(model_path=Path("model.gguf"), n_ctx=fit.n_ctx, type_k=fit.type_k,
                        type_v=fit.type_v)
    return list_quants(hub, repo_id, settings=load, devices=devices,
                       preferred=settings.hub.preferred_quant, cache_dir=cache_dir,
                       details=details)


class RepoPage(QtWidgets.QWidget):
    """Signals:
        download_started(object): list[DownloadJob] queued for one quant.
        back_requested(): the user wants the search results again.
        settings_requested(): the user wants Settings → App (the Hub mirror), after the
            repository could not be read for want of a connection.

    Attributes:
        listing: the QuantListing shown (None while loading or when gated).
    """

    download_started = Signal(object)
    back_requested = Signal()
    settings_requested = Signal()

    def __init__(self, services: ModelServices, *, ask_token: TokenPrompt = ask_token,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self.ask_token = ask_token
        self.repo_id: str | None = None
        self.listing: QuantListing | None = None
        self._generation = 0
        self._queued: set[str] = set()

        back = QtWidgets.QToolButton()
        back.setText("← Search")
        back.clicked.connect(self.back_requested)
        self.title = QtWidgets.QLabel()
        self.title.setObjectName("pageTitle")
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        head = QtWidgets.QHBoxLayout()
        head.addWidget(back)
        head.addWidget(self.title, 1)
        self.facts = QtWidgets.QLabel()
        self.facts.setObjectName("muted")
        self.facts.setWordWrap(True)
        self.status = QtWidgets.QLabel()
        self.status.setWordWrap(True)
        self.token_button = QtWidgets.QPushButton("Enter a token…")
        self.token_button.clicked.connect(self._on_token_clicked)
        self.token_button.hide()
        status_row = QtWidgets.QHBoxLayout()
        status_row.addWidget(self.status, 1)
        status_row.addWidget(self.token_button)
        self.notice = HubNotice()
        self.notice.retry_clicked.connect(self._on_retry)
        self.notice.settings_requested.connect(self.settings_requested)

        self.table = read_only_table(COLUMNS, stretch=4)  # File

        layout = QtWidgets.QVBoxLayout(self)
        layout.addLayout(head)
        layout.addWidget(self.facts)
        layout.addLayout(status_row)
        layout.addWidget(self.notice)
        layout.addWidget(self.table, 1)
        services.library_changed.connect(self._on_library)

    # -- opening -------------------------------------------------------------------------

    def open_repo(self, repo_id: str) -> None:
        """Show `repo_id` (its listing is fetched in the background)."""
        self.repo_id = repo_id
        self.listing = None
        self._generation += 1
        generation = self._generation
        self.title.setText(repo_id)
        self.facts.setText("")
        self.token_button.hide()
        self.notice.hide()
        self.table.setRowCount(0)
        self.status.setText("Reading the repository and each quant's header…")
        services, settings = self.services, self.services.settings.settings
        hub = services.hub
        job = services.on_net(lambda: fetch_listing(hub, repo_id, settings, services.devices(),
                                                    services.dirs.cache))
        on_result(job, self, lambda result: self._on_listing(generation, result),
                  lambda exc: self._on_failed(generation, exc))

    def _on_failed(self, generation: int, exc: object) -> None:
        if generation == self._generation:
            self.status.setText("")
            self.notice.show_error(exc, f"Listing {self.repo_id}")
            if getattr(exc, "needs_token", False):
                self.token_button.show()

    def _on_listing(self, generation: int, result: QuantListing | NeedsToken) -> None:
        if generation != self._generation:
            return
        if isinstance(result, NeedsToken):
            self._show_facts(result.details)
            self.status.setText(f"{result.details.repo_id} is gated: its files need a Hugging "
                                "Face token of an account that accepted its terms.")
            self.token_button.show()
            self._ask_for_token()
            return
        self.listing = result
        self._show_facts(result.repo)
        self._fill(result)

    def _ask_for_token(self) -> None:
        if self.repo_id is None:
            return
        token = self.ask_token(self, self.repo_id)
        if token:
            self.services.settings.set_token(token)  # the services switch the Hub at once
            self.open_repo(self.repo_id)

    def _on_retry(self) -> None:
        if self.repo_id is not None:
            self.open_repo(self.repo_id)

    def _on_token_clicked(self) -> None:
        self._ask_for_token()

    # -- the table -----------------------------------------------------------------------

    def _show_facts(self, details: RepoDetails) -> None:
        access = "gated (token set)" if details.gated and self.services.hub.has_token else (
            "gated: needs a token" if details.gated else "open")
        when = details.last_modified.strftime("%Y-%m-%d") if details.last_modified else "?"
        self.facts.setText(f"License: {details.license or 'not stated'} · Access: {access} · "
                           f"{details.downloads:,} downloads · {details.likes:,} likes · "
                           f"updated {when}")

    def _fill(self, listing: QuantListing) -> None:
        fit = self.services.settings.settings.fit
        entries = [e for e in listing.entries if e.is_chat_model]
        self.table.setRowCount(len(entries))
        for row, entry in enumerate(entries):
            recommended = listing.recommended is not None and entry.name == listing.recommended.name
            quant = QtWidgets.QTableWidgetItem(("★ " if recommended else "") + entry.quant)
            if recommended:
                font = quant.font()
                font.setBold(True)
                quant.setFont(font)
                quant.setToolTip(f"Recommended: {listing.recommended_reason}")
            elif entry.quant_source == "name":
                quant.setToolTip("From the file name: the header could not be read")
            self.table.setItem(row, 0, quant)
            bpw = f"{entry.bits_per_weight:.2f}" if entry.bits_per_weight else "?"
            self.table.setItem(row, 1, QtWidgets.QTableWidgetItem(bpw))
            self.table.setItem(row, 2, QtWidgets.QTableWidgetItem(fmt_bytes(entry.size)))
            plan = dict(entry.fit or {})
            if plan:
                plan["kv_types"] = f"K {fit.type_k} / V {fit.type_v}"
            badge = QtWidgets.QTableWidgetItem(badge_text(entry.fit))
            badge.setToolTip(badge_tooltip(plan or None, entry.error))
            role = BADGE_ROLE.get(str(entry.verdict), "")
            if role:
                badge.setForeground(QtGui.QBrush(QtGui.QColor(_COLORS[role])))
            self.table.setItem(row, 3, badge)
            name = entry.name + (f" ({len(entry.files)} parts)" if len(entry.files) > 1 else "")
            file_item = QtWidgets.QTableWidgetItem(name)
            tip = f"{fmt_count(entry.n_params)} parameters · {entry.architecture or '?'}"
            file_item.setToolTip(tip + (f"\n{entry.error}" if entry.error else ""))
            self.table.setItem(row, 4, file_item)
            vision = QtWidgets.QTableWidgetItem(entry.projector.label if entry.projector else "")
            if entry.projector is not None:
                vision.setToolTip(_projector_tip(entry))
            self.table.setItem(row, VISION, vision)
            self.table.setCellWidget(row, BUTTON, self._download_button(entry))
        self.table.setColumnHidden(VISION, listing.projector is None)
        self.table.resizeColumnsToContents()
        reason = listing.recommended_reason
        pick = (f"Recommended: {listing.recommended.quant} — {reason}."
                if listing.recommended else reason)
        brings = ""
        if listing.projector is not None:
            brings = (f" A vision model: each download brings its projector "
                      f"({listing.projector.name}), counted in the fit.")
        self.status.setText(f"{len(entries)} quants. {pick} Fit assumes a {fit.n_ctx:,}-token "
                            f"context with K {fit.type_k} / V {fit.type_v} (Settings).{brings}")

    def _download_button(self, entry: QuantEntry) -> QtWidgets.QPushButton:
        button = QtWidgets.QPushButton("Download")
        button.setObjectName(f"download:{entry.name}")
        state = self._local_state(entry)
        if state == "Get projector":  # the model is in, its projector is not
            button.setText(state)
            button.setToolTip(f"Download {entry.projector.name if entry.projector else ''}, "
                              "so the model reads images")
        elif state:
            button.setText(state)
            button.setEnabled(False)
        elif not entry.complete:
            button.setEnabled(False)
            button.setToolTip(entry.error or "parts are missing")
        button.clicked.connect(lambda: self.download(entry))
        return button

    def _local_state(self, entry: QuantEntry) -> str | None:
        names = {f.name for f in entry.files}
        for model in self.services.models:
            if model.repo_id == entry.repo_id and model.path.name in names:
                if entry.projector is None or model.projector is not None:
                    return "In library"
                return "Queued" if entry.projector.name in self._queued else "Get projector"
        return "Queued" if names & self._queued else None

    def _on_library(self, _models: object) -> None:
        if self.listing is not None:
            self._fill(self.listing)

    # -- downloading ---------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        """What the table shows, row by row (quant, fit badge, tooltip, button text)."""
        out = []
        for r in range(self.table.rowCount()):
            button = self.table.cellWidget(r, BUTTON)
            text = button.text() if isinstance(button, QtWidgets.QPushButton) else ""
            out.append({"quant": cell(self.table, r, 0).text(), "fit": cell(self.table, r, 3).text(),
                        "tooltip": cell(self.table, r, 3).toolTip(),
                        "file": cell(self.table, r, 4).text(),
                        "vision": cell(self.table, r, VISION).text(), "button": text})
        return out

    def button_for(self, name: str) -> QtWidgets.QPushButton:
        button = self.findChild(QtWidgets.QPushButton, f"download:{name}")
        if button is None:
            raise KeyError(name)
        return button

    def download(self, entry: QuantEntry) -> None:
        """Queue every file of `entry` not in the library yet (the parts of a split model
        together, a vision model's projector with them)."""
        details = self.listing.repo if self.listing else None
        if details is not None and details.gated and not self.services.hub.has_token:
            self._ask_for_token()
            return
        manager = self.services.downloads
        group = f"{entry.repo_id}:{entry.quant}"
        folder = manager.models_dir / entry.repo_id

        def enqueue() -> list[DownloadJob]:
            return [manager.enqueue(entry.repo_id, f.name, size=f.size, sha256=f.sha256,
                                    group=group) for f in entry.missing_in(folder)]

        self._queued |= {f.name for f in entry.download_files}
        # Change the button in place: rebuilding the row here would delete the very button
        # whose clicked signal is running.
        button = self.findChild(QtWidgets.QPushButton, f"download:{entry.name}")
        if button is not None:
            button.setText("Queued")
            button.setEnabled(False)
        job = self.services.on_disk(enqueue)
        on_result(job, self, self.download_started.emit,
                  lambda exc: self.status.setText(f"Could not queue {entry.name}: {exc}"))


def _projector_tip(entry: QuantEntry) -> str:
    """The projector's file and what it costs: counted in the fit, tokens per image."""
    p = entry.projector
    if p is None:
        return ""
    lines = [f"{p.name}: downloaded with the model"]
    if p.n_available > 1:
        lines.append(f"(the F16 or the smallest of the {p.n_available} projectors here)")
    if p.info is not None:
        about = "" if p.info.image_tokens_exact else "about "
        lines.append(f"Counted in the fit: weights and compute buffer; each image takes "
                     f"{about}{p.info.image_tokens:,} tokens of the context")
    else:
        lines.append(f"Not counted in the fit: {p.error or 'its header was not read'}")
    return "\n".join(lines)


__all__ = ["NeedsToken", "RepoPage", "fetch_listing"]
