"""The transcript: one card per message on the visible path, Markdown bodies, reply footers.

Thin view over `ChatController`: it rebuilds on `transcript_changed` (reusing the cards of
messages still shown) and redraws a streaming reply through a `Throttle`, so tokens are
coalesced into at most ~25 repaints a second. A card's text is cut into segments of about
1,500 characters at paragraph breaks (`segment_bounds`), each its own rich-text body, so a
repaint re-renders and re-lays out only the growing last segment: the cost of a flush does not
grow with the length of the reply. Only the newest `PAGE` messages get cards at first; "Show
earlier messages" adds more, so long transcripts open fast.

A reply with thinking gets a `ThinkingBlock` above its answer: folded, titled "Thinking…"
while the model thinks and "Thought for 4.2 s" after; a click unfolds the text, which then
grows by appending only what is new. A reply that is JSON as a whole shows as a pretty-printed
`json` code block (`markdown.json_block`).

A user message's attachments show above its text: images as thumbnails (a click opens the
larger view), documents as their name and size. A reply whose question came with a document
too long for the context shows the passages it was given ("Used passages: a.pdf p.3, p.7"),
folded; a click unfolds them.
"""

from __future__ import annotations

import itertools

from app.chat.attachment_views import AttachmentStrip, ImageViewer, PassagesLine, pixmap_of
from app.chat.attachments import Attachment
from app.chat.conversation import Message, MessageTree
from app.chat.export import thought_for
from app.chat.footer import footer_text
from app.chat.markdown import MarkdownRenderer, json_block, segment_bounds
from app.chat.media_files import MediaFiles
from app.chat.thinking import Body, ThinkingBlock
from app.qt import Qt, QtCore, QtGui, QtWidgets, Signal
from app.theme import Palette
from app.throttle import Throttle

PAGE = 40
REPAINT_INTERVAL_MS = 40
READING_WIDTH = 760  # px: the widest a bubble gets (~90 characters a line at 10 pt)
SIDE_MARGIN = 24
_WAITING = {"waiting": "Starting the engine…", "streaming": "Writing…"}
STOPPED_EARLY = "Stopped before the first token"


class _Segment:
    """One separately rendered piece of a message: its body and what it last showed."""

    def __init__(self, body: Body) -> None:
        self.body = body
        self.key: tuple[object, ...] | None = None
        self.code_blocks: list[str] = []


def _spans_within(spans: list[list[int]], start: int, end: int) -> list[list[int]]:
    """The parts of `spans` inside [start, end), shifted to start at 0."""
    return [[max(s, start) - start, min(e, end) - start] for s, e in spans if s < end and e > start]


