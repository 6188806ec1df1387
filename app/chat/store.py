"""Conversations on disk: one SQLite database in WAL mode at `user_dirs().chats_db`.

Why it never stalls the GUI thread: in WAL mode with `synchronous=NORMAL` a commit is an
append to the WAL file without fsync (tens of microseconds); the fsyncs happen in checkpoints,
which this module turns off on the GUI connection and runs from a background thread instead.
An app or engine crash still loses nothing committed (the OS has the pages); a streaming reply
is committed at least once a second by the chat controller.

Lazy by design: the conversation list is read in pages (`list_conversations(offset, limit)`)
and a conversation's messages only when it is opened.

The schema is versioned with `PRAGMA user_version`; `MIGRATIONS[n]` takes version n to n+1.

    store = ChatStore(path)
    conv = store.create_conversation("Hello")
    msg = store.add_message(conv.id, None, "user", "Hi")
    store.close()
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.chat.attachments import Attachment
from app.chat.conversation import (
    DEFAULT_SAMPLING,
    Conversation,
    Message,
    Role,
    Status,
    sampling_from_dict,
)
from app.chat.media_files import MediaFiles
from runtime.errors import OutriderError
from runtime.events import SamplingParams
from runtime.media.documents import Document

CHECKPOINT_INTERVAL_S = 5.0

MIGRATIONS: list[str] = [
    # 0 → 1
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        title TEXT NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL DEFAULT '',
        sampling TEXT NOT NULL DEFAULT '{}',
        current_leaf INTEGER
    );
    CREATE INDEX conversations_updated ON conversations(updated DESC);
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL DEFAULT '',
        created REAL NOT NULL,
        status TEXT NOT NULL DEFAULT 'done',
        error TEXT,
        stats TEXT NOT NULL DEFAULT '{}',
        draft_spans TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX messages_conversation ON messages(conversation_id, id);
    """,
    # 1 → 2: a reply's thinking (reasoning_content) beside its answer; a chat's structured
    # output schema beside its other settings. Old rows read as "" (no thinking, no schema).
    """
    ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
    ALTER TABLE conversations ADD COLUMN response_schema TEXT NOT NULL DEFAULT '';
    """,
    # 2 → 3: a message's attachments (JSON, app.chat.attachments); the text of attached
    # documents by sha256; the vector index of their passages, per embedding model and
    # chunk size. Old messages read as having none.
    """
    ALTER TABLE messages ADD COLUMN attachments TEXT NOT NULL DEFAULT '[]';
    CREATE TABLE documents (
        sha256 TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        text TEXT NOT NULL,
        pages TEXT
    );
    CREATE TABLE passage_vectors (
        document TEXT NOT NULL,
        model TEXT NOT NULL,
        chunk_tokens INTEGER NOT NULL,
        chunk INTEGER NOT NULL,
        vector BLOB NOT NULL,
        PRIMARY KEY (document, model, chunk_tokens, chunk)
    );
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


class ChatStoreError(OutriderError):
    """The chats database cannot be used (newer version, corrupt, unwritable)."""


@dataclass(frozen=True)
class ConversationSummary:
    """What the conversation list shows, without loading any message."""

    id: int
    title: str
    updated: float


class _Checkpointer(threading.Thread):
    """Moves the WAL into the database every few seconds, off the GUI thread."""

    def __init__(self, path: Path, interval: float) -> None:
        super().__init__(name="chat-store-checkpoint", daemon=True)
        self._path = path
        self._interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        conn = sqlite3.connect(self._path, timeout=5.0)
        try:
            while not self._stop_event.wait(self._interval):
                with contextlib.suppress(sqlite3.Error):  # busy now: the next round does it
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


class ChatStore:
    """All conversations and messages. Not thread-safe: use it from one thread (the GUI's).

    Attributes:
        media: the chats' image files, in `chat-images/` beside the database.
    """

    def __init__(self, path: Path, checkpoint_interval: float = CHECKPOINT_INTERVAL_S) -> None:
        self.path = path
        self.media = MediaFiles(path.parent / "chat-images")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise ChatStoreError(f"Cannot open the chats database {path}: {exc}") from exc
        self._checkpointer = _Checkpointer(path, checkpoint_interval)
        self._checkpointer.start()

    def close(self) -> None:
        if self._checkpointer.is_alive():
            self._checkpointer.stop()
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._db.close()

    def _migrate(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise ChatStoreError(
                f"{self.path} was written by a newer Outrider (schema {version}); "
                "update Outrider to open it")
        for step in range(version, SCHEMA_VERSION):
            self._db.executescript(f"BEGIN; {MIGRATIONS[step]}; PRAGMA user_version={step + 1}; COMMIT;")

    # -- conversations -----------------------------------------------------------------

    def create_conversation(self, title: str = "New chat", system_prompt: str = "",
                            model: str = "", sampling: SamplingParams = DEFAULT_SAMPLING,
                            response_schema: str = "") -> Conversation:
        now = time.time()
        conv = Conversation(0, title, now, now, system_prompt, model, sampling,
                            response_schema=response_schema)
        cursor = self._db.execute(
            "INSERT INTO conversations (title, created, updated, system_prompt, model, sampling, "
            "response_schema) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (title, now, now, system_prompt, model, json.dumps(conv.sampling_dict()),
             response_schema))
        conv.id = int(cursor.lastrowid or 0)
        return conv

    def save_conversation(self, conv: Conversation) -> None:
        conv.updated = time.time()
        self._db.execute(
            "UPDATE conversations SET title=?, updated=?, system_prompt=?, model=?, sampling=?, "
            "current_leaf=?, response_schema=? WHERE id=?",
            (conv.title, conv.updated, conv.system_prompt, conv.model,
             json.dumps(conv.sampling_dict()), conv.current_leaf, conv.response_schema, conv.id))

    def conversation(self, conversation_id: int) -> Conversation:
        row = self._db.execute(
            "SELECT id, title, created, updated, system_prompt, model, sampling, current_leaf, "
            "response_schema FROM conversations WHERE id=?", (conversation_id,)).fetchone()
        if row is None:
            raise ChatStoreError(f"There is no conversation {conversation_id}")
        sampling = sampling_from_dict(json.loads(row[6])) if row[6] != "{}" else DEFAULT_SAMPLING
        return Conversation(row[0], row[1], row[2], row[3], row[4], row[5], sampling, row[7],
                            row[8])

    def list_conversations(self, offset: int = 0, limit: int = 100,
                           query: str = "") -> list[ConversationSummary]:
        """Newest first; `query` matches titles and message text (case-insensitive)."""
        sql = "SELECT id, title, updated FROM conversations"
        args: tuple[object, ...] = ()
        if query:
            like = f"%{query}%"
            sql += (" WHERE title LIKE ? OR id IN "
                    "(SELECT conversation_id FROM messages WHERE content LIKE ?)")
            args = (like, like)
        sql += " ORDER BY updated DESC, id DESC LIMIT ? OFFSET ?"
        rows = self._db.execute(sql, (*args, limit, offset)).fetchall()
        return [ConversationSummary(r[0], r[1], r[2]) for r in rows]

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a chat, and the image files no other chat uses."""
        images = {(a.sha256, a.mime) for m in self.messages(conversation_id)
                  for a in m.attachments if a.kind == "image"}
        self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))
        for sha, mime in images:
            used = self._db.execute("SELECT 1 FROM messages WHERE attachments LIKE ? LIMIT 1",
                                    (f"%{sha}%",)).fetchone()
            if used is None:
                with contextlib.suppress(OSError):
                    self.media.remove(sha, mime)

    # -- messages ----------------------------------------------------------------------

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT id, conversation_id, parent_id, role, content, created, status, error, stats, "
            "draft_spans, reasoning, attachments FROM messages WHERE conversation_id=? "
            "ORDER BY id", (conversation_id,))
        return [Message(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], json.loads(r[8]),
                        json.loads(r[9]), r[10],
                        [Attachment.from_dict(a) for a in json.loads(r[11])]) for r in rows]

    def add_message(self, conversation_id: int, parent_id: int | None, role: Role,
                    content: str, status: Status = "done",
                    attachments: Iterable[Attachment] = ()) -> Message:
        message = Message(0, conversation_id, parent_id, role, content, time.time(), status,
                          attachments=list(attachments))
        cursor = self._db.execute(
            "INSERT INTO messages (conversation_id, parent_id, role, content, created, status, "
            "attachments) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, parent_id, role, content, message.created, status,
             _attachments_json(message.attachments)))
        message.id = int(cursor.lastrowid or 0)
        return message

    def save_message(self, message: Message) -> None:
        self._db.execute(
            "UPDATE messages SET content=?, status=?, error=?, stats=?, draft_spans=?, reasoning=?, "
            "attachments=? WHERE id=?",
            (message.content, message.status, message.error, json.dumps(message.stats),
             json.dumps(message.draft_spans), message.reasoning,
             _attachments_json(message.attachments), message.id))

    # -- documents and their passage index ---------------------------------------------

    def save_document(self, sha256: str, document: Document) -> None:
        """Keep an attached document's text (once per distinct text)."""
        pages = json.dumps(list(document.pages)) if document.pages is not None else None
        self._db.execute("INSERT OR IGNORE INTO documents (sha256, name, text, pages) "
                         "VALUES (?, ?, ?, ?)", (sha256, document.name, document.text, pages))

    def document(self, sha256: str) -> Document | None:
        row = self._db.execute("SELECT name, text, pages FROM documents WHERE sha256=?",
                               (sha256,)).fetchone()
        if row is None:
            return None
        return Document(row[0], row[1], tuple(json.loads(row[2])) if row[2] else None)

    def passage_vectors(self, document: str, model: str, chunk_tokens: int) -> dict[int, np.ndarray]:
        """The stored embeddings of a document's chunks (chunk index → float32 vector)."""
        rows = self._db.execute(
            "SELECT chunk, vector FROM passage_vectors WHERE document=? AND model=? AND "
            "chunk_tokens=?", (document, model, chunk_tokens))
        return {int(r[0]): np.frombuffer(r[1], dtype="<f4") for r in rows}

    def save_passage_vectors(self, document: str, model: str, chunk_tokens: int,
                             vectors: dict[int, np.ndarray]) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO passage_vectors (document, model, chunk_tokens, chunk, vector) "
            "VALUES (?, ?, ?, ?, ?)",
            [(document, model, chunk_tokens, index, np.asarray(v, dtype="<f4").tobytes())
             for index, v in vectors.items()])


def _attachments_json(attachments: list[Attachment]) -> str:
    return json.dumps([a.to_dict() for a in attachments])
