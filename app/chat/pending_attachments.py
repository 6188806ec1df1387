"""What the next message will carry, as the composer collects it: checked images, documents
being read off the GUI thread, read documents and their token counts.

    pending = PendingAttachments(runner)            # the app's BackgroundRunner
    pending.count_tokens = controller.count_tokens  # set by the page, with `tokenizer`
    pending.changed.connect(redraw)                 # list[str]: problems of the files just added
    pending.counted.connect(redraw)                 # a document's count arrived
    pending.add_files([Path("report.pdf")])         # its chip says "reading…" until it is read

An image is checked at once, on the GUI thread as before (its header; a decode only when it
must be converted, e.g. a CMYK JPEG or a WebP, of at most 50 MP). A document's text is
extracted on the runner (`read_document`: pypdf takes seconds on a large PDF), so the window
never stalls; meanwhile the list holds a `ReadingDocument`, and the read document (or the
one-line `DocumentError`) replaces it when the runner answers. A read document's tokens are
estimated (≈ characters / 4) until the served model's tokenizer counts them (`count_tokens`,
`POST /tokenize`, asynchronous); a count that cannot be had (no model ready, the call failed)
leaves the estimate, with no error. A document counted by one model is counted again when
another is served (`tokenizer` names it). Send does not wait for a count: a message sent
before its document's count arrived is decided on the estimate. Items are found by identity,
so a document removed while it is read or counted is simply not put back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.chat.attachments import (
    Pending,
    PendingDocument,
    ReadingDocument,
    is_image,
    read_document,
    read_image,
    read_image_file,
)
from app.engine.json_call import JsonCall
from app.engine.wire import ReplyError, TokenCount
from app.qt import QtCore, Signal
from app.services.background import BackgroundRunner
from app.services.outcome import on_result
from runtime.errors import ImageError, OutriderError

Item = Pending | ReadingDocument
# Failures that say nothing about the document: asked again at the next refresh (the model
# is ready again, the engine was restarted).
_TRY_AGAIN = ("NoModelLoaded", "NetworkError")


class PendingAttachments(QtCore.QObject):
    """The composer's attachments.

    Signals:
        changed(list[str]): the items changed (added, read, removed); the problems of the
            files just added or read, one line each ([] when there were none).
        counted(): a document's tokens were counted (its chip and the whole-or-passages
            decision may change).

    Attributes:
        items: in the order they were added.
        count_tokens: starts counting a text's tokens with the served model (a `JsonCall`
            whose `done` carries a `TokenCount`), or None when it cannot; set by the page.
        tokenizer: the model `count_tokens` counts with now ("" when none is ready).
    """

    changed = Signal(object)
    counted = Signal()

    def __init__(self, runner: BackgroundRunner, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._runner = runner
        self.items: list[Item] = []
        self.count_tokens: Callable[[str], JsonCall | None] = lambda _text: None
        self.tokenizer: Callable[[], str] = lambda: ""
        self._counting: list[tuple[PendingDocument, str]] = []  # on their way: document, model
        self._uncountable: set[tuple[str, str]] = set()  # (sha256, model) whose count failed

    @property
    def ready(self) -> list[Pending]:
        """What can be sent now (all but the documents still being read)."""
        return [a for a in self.items if not isinstance(a, ReadingDocument)]

    @property
    def reading(self) -> list[ReadingDocument]:
        return [a for a in self.items if isinstance(a, ReadingDocument)]

    @property
    def counting(self) -> bool:
        """A document's count is on its way."""
        return bool(self._counting)

    # -- changes -----------------------------------------------------------------------

    def add_files(self, paths: list[Path]) -> None:
        """Add each file: images checked now, documents read on the runner. The problems of
        those refused now come with `changed` at once, a document's when it has been read."""
        problems: list[str] = []
        for path in paths:
            if path.is_dir():
                problems.append(f"{path.name} is a folder: attach the files in it")
            elif is_image(path):
                try:
                    self.items.append(read_image_file(path))
                except ImageError as exc:
                    problems.append(str(exc))
            else:
                self._read(path)
        self._changed(problems)

    def add_image_data(self, data: bytes, name: str) -> None:
        try:
            self.items.append(read_image(data, name))
        except ImageError as exc:
            self._changed([str(exc)])
            return
        self._changed([])

    def remove(self, index: int) -> None:
        """Remove item `index` (a document being read is dropped when its text arrives)."""
        if 0 <= index < len(self.items):
            del self.items[index]
            self._changed([])

    def clear(self) -> None:
        self.items = []
        self._changed([])

    def take(self) -> list[Pending]:
        """What can be sent, taken out (the composer sends it)."""
        taken, self.items = self.ready, []
        self._changed([])
        return taken

    def _changed(self, problems: list[str]) -> None:
        self.count_documents()
        self.changed.emit(problems)

    # -- reading -----------------------------------------------------------------------

    def _read(self, path: Path) -> None:
        reading = ReadingDocument(path.name, path)
        self.items.append(reading)
        job = self._runner.submit(read_document, path)
        on_result(job, self, lambda document: self._on_read(reading, document),
                  lambda exc: self._on_read_failed(reading, exc))

    def _on_read(self, reading: ReadingDocument, document: PendingDocument) -> None:
        if self._replace(reading, document):  # else it was removed while being read
            self._changed([])

    def _on_read_failed(self, reading: ReadingDocument, exc: BaseException) -> None:
        if not self._replace(reading, None):
            return
        # A DocumentError says in one line what is wrong with the file; anything else is a
        # bug of the reader, said in one line too rather than lost.
        why = str(exc) if isinstance(exc, OutriderError) else \
            f"cannot read {reading.name}: {type(exc).__name__}: {exc}"
        self._changed([why.splitlines()[0] if why.strip() else f"cannot read {reading.name}"])

    def _replace(self, old: Item, new: Item | None) -> bool:
        """Put `new` where `old` is (by identity), or drop `old` (None); False: not there."""
        index = next((i for i, a in enumerate(self.items) if a is old), None)
        if index is None:
            return False
        if new is None:
            del self.items[index]
        else:
            self.items[index] = new
        return True

    # -- counting ----------------------------------------------------------------------

    def count_documents(self) -> None:
        """Ask for the tokenizer's count of each document the served model has not counted
        (once per document and model: after a failed count the estimate stays)."""
        model = self.tokenizer()
        if not model:
            return
        for doc in [a for a in self.items if isinstance(a, PendingDocument)]:
            if doc.counted_by == model or (doc.sha256, model) in self._uncountable or \
                    any(d is doc and m == model for d, m in self._counting):
                continue
            call = self.count_tokens(doc.document.text)
            if call is None:
                return
            call.setParent(self)  # a count that arrives after the composer is gone is not heard
            self._counting.append((doc, model))
            call.done.connect(lambda count, doc=doc, model=model:
                              self._on_counted(doc, model, count))
            call.failed.connect(lambda error, doc=doc, model=model:
                                self._on_count_failed(doc, model, error))

    def _on_counted(self, doc: PendingDocument, model: str, count: TokenCount) -> None:
        self._forget_count(doc, model)
        if self._replace(doc, doc.counted(count.count, model)):
            self.counted.emit()

    def _on_count_failed(self, doc: PendingDocument, model: str, error: ReplyError) -> None:
        self._forget_count(doc, model)
        if error.kind not in _TRY_AGAIN:  # the model cannot count it: do not ask again
            self._uncountable.add((doc.sha256, model))

    def _forget_count(self, doc: PendingDocument, model: str) -> None:
        self._counting = [(d, m) for d, m in self._counting if not (d is doc and m == model)]

