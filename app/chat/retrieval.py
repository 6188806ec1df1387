"""Passages of documents too long for the context, picked by embeddings before a reply.

    finder = PassageFinder(store, client, documents, query="What did Q3 cost?", budget=1800)
    finder.progress.connect(show)          # "Reading report.pdf: 32 of 140 passages indexed…"
    finder.done.connect(send_with)         # the documents, each with its chosen passages
    finder.failed.connect(say_why)         # one line
    finder.start()

Each document is cut into chunks of `CHUNK_TOKENS` (estimated) with overlap, a PDF page by
page (`runtime.media.documents.document_chunks`); the chunks are embedded with the served model
(`/v1/embeddings`, `BATCH` at a time) into the chat store's vector index, keyed by the
document's sha256, the model and the chunk size, so a second question about the same
document only embeds the question. The chunks nearest the question (cosine) are taken best
first while they fit in `budget` tokens (at most `MAX_PASSAGES`), then put back in document
order, which reads better than score order.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from app.chat.attachments import Attachment, Passage, estimate_tokens
from app.chat.store import ChatStore
from app.engine.client import EngineClient
from app.engine.embeddings_call import EmbeddingsCall
from app.engine.wire import ReplyError
from app.qt import QtCore, Signal
from runtime.media.documents import Chunk, Document, document_chunks, top_chunks

CHUNK_TOKENS = 300
BATCH = 16
MAX_PASSAGES = 8


@dataclasses.dataclass
class _Source:
    attachment: Attachment
    document: Document
    chunks: list[Chunk]
    vectors: dict[int, np.ndarray]


class PassageFinder(QtCore.QObject):
    """Signals:
        progress(str): what it is doing, for the reply's footer while it waits.
        done(list[Attachment]): the documents given, with `passages` filled in.
        failed(str): one line: a document's text is gone, or the engine cannot embed.
    """

    progress = Signal(str)
    done = Signal(object)
    failed = Signal(str)

    def __init__(self, store: ChatStore, client: EngineClient, documents: list[Attachment],
                 query: str, budget: int, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._store, self._client = store, client
        self._documents, self._query, self._budget = documents, query, budget
        self._model = client.model.name if client.model is not None else ""
        self._sources: list[_Source] = []
        self._call: EmbeddingsCall | None = None
        self._pending: list[tuple[_Source, list[Chunk]]] = []
        self._cancelled = False

    def start(self) -> None:
        for attachment in self._documents:
            document = self._store.document(attachment.sha256)
            if document is None:
                self.failed.emit(f"The text of {attachment.name} is no longer in the chat store; "
                                 "attach it again")
                return
            pieces = document_chunks(document, CHUNK_TOKENS, estimate_tokens)
            vectors = self._store.passage_vectors(attachment.sha256, self._model, CHUNK_TOKENS)
            source = _Source(attachment, document, pieces, vectors)
            self._sources.append(source)
            missing = [c for c in pieces if c.index not in vectors]
            self._pending += [(source, missing[i:i + BATCH]) for i in range(0, len(missing), BATCH)]
        self._next()

    def cancel(self) -> None:
        self._cancelled = True
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    # -- steps -------------------------------------------------------------------------

    def _next(self) -> None:
        if self._cancelled:
            return
        if self._pending:
            source, batch = self._pending[0]
            total = len(source.chunks)
            self.progress.emit(f"Reading {source.attachment.name}: "
                               f"{len(source.vectors):,} of {total:,} passages indexed…")
            self._embed([c.text for c in batch], self._on_batch)
        elif self._query.strip():
            self.progress.emit("Finding the passages that answer the question…")
            self._embed([self._query], self._on_query)
        else:  # nothing asked: the documents' beginnings
            self._finish(None)

    def _embed(self, texts: list[str], slot: object) -> None:
        call = self._client.embed(texts)
        call.done.connect(slot)
        call.failed.connect(self._on_failed)
        self._call = call

    def _on_batch(self, vectors: list[list[float]]) -> None:
        self._call = None
        source, batch = self._pending.pop(0)
        if len(vectors) != len(batch):
            self.failed.emit(f"The engine returned {len(vectors)} embeddings for "
                             f"{len(batch)} passages")
            return
        new = {c.index: np.asarray(v, dtype=np.float32) for c, v in zip(batch, vectors, strict=True)}
        source.vectors.update(new)
        self._store.save_passage_vectors(source.attachment.sha256, self._model, CHUNK_TOKENS, new)
        self._next()

    def _on_query(self, vectors: list[list[float]]) -> None:
        self._call = None
        self._finish(np.asarray(vectors[0], dtype=np.float32) if vectors else None)

    def _on_failed(self, error: ReplyError) -> None:
        self._call = None
        if not self._cancelled:
            names = ", ".join(d.name for d in self._documents)
            self.failed.emit(f"{names} is too long for the context, and picking its passages "
                             f"failed: {error.message}")

    def _finish(self, query: np.ndarray | None) -> None:
        everything = [(s, c) for s in self._sources for c in s.chunks]
        if query is None:
            ranked = list(range(len(everything)))
        else:
            matrix = np.stack([s.vectors[c.index] for s, c in everything]) if everything \
                else np.zeros((0, len(query)), dtype=np.float32)
            ranked = [i for i, _ in top_chunks(query, matrix, len(everything))]
        chosen: dict[int, list[Chunk]] = {}
        used = 0
        for i in ranked[:MAX_PASSAGES * 4]:
            source, chunk = everything[i]
            cost = estimate_tokens(chunk.text)
            if used + cost > self._budget and used:
                continue
            chosen.setdefault(id(source), []).append(chunk)
            used += cost
            if sum(len(v) for v in chosen.values()) >= MAX_PASSAGES:
                break
        result = []
        for source in self._sources:
            picked = sorted(chosen.get(id(source), []), key=lambda c: c.index)
            passages = tuple(Passage(c.index, source.document.page_at(c.start), c.text)
                             for c in picked)
            result.append(dataclasses.replace(source.attachment, passages=passages))
        self.done.emit(result)