class MessageCard(QtWidgets.QFrame):
    """One message: role, branch switcher, actions, body, error banner, footer.

    Signals:
        action(str, int): "edit" / "regenerate" / "copy" with the message id.
        branch(int, int): switch the message to its previous (-1) or next (+1) sibling.
        open_log(): the user asked to see the engine log from an error banner.
    """

    action = Signal(str, int)
    branch = Signal(int, int)
    open_log = Signal()

    def __init__(self, message: Message, renderer: MarkdownRenderer,
                 parent: QtWidgets.QWidget | None = None, *,
                 media: MediaFiles | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self._renderer = renderer
        self._media = media
        self._attachments_key: object = None
        self._segments: list[_Segment] = []
        self.highlight_drafts = False
        self.setObjectName("bubble")
        self.setProperty("role", message.role)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 10)
        layout.setSpacing(4)

        header = QtWidgets.QHBoxLayout()
        header.setSpacing(4)
        self.role_label = QtWidgets.QLabel("You" if message.role == "user" else "Assistant")
        self.role_label.setObjectName("roleLabel")
        header.addWidget(self.role_label)
        self.prev_button = self._tool("‹", "Previous version", lambda: self.branch.emit(message.id, -1))
        self.branch_label = QtWidgets.QLabel()
        self.branch_label.setObjectName("muted")
        self.next_button = self._tool("›", "Next version", lambda: self.branch.emit(message.id, +1))
        for widget in (self.prev_button, self.branch_label, self.next_button):
            header.addWidget(widget)
        header.addStretch(1)
        self.copy_button = self._tool("Copy", "Copy the message text",
                                      lambda: self.action.emit("copy", message.id))
        header.addWidget(self.copy_button)
        if message.role == "user":
            self.edit_button = self._tool("Edit", "Edit and resend as a new branch",
                                          lambda: self.action.emit("edit", message.id))
            header.addWidget(self.edit_button)
        else:
            self.regenerate_button = self._tool("Regenerate", "Write another reply (kept as a branch)",
                                                lambda: self.action.emit("regenerate", message.id))
            header.addWidget(self.regenerate_button)
        layout.addLayout(header)
        self.thinking: ThinkingBlock | None = None  # made for the first thinking text
        self.attachment_strip = AttachmentStrip(removable=False)
        self.attachment_strip.image_clicked.connect(self._view_image)
        layout.addWidget(self.attachment_strip)
        self._pixmaps: list[tuple[object, str]] = []  # (pixmap, name) of each strip item

        self._bodies = QtWidgets.QVBoxLayout()
        self._bodies.setSpacing(0)
        layout.addLayout(self._bodies)

        self.error_label = QtWidgets.QLabel()
        self.error_label.setObjectName("replyError")
        self.error_label.setWordWrap(True)
        self.error_label.setTextFormat(Qt.TextFormat.RichText)
        self.error_label.linkActivated.connect(lambda _: self.open_log.emit())
        self.error_label.hide()
        layout.addWidget(self.error_label)

        self.passages = PassagesLine()
        layout.addWidget(self.passages)

        self.footer = QtWidgets.QLabel()
        self.footer.setObjectName("footer")
        self.footer.hide()
        layout.addWidget(self.footer)

    def _tool(self, text: str, tip: str, slot: object) -> QtWidgets.QToolButton:
        button = QtWidgets.QToolButton(self)
        button.setText(text)
        button.setToolTip(tip)
        button.setCursor(Qt.CursorShape.PointingHandCursor)
        button.clicked.connect(slot)
        return button

    def set_branch(self, position: int, count: int, enabled: bool) -> None:
        visible = count > 1
        for widget in (self.prev_button, self.branch_label, self.next_button):
            widget.setVisible(visible)
        self.branch_label.setText(f"{position}/{count}")
        self.prev_button.setEnabled(enabled and position > 1)
        self.next_button.setEnabled(enabled and position < count)

    def set_renderer(self, renderer: MarkdownRenderer) -> None:
        self._renderer = renderer
        for segment in self._segments:
            segment.key = None

    def refresh(self, busy: bool) -> None:
        """Redraw what changed since the last call (cheap when nothing did)."""
        m = self.message
        self._render_attachments()
        self._render_thinking()
        self._render_segments()
        show = bool(m.content) or m.status not in ("waiting", "streaming")
        for segment in self._segments:
            segment.body.setVisible(show)
        if m.status == "error" and m.error:
            self.error_label.setText(f"{_escape(m.error)} &nbsp;<a href='log'>View engine log</a>")
        self.error_label.setVisible(m.status == "error" and bool(m.error))
        footer = str(m.stats.get("note") or "") if m.status == "waiting" else ""
        footer = footer or _WAITING.get(m.status, "")
        if not footer:
            footer = footer_text(m.stats)
            if m.status == "stopped" and not m.content:  # not an empty "0 tokens" bubble
                footer = STOPPED_EARLY
            elif m.status == "stopped":
                footer = "Stopped" + (f" · {footer}" if footer else "")
        self.footer.setText(footer)
        self.footer.setVisible(bool(footer))
        if m.role == "assistant":
            self.regenerate_button.setEnabled(not busy)
        else:
            self.edit_button.setEnabled(not busy)

    def set_passages(self, attachments: list[Attachment]) -> None:
        """The documents of the question this reply answers (their passages, if any)."""
        self.passages.show_passages(attachments)

    def _render_attachments(self) -> None:
        attachments = self.message.attachments
        key = tuple((a.sha256, a.mode, len(a.passages)) for a in attachments)
        if key == self._attachments_key:
            return
        self._attachments_key = key
        items: list[tuple[QtGui.QPixmap | None, str]] = []
        for a in attachments:
            if a.kind == "image":
                pixmap = QtGui.QPixmap()
                if self._media is not None:
                    try:
                        pixmap = pixmap_of(self._media.read(a.sha256, a.mime))
                    except (OSError, ValueError):
                        pixmap = QtGui.QPixmap()
                items.append((pixmap if not pixmap.isNull() else None,
                              a.name if not pixmap.isNull() else f"{a.name} (image file missing)"))
            else:
                sent = f" · {len(a.passages)} passages sent" if a.mode == "passages" and a.passages \
                    else ""
                items.append((None, a.describe() + sent))
        self._pixmaps = [(p, name) for p, name in items]
        self.attachment_strip.set_items(items)

    def _view_image(self, index: int) -> None:
        pixmap, name = self._pixmaps[index]
        if isinstance(pixmap, QtGui.QPixmap):
            ImageViewer(pixmap, name, self).open()

    def _render_thinking(self) -> None:
        m = self.message
        if not m.reasoning and self.thinking is None:
            return
        if self.thinking is None:
            self.thinking = ThinkingBlock(self)
            layout = self.layout()
            if isinstance(layout, QtWidgets.QBoxLayout):
                layout.insertWidget(2, self.thinking)  # under the header, above the answer
        still = m.status in ("waiting", "streaming") and not m.content
        self.thinking.show_thinking(m.reasoning, ThinkingBlock.THINKING if still else thought_for(m.stats),
                                    self._renderer.palette.muted)
        self.thinking.setVisible(bool(m.reasoning))

    def _render_segments(self) -> None:
        m = self.message
        content, draft_spans = m.content, m.draft_spans
        block = json_block(content) if m.role == "assistant" else None
        if block is not None:  # structured output: the JSON, pretty, as a code block
            content, draft_spans = block, []
        bounds = segment_bounds(content)
        first_block = 0
        for i, (start, end) in enumerate(itertools.pairwise(bounds)):
            if i == len(self._segments):
                body = Body(self)
                body.link_clicked.connect(self._on_link)
                self._bodies.addWidget(body)
                self._segments.append(_Segment(body))
            segment = self._segments[i]
            text = content[start:end]
            spans = _spans_within(draft_spans, start, end) if self.highlight_drafts else None
            key = (text, str(spans), id(self._renderer), first_block)
            if key != segment.key:
                rendered = self._renderer.render(text, spans, first_block)
                segment.body.setHtml(rendered.html)
                segment.code_blocks = rendered.code_blocks
                segment.key = key
            first_block += len(segment.code_blocks)
        for segment in self._segments[len(bounds) - 1:]:
            self._bodies.removeWidget(segment.body)
            segment.body.deleteLater()
        del self._segments[len(bounds) - 1:]

    def code_blocks(self) -> list[str]:
        return [block for segment in self._segments for block in segment.code_blocks]

    def code_block(self, index: int) -> str:
        return self.code_blocks()[index]

    def plain_text(self) -> str:
        """The text as shown (segments joined at their paragraph breaks)."""
        return "\n".join(s.body.toPlainText() for s in self._segments)

    def html(self) -> str:
        return "".join(s.body.toHtml() for s in self._segments)

    def _on_link(self, url: str) -> None:
        if url.startswith("copy:"):
            index = int(url.split(":", 1)[1])
            blocks = self.code_blocks()
            if 0 <= index < len(blocks):
                QtGui.QGuiApplication.clipboard().setText(blocks[index])
        elif url.startswith(("http://", "https://")):
            QtGui.QDesktopServices.openUrl(QtCore.QUrl(url))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class TranscriptView(QtWidgets.QScrollArea):
    """The scrolling list of message cards for one conversation path.

    Signals:
        edit_requested(int), regenerate_requested(int): a card's action buttons.
        branch_requested(int, int): switch a message to a sibling (-1 / +1).
        open_log_requested(): show the engine log (from an error banner).

    Attributes:
        more_button: "Show earlier messages"; visible only while older messages of the path
            have no card yet (a path longer than `PAGE`), never for a new or short chat.
    """

    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    branch_requested = Signal(int, int)
    open_log_requested = Signal()

    def __init__(self, palette: Palette, parent: QtWidgets.QWidget | None = None, *,
                 media: MediaFiles | None = None) -> None:
        """`media`: where the images of messages are read from (None: none are shown)."""
        super().__init__(parent)
        self.setObjectName("transcript")
        self._media = media
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._renderer = MarkdownRenderer(palette)
        self._cards: dict[int, MessageCard] = {}
        self._path: list[Message] = []
        self._tree = MessageTree()
        self._shown_from = 0
        self._busy = False
        self._dirty: set[int] = set()
        self._follow = True
        self.highlight_drafts = False
        inner = QtWidgets.QWidget()
        inner.setObjectName("transcriptInner")
        self._layout = QtWidgets.QVBoxLayout(inner)
        self._layout.setContentsMargins(SIDE_MARGIN, 16, SIDE_MARGIN, 16)
        self._layout.setSpacing(12)
        self.more_button = QtWidgets.QPushButton("Show earlier messages")
        self.more_button.clicked.connect(self._show_more)
        self.more_button.hide()  # nothing is hidden until a path longer than PAGE arrives
        self._layout.addWidget(self.more_button, 0, Qt.AlignmentFlag.AlignHCenter)
        self._empty = QtWidgets.QLabel(
            "<div style='font-size:15pt; font-weight:600;'>Start a conversation</div>"
            "<p>Type below and press Enter. Shift+Enter adds a line;"
            " Esc stops a reply; Ctrl+N starts a new chat.</p>")
        self._empty.setObjectName("muted")
        self._empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._empty.setWordWrap(True)
        self._layout.addWidget(self._empty, 1)
        self._layout.addStretch(0)
        self.setWidget(inner)
        self._throttle = Throttle(self._flush, REPAINT_INTERVAL_MS, self)
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)
        self.verticalScrollBar().rangeChanged.connect(self._on_range_changed)

    # -- content -----------------------------------------------------------------------

    def resizeEvent(self, event: QtGui.QResizeEvent) -> None:
        """Cap the bubbles at `READING_WIDTH`, centred: at 1920 px a reply's lines ran to
        ~1150 px, too long to read. Margins rather than a maximum width on each card, so a
        short message's bubble is as wide as a long one's."""
        super().resizeEvent(event)
        side = max(SIDE_MARGIN, (self.viewport().width() - READING_WIDTH + 1) // 2)
        margins = self._layout.contentsMargins()
        if margins.left() != side:
            self._layout.setContentsMargins(side, margins.top(), side, margins.bottom())

    def set_path(self, path: list[Message], tree: MessageTree, busy: bool) -> None:
        self._throttle.cancel()
        self._dirty.clear()
        self._tree, self._busy = tree, busy
        continues = bool(self._path) and \
            [m.id for m in path[:len(self._path)]] == [m.id for m in self._path]
        if not continues:  # another conversation or branch (an empty path continues nothing)
            self._shown_from = max(0, len(path) - PAGE)
        self._path = path
        shown = path[self._shown_from:]
        keep = {m.id for m in shown}
        for message_id in [i for i in self._cards if i not in keep]:
            stale = self._cards.pop(message_id)
            self._layout.removeWidget(stale)
            stale.deleteLater()
        for position, message in enumerate(shown):
            card = self._cards.get(message.id)
            if card is None:
                card = self._make_card(message)
            self._layout.insertWidget(1 + position, card)
            self._update_card(card)
        self.more_button.setVisible(self._shown_from > 0)
        self._empty.setVisible(not path)
        self._follow = True

    def message_changed(self, message_id: int) -> None:
        if message_id in self._cards:
            self._dirty.add(message_id)
            self._throttle()

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self._throttle.flush()
        for card in self._cards.values():
            self._update_card(card)

    def set_palette(self, palette: Palette) -> None:
        self._renderer = MarkdownRenderer(palette)
        for card in self._cards.values():
            card.set_renderer(self._renderer)
            self._update_card(card)

    def set_highlight_drafts(self, on: bool) -> None:
        self.highlight_drafts = on
        for card in self._cards.values():
            self._update_card(card)

    def card(self, message_id: int) -> MessageCard | None:
        return self._cards.get(message_id)

    def cards(self) -> list[MessageCard]:
        return [self._cards[m.id] for m in self._path[self._shown_from:] if m.id in self._cards]

    def flush(self) -> None:
        """Draw pending streamed text now (tests, screenshots)."""
        self._throttle.flush()

    # -- internals ---------------------------------------------------------------------

    def _make_card(self, message: Message) -> MessageCard:
        card = MessageCard(message, self._renderer, media=self._media)
        card.action.connect(self._on_card_action)
        card.branch.connect(self.branch_requested)
        card.open_log.connect(self.open_log_requested)
        self._cards[message.id] = card
        return card

    def _update_card(self, card: MessageCard) -> None:
        card.highlight_drafts = self.highlight_drafts
        position, count = self._tree.branch_position(card.message.id) \
            if card.message.id in self._tree else (1, 1)
        card.set_branch(position, count, not self._busy)
        parent_id = card.message.parent_id
        if card.message.role == "assistant" and parent_id is not None and parent_id in self._tree:
            card.set_passages(self._tree.get(parent_id).attachments)
        card.refresh(self._busy)

    def _flush(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for message_id in dirty:
            card = self._cards.get(message_id)
            if card is not None:
                self._update_card(card)

    def _on_card_action(self, action: str, message_id: int) -> None:
        if action == "edit":
            self.edit_requested.emit(message_id)
        elif action == "regenerate":
            self.regenerate_requested.emit(message_id)
        elif action == "copy" and message_id in self._cards:
            QtGui.QGuiApplication.clipboard().setText(self._cards[message_id].message.content)

    def _show_more(self) -> None:
        self._shown_from = max(0, self._shown_from - PAGE)
        self.set_path(self._path, self._tree, self._busy)
        self._follow = False

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 24

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow:  # keep the newest text in view while it streams
            self.verticalScrollBar().setValue(maximum)
