"""The widgets of attachments: thumbnails (click for a larger view), document chips, the
composer's strip of what will be sent, and a reply's "Used passages" line.

    strip = AttachmentStrip()                      # in the composer
    strip.set_items([(thumbnail_pixmap(data), "photo.png"), (None, "a.pdf · ≈1,204 tokens")])
    strip.removed.connect(drop_item)               # the × of item i
    viewer = ImageViewer(pixmap, "photo.png", parent); viewer.open()
"""

from __future__ import annotations

from app.chat.attachments import Attachment, used_passages
from app.qt import Qt, QtCore, QtGui, QtWidgets, Signal

THUMB_HEIGHT = 72
THUMB_MAX_WIDTH = 160
VIEW_FRACTION = 0.85  # of the screen, at most, for the larger view
PASSAGE_PREVIEW = 400  # characters of each passage shown when the line is unfolded


def pixmap_of(data: bytes) -> QtGui.QPixmap:
    """Encoded image bytes (PNG, JPEG …) as a pixmap (a null one when Qt cannot read them)."""
    image = QtGui.QImage.fromData(data)
    return QtGui.QPixmap.fromImage(image)


def thumbnail(pixmap: QtGui.QPixmap, height: int = THUMB_HEIGHT) -> QtGui.QPixmap:
    if pixmap.isNull():
        return pixmap
    scaled = pixmap.scaledToHeight(min(height, pixmap.height()),
                                   Qt.TransformationMode.SmoothTransformation)
    if scaled.width() > THUMB_MAX_WIDTH:
        scaled = pixmap.scaledToWidth(THUMB_MAX_WIDTH, Qt.TransformationMode.SmoothTransformation)
    return scaled


class Thumbnail(QtWidgets.QLabel):
    """A small picture of an image; a click asks for the larger view.

    Signals:
        clicked(): the user clicked it.
    """

    clicked = Signal()

    def __init__(self, pixmap: QtGui.QPixmap, name: str,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("thumbnail")
        self.full = pixmap
        self.name = name
        self.setPixmap(thumbnail(pixmap))
        self.setToolTip(f"{name} — click to view")
        self.setAccessibleName(f"Image {name}")
        self.setCursor(Qt.CursorShape.PointingHandCursor)

    def mouseReleaseEvent(self, event: QtGui.QMouseEvent) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit()
        super().mouseReleaseEvent(event)


class ImageViewer(QtWidgets.QDialog):
    """An image at up to `VIEW_FRACTION` of the screen; Esc or a click closes it."""

    def __init__(self, pixmap: QtGui.QPixmap, name: str,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(name)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.image = QtWidgets.QLabel()
        self.image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        screen = self.screen().availableGeometry() if self.screen() else QtCore.QRect(0, 0, 1280, 800)
        limit = QtCore.QSize(int(screen.width() * VIEW_FRACTION),
                             int(screen.height() * VIEW_FRACTION))
        shown = pixmap
        if pixmap.width() > limit.width() or pixmap.height() > limit.height():
            shown = pixmap.scaled(limit, Qt.AspectRatioMode.KeepAspectRatio,
                                  Qt.TransformationMode.SmoothTransformation)
        self.image.setPixmap(shown)
        layout.addWidget(self.image)

    def mouseReleaseEvent(self, event: QtGui.QMouseEvent) -> None:
        self.close()


class _Item(QtWidgets.QFrame):
    def __init__(self, pixmap: QtGui.QPixmap | None, text: str, removable: bool,
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentChip")
        row = QtWidgets.QHBoxLayout(self)
        row.setContentsMargins(4, 3, 2, 3)
        row.setSpacing(4)
        self.thumb: Thumbnail | None = None
        if pixmap is not None:
            self.thumb = Thumbnail(pixmap, text)
            row.addWidget(self.thumb)
        else:
            self.label = QtWidgets.QLabel(text)
            self.label.setObjectName("muted")
            row.addWidget(self.label)
        self.remove_button = QtWidgets.QToolButton()
        self.remove_button.setText("×")
        self.remove_button.setToolTip(f"Remove {text.split(' · ')[0]}")
        self.remove_button.setVisible(removable)
        row.addWidget(self.remove_button, 0, Qt.AlignmentFlag.AlignTop if pixmap is not None
                      else Qt.AlignmentFlag.AlignVCenter)


class AttachmentStrip(QtWidgets.QWidget):
    """A row of attachments: thumbnails for images, a line of text for documents; each
    removable (the composer) or not (a sent message), images clickable.

    Signals:
        removed(int): the × of item `int` was clicked.
        image_clicked(int): the thumbnail of item `int` was clicked.
    """

    removed = Signal(int)
    image_clicked = Signal(int)

    def __init__(self, removable: bool = True, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._removable = removable
        self._row = QtWidgets.QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 0)
        self._row.setSpacing(6)
        self._row.addStretch(1)
        self.items: list[_Item] = []
        self.hide()

    def set_items(self, items: list[tuple[QtGui.QPixmap | None, str]]) -> None:
        for old in self.items:
            self._row.removeWidget(old)
            old.deleteLater()
        self.items = []
        for i, (pixmap, text) in enumerate(items):
            item = _Item(pixmap, text, self._removable, self)
            item.remove_button.clicked.connect(lambda _=False, i=i: self.removed.emit(i))
            if item.thumb is not None:
                item.thumb.clicked.connect(lambda i=i: self.image_clicked.emit(i))
            self._row.insertWidget(i, item)
            self.items.append(item)
        self.setVisible(bool(items))

    def thumbnails(self) -> list[Thumbnail]:
        return [item.thumb for item in self.items if item.thumb is not None]


class PassagesLine(QtWidgets.QWidget):
    """A reply's "Used passages: a.pdf p.3, p.7 ▸" line; a click unfolds the passages."""

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        column = QtWidgets.QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        self.button = QtWidgets.QToolButton()
        self.button.setObjectName("passagesButton")
        self.button.setCheckable(True)
        self.button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.button.setToolTip("The passages of the attached documents this reply was given")
        self.button.toggled.connect(self._on_toggled)
        column.addWidget(self.button, 0, Qt.AlignmentFlag.AlignLeft)
        self.text = QtWidgets.QLabel()
        self.text.setObjectName("muted")
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text.hide()
        column.addWidget(self.text)
        self.summary = ""
        self.hide()

    def show_passages(self, attachments: list[Attachment]) -> None:
        summary = used_passages(attachments)
        if summary == self.summary:
            return
        self.summary = summary
        self.button.setText(f"{summary} {'▾' if self.button.isChecked() else '▸'}")
        blocks = []
        for a in attachments:
            for p in a.passages:
                excerpt = " ".join(p.text.split())
                if len(excerpt) > PASSAGE_PREVIEW:
                    excerpt = excerpt[:PASSAGE_PREVIEW - 1] + "…"
                blocks.append(f"{a.name} {p.label}: {excerpt}")
        self.text.setText("\n\n".join(blocks))
        self.setVisible(bool(summary))

    def _on_toggled(self, on: bool) -> None:
        self.text.setVisible(on)
        self.button.setText(f"{self.summary} {'▾' if on else '▸'}")
