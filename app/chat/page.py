"""The Chat page: conversation list | header (title, model picker, actions), settings drawer,
transcript, the lost-worker banner and composer. Wiring only: state and actions live in
`ChatController`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app.chat.attachments import Pending
from app.chat.composer import Composer, holds_attachment
from app.chat.controller import ChatController
from app.chat.conversation import Conversation
from app.chat.conversation_list import ConversationListModel, ConversationPane
from app.chat.export import export_conversation
from app.chat.lost_worker import LostWorkerBanner, lost_worker, without_worker
from app.chat.model_picker import ModelPicker
from app.chat.settings_panel import ConversationSettings
from app.chat.transcript import TranscriptView
from app.engine.wire import ReplyError
from app.qt import Qt, QtGui, QtWidgets, Signal
from app.services.background import BackgroundRunner
from app.services.settings import SettingsController
from app.theme import Palette
from app.widgets import ElidedLabel
from runtime.settings.user import ModelPrefs


class ChatPage(QtWidgets.QWidget):
    """Signals:
        open_log_requested(): show the engine's log (an error banner's link).
        message(str): a short notice for the status bar.
    """

    open_log_requested = Signal()
    message = Signal(str)

    def __init__(self, controller: ChatController, picker: ModelPicker, palette: Palette,
                 parent: QtWidgets.QWidget | None = None, *, runner: BackgroundRunner,
                 settings: SettingsController | None = None) -> None:
        """`runner`: where attached documents are read, off the GUI thread; `settings`:
        where the "Draft tokens" toggle is remembered (None: not at all)."""
        super().__init__(parent)
        self.controller = controller
        self._app_settings = settings
        self.picker = picker
        self.list_model = ConversationListModel(controller.store, self)
        self.pane = ConversationPane(self.list_model)
        self.transcript = TranscriptView(palette, media=controller.store.media)
        self.composer = Composer(runner)
        self.composer.check = controller.attachment_problem
        self.composer.context_budget = lambda: controller.context_budget(
            self.composer.text, self.composer.pending.ready)  # its images take their share
        self.composer.pending.count_tokens = controller.count_tokens
        self.composer.pending.tokenizer = controller.tokenizer
        self.setAcceptDrops(True)  # files dropped anywhere on the chat go to the composer
        self.settings = ConversationSettings()
        self.settings.hide()
        self.lost_worker = LostWorkerBanner()

        header = QtWidgets.QFrame()
        header.setObjectName("chatHeader")
        top = QtWidgets.QVBoxLayout(header)
        top.setContentsMargins(20, 10, 20, 10)
        top.setSpacing(8)
        row = QtWidgets.QHBoxLayout()
        self.title = ElidedLabel("New chat")
        self.title.setObjectName("pageTitle")
        self.title.setMinimumWidth(120)  # a few words of it even in a 1024 px window
        row.addWidget(self.title, 1)
        self.drafts_button = self._toggle("Draft tokens", "Tint text that came from accepted "
                                          "draft tokens (speculative decoding)")
        self.drafts_button.toggled.connect(self.transcript.set_highlight_drafts)
        if settings is not None:
            self.drafts_button.setChecked(settings.settings.highlight_drafts)
            self.drafts_button.toggled.connect(self._remember_drafts)
        self.settings_button = self._toggle("Chat settings", "System prompt, sampling and structured "
                                            "output for this conversation")
        self.settings_button.toggled.connect(self.settings.setVisible)
        self.export_button = QtWidgets.QToolButton()
        self.export_button.setText("Export ▾")
        self.export_button.setPopupMode(QtWidgets.QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QtWidgets.QMenu(self.export_button)
        menu.addAction("Markdown…", lambda: self._export_dialog("md"))
        menu.addAction("JSON…", lambda: self._export_dialog("json"))
        self.export_button.setMenu(menu)
        for button in (self.drafts_button, self.settings_button, self.export_button):
            row.addWidget(button)
        top.addLayout(row)
        top.addWidget(picker)

        right = QtWidgets.QWidget()
        column = QtWidgets.QVBoxLayout(right)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(header)
        drawer = QtWidgets.QWidget()
        drawer_layout = QtWidgets.QVBoxLayout(drawer)
        drawer_layout.setContentsMargins(20, 8, 20, 0)
        drawer_layout.addWidget(self.settings)
        column.addWidget(drawer)
        column.addWidget(self.transcript, 1)
        column.addWidget(self.lost_worker)
        column.addWidget(self.composer)

        self.splitter = QtWidgets.QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setHandleWidth(1)
        self.splitter.addWidget(self.pane)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([240, 900])
        self.pane.setMinimumWidth(180)
        layout = QtWidgets.QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.splitter)
        self._connect()
        self.list_model.reload()
        self.controller.open_latest()  # where the user left off, not a blank chat

    def _toggle(self, text: str, tip: str) -> QtWidgets.QToolButton:
        button = QtWidgets.QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setCheckable(True)
        return button

    def _connect(self) -> None:
        c = self.controller
        pane, composer, transcript = self.pane, self.composer, self.transcript
        pane.new_requested.connect(self.new_chat)
        pane.open_requested.connect(c.open)
        pane.delete_requested.connect(self._confirm_delete)
        pane.export_requested.connect(self._export_other)
        self.list_model.renamed.connect(c.rename)
        c.conversations_changed.connect(self._on_conversations_changed)
        c.conversation_opened.connect(self._on_opened)
        c.transcript_changed.connect(self._on_transcript_changed)
        c.message_changed.connect(transcript.message_changed)
        c.busy_changed.connect(composer.set_busy)
        c.send_blocked.connect(composer.set_blocked)
        # The model (can it read images? its context) or the chat changed: say it again.
        c.send_blocked.connect(lambda _reason: composer.refresh_attachments())
        composer.send_refused.connect(self._on_send_refused)
        c.busy_changed.connect(transcript.set_busy)
        composer.submitted.connect(self._send)
        composer.edit_submitted.connect(c.edit_and_resend)  # refused by the composer when blocked
        composer.stop_requested.connect(c.stop)
        transcript.edit_requested.connect(self._start_edit)
        transcript.regenerate_requested.connect(self._regenerate)
        transcript.branch_requested.connect(c.switch_branch)
        transcript.open_log_requested.connect(self.open_log_requested)
        self.settings.system_prompt_changed.connect(c.set_system_prompt)
        self.settings.sampling_changed.connect(c.set_sampling)
        self.settings.response_schema_changed.connect(c.set_response_schema)
        self.settings.problem.connect(self.message)
        self.picker.model_chosen.connect(c.set_model)
        c.worker_problem.connect(self.lost_worker.show_problem)
        self.lost_worker.reload_requested.connect(self.reload_without)
        composer.set_blocked(c.send_blocked_reason())

    # -- actions -----------------------------------------------------------------------

    def new_chat(self) -> None:
        self.controller.new_conversation()
        self.composer.input.setFocus()

    def focus_search(self) -> None:
        self.pane.search.setFocus()
        self.pane.search.selectAll()

    def stop_or_cancel(self) -> None:
        if self.controller.busy:
            self.controller.stop()
        else:
            self.composer.cancel_edit()

    def export_to(self, path: Path) -> None:
        conv = self.controller.conversation
        if conv is not None:
            export_conversation(conv, self.controller.tree, path, self.controller.store.media)
            self.message.emit(f"Exported to {path}")

    def reload_without(self, worker: str) -> None:
        """Load the model last asked for again, with the same settings less `worker`; once
        it is loaded, the worker leaves the model's saved settings too."""
        settings = self.controller.settings_without(worker)
        if settings is None:
            self.lost_worker.dismiss()
            self.message.emit(f"The model's settings no longer name {worker}.")
            return
        self.lost_worker.show_reloading(worker)
        job = self.picker.load(settings)
        path = settings.model_path
        job.loaded.connect(lambda _model: self._on_reloaded_without(path, worker))
        job.failed.connect(self._on_reload_failed)

    def _on_reloaded_without(self, path: Path, worker: str) -> None:
        self.lost_worker.dismiss()
        saved = self._app_settings
        prefs = saved.settings.model_prefs(path) if saved is not None else None
        if saved is not None and prefs is not None and worker in prefs.load.workers:
            saved.update_model(path, ModelPrefs(without_worker(prefs.load, worker),
                                                prefs.sampling))
            self.message.emit(f"Loaded without {worker}, and removed it from this model's "
                              "settings. Regenerate to answer again.")
        else:
            self.message.emit(f"Loaded without {worker}. Regenerate to answer again.")

    def _on_reload_failed(self, error: ReplyError) -> None:
        # Another worker that fails is named by the controller (worker_problem) instead;
        # any other failure is the picker's to say.
        if lost_worker(error) is None:
            self.lost_worker.dismiss()

    def set_palette(self, palette: Palette) -> None:
        self.transcript.set_palette(palette)

    def _remember_drafts(self, on: bool) -> None:
        if self._app_settings is not None:
            self._app_settings.update(dataclasses.replace(self._app_settings.settings,
                                                          highlight_drafts=on))

    def _on_send_refused(self, reason: str) -> None:
        """Enter with no model: say why, and take the user to the model picker; with an
        invalid structured output schema: to that field, in the opened settings drawer."""
        self.message.emit(reason)
        if self.controller.schema_problem():
            self.settings_button.setChecked(True)
            self.settings.response_schema.setFocus()
        else:
            self.picker.combo.setFocus()

    def _send(self, text: str, pending: list[Pending]) -> None:
        self.settings.flush()
        self.controller.send(text, pending)

    def dragEnterEvent(self, event: QtGui.QDragEnterEvent) -> None:
        if holds_attachment(event.mimeData()):
            event.acceptProposedAction()

    def dragMoveEvent(self, event: QtGui.QDragMoveEvent) -> None:
        if holds_attachment(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QtGui.QDropEvent) -> None:
        if self.composer.add_mime(event.mimeData()):
            event.acceptProposedAction()
            self.composer.input.setFocus()

    def _regenerate(self, message_id: int) -> None:
        reason = self.controller.send_blocked_reason()
        if reason and self.controller.schema_problem():  # say why, rather than do nothing
            self._on_send_refused(reason)
        else:
            self.controller.regenerate(message_id)

    def _start_edit(self, message_id: int) -> None:
        self.composer.start_edit(message_id, self.controller.tree.get(message_id).content)

    def _export_dialog(self, kind: str) -> None:
        conv = self.controller.conversation
        if conv is None:
            return
        name = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conv.title).strip()
        path, _ = QtWidgets.QFileDialog.getSaveFileName(
            self, "Export conversation", f"{name or 'chat'}.{kind}",
            "JSON (*.json)" if kind == "json" else "Markdown (*.md)")
        if path:
            self.export_to(Path(path))

    def _export_other(self, conversation_id: int) -> None:
        self.controller.open(conversation_id)
        self._export_dialog("md")

    def _confirm_delete(self, conversation_id: int) -> None:
        box = QtWidgets.QMessageBox(self)
        box.setWindowTitle("Delete chat")
        box.setText("Delete this chat and all its branches? This cannot be undone.")
        box.setStandardButtons(QtWidgets.QMessageBox.StandardButton.Yes
                               | QtWidgets.QMessageBox.StandardButton.Cancel)
        box.finished.connect(lambda result: self.controller.delete(conversation_id)
                             if result == QtWidgets.QMessageBox.StandardButton.Yes else None)
        box.open()

    # -- controller signals ------------------------------------------------------------

    def _on_conversations_changed(self) -> None:
        self.list_model.reload()
        conv = self.controller.conversation
        self.pane.select(conv.id if conv else None)
        if conv is not None:
            self.title.setText(conv.title)

    def _on_opened(self, conv: Conversation | None) -> None:
        self.title.setText(conv.title if conv else "New chat")
        self.settings.show_conversation(conv)
        self.pane.select(conv.id if conv else None)
        self.composer.cancel_edit()
        if conv is not None and conv.model:
            self.picker.select(conv.model)

    def _on_transcript_changed(self) -> None:
        c = self.controller
        self.transcript.set_path(c.path(), c.tree, c.busy)
        if self.composer.attachments:  # the context left for its documents changed
            self.composer.refresh_attachments()
