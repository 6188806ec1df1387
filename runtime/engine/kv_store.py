"""Saved prefixes: a conversation's KV cells on disk, so coming back to it costs only the
new tokens — after switching chats, after the slots were needed elsewhere, after a restart.

The slot table (`runtime.engine.kv_slots`) calls `save` for a slot that went idle as soon as
the engine thread has nothing else to do, and at the latest when an idle slot's cells are
about to be dropped (evicted for another prompt, cut back for a shorter one, the engine
unloading); it asks `find` at admission when no live or idle slot holds as long a prefix:

    turn 1   [sys, user₁, reply₁]            finished; cells stay as prefix cache (slot 0)
             engine idle                      → save(0, tokens) → <cache>/kv/3f9c…-a1b2….kv
    ...      the user switches chats, quits, or the engine is killed: the file is there
    restart  turn 2 [sys, user₁, reply₁, user₂]
             find → the saved file (3,912 tokens in common) → restore into a slot,
             prefill only [user₂]             "resumed 3,912 cached tokens in 0.21 s"

Saving runs on the engine thread while no request is waiting (one slot per pass; a request
arriving meanwhile waits for that one write: the sequence's K/V bytes, ~66 MiB for 3,000
tokens of SmolLM2-135M at f16). Where cells can be cut anywhere, a new turn's file replaces
the files of its shorter prefixes (`supersede`), so a conversation costs one file.

One file per saved sequence, named `<cache key>-<prefix hash>.kv`:

    header   magic b"OUTRKV\\r\\n", version u32, token count u32, state bytes u64,
             cache key (32 bytes), sha256 of the payload (32 bytes)          (96 bytes)
    payload  the tokens (int32 each), then llama.cpp's sequence state
             (`llama_state_seq_get_data`: positions and K/V rows in the cache's own types)

The cache key is a sha256 over the model file's identity (path, size, mtime and its first MiB,
as the load probe keys verdicts: `runtime.gguf.verdicts.file_key`), every context parameter
that shapes the cache (K/V types, context, slots, flash attention — the V layout —, SWA mode,
RoPE, …: all of `LlamaParams` except threads, batch sizes and placement); the file identity
includes the llama-cpp-python version, so a newer llama.cpp never reads an older one's state. A file is used only when its key matches, its checksum holds and its tokens really
are a prefix of the prompt; anything else — another model, other settings, a damaged or
truncated file, one llama.cpp refuses — is deleted and the prompt computed as if it never
existed. A stale cache costs a prefill, never a wrong answer.

Files share one budget (default 4 GiB) across models; the least recently used go first (a
file's mtime is touched when it is restored). Writing goes through `runtime.atomic_file`, so
a reader never sees half a file; a write that fails (a full disk, a read-only folder) is
said once in the log and the chat goes on without it.

Why not `llama_state_seq_save_file`: it writes the tokens and state with no checksum and no
key, so a file from another quant of the same model would load — llama.cpp checks layer
count and row sizes, not the weights the cells were computed with.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from runtime.atomic_file import atomic_output
from runtime.gguf.verdicts import file_key

logger = logging.getLogger("outrider.kv_store")

GIB = 1024**3
DEFAULT_BUDGET_BYTES = 4 * GIB
MAGIC = b"OUTRKV\r\n"
VERSION = 1
_HEADER = struct.Struct("<8sIIQ32s32s")
_SUFFIX = ".kv"
# LlamaParams fields that do not change what a cell holds or how it is laid out.
_NOT_IN_KEY = frozenset({"n_threads", "n_threads_batch", "n_batch", "n_ubatch", "no_perf",
                         "load_mode", "n_gpu_layers", "offload_kqv", "notes"})


class SeqState(Protocol):
    """The sequence-state calls (runtime.llama.binding.LlamaContext has them)."""

    def state_seq_get(self, seq_id: int) -> bytes: ...

    def state_seq_set(self, seq_id: int, data: bytes) -> bool: ...


@dataclass(frozen=True)
class KvStoreOptions:
    """Where saved prefixes live and how much they may take. min_tokens: shorter sequences
    (and restores gaining fewer tokens over the live cache) are not worth a file."""

    folder: Path
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    min_tokens: int = 32


@dataclass(frozen=True)
class StoredMatch:
    """A saved file whose first `usable` tokens the prompt shares; restoring it takes
    `n_tokens` cells until the rest is cut away."""

    path: Path
    n_tokens: int
    usable: int


@dataclass
class _Entry:
    path: Path
    tokens: np.ndarray  # int32


def cache_key(model_path: Path, params: Any, *, n_ctx: int, flash_attn: bool) -> bytes:
    """sha256 over the model file's identity (with the llama-cpp-python version), the
    cache-shaping parameters (`params`: a `LlamaParams`), the context as llama.cpp rounded it
    and whether flash attention ended up on. Any difference → another key → no file of the
    other is used."""
    fields = {k: v for k, v in dataclasses.asdict(params).items() if k not in _NOT_IN_KEY}
    fields.update(n_ctx=n_ctx, flash_attn_used=flash_attn, format=VERSION)
    text = file_key(model_path) + "\0" + json.dumps(fields, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).digest()


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two int32 arrays (`kv_slots.common_prefix` for
    arrays already made)."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class KvStore:
    """The saved prefixes of one loaded model (one cache key) in a folder shared with others.

    Runs on the engine thread (every call touches llama.cpp's cache through `state`)."""

    def __init__(self, options: KvStoreOptions, key: bytes, state: SeqState) -> None:
        self.folder = options.folder
        self.budget = options.budget_bytes
        self.min_tokens = max(1, options.min_tokens)
        self.key = key
        self.state = state
        self._prefix = key.hex()[:16]
        self._index: dict[Path, _Entry] | None = None  # read on first use
        self._write_failed_said = False

    # ---- finding and restoring --------------------------------------------------------------

    def find(self, tokens: Sequence[int], live: int, *, whole: bool) -> StoredMatch | None:
        """The saved file sharing the longest prefix with `tokens` when it beats the `live`
        cache by at least `min_tokens`; at most len(tokens) − 1 are usable (the last prompt
        token is evaluated for its logits). whole=True (a cache that cannot be cut: sliding
        window, recurrent) takes only files that are wholly a prefix."""
        if not tokens:
            return None
        best: StoredMatch | None = None
        prompt = np.asarray(tokens, dtype=np.int32)
        for entry in self._entries().values():
            n = len(entry.tokens)
            common = _common_prefix(entry.tokens, prompt)
            if whole and (common < n or n > len(tokens) - 1):
                continue
            usable = min(common, len(tokens) - 1)
            if usable >= live + self.min_tokens and (best is None or usable > best.usable):
                best = StoredMatch(entry.path, n, usable)
        return best

    def restore(self, match: StoredMatch, slot: int) -> float | None:
        """Load the file's cells into `slot`; the seconds it took, or None (the file was
        damaged or refused: deleted, and `slot` holds nothing)."""
        t0 = time.perf_counter()
        entry = self._entries().get(match.path)
        state = self._read(match.path, expect=entry.tokens if entry is not None else None)
        if state is None:
            self._discard(match.path, "damaged or from another model or settings")
            return None
        if not self.state.state_seq_set(slot, state):
            self._discard(match.path, "llama.cpp refused its cells")
            return None
        with contextlib.suppress(OSError):
            os.utime(match.path)  # most recently used
        return time.perf_counter() - t0

    # ---- saving -------------------------------------------------------------------------------

    def save(self, slot: int, tokens: Sequence[int], *, supersede: bool = False) -> None:
        """Save `slot`'s cells, which hold exactly `tokens`. Never raises: a failed write is
        said once in the log and the chat goes on. supersede=True (a cache that can be cut
        at any position): files holding a shorter prefix of `tokens` are deleted once this
        one is written — a conversation keeps one file, its latest turn, not one per turn."""
        n = len(tokens)
        if n < self.min_tokens:
            return
        arr = np.asarray(tokens, dtype=np.int32)
        path = self.folder / f"{self._prefix}-{self._prefix_hash(arr)}{_SUFFIX}"
        index = self._entries()
        if path in index and path.exists():
            with contextlib.suppress(OSError):
                os.utime(path)
            return
        state = self.state.state_seq_get(slot)
        if not state:
            return
        size = _HEADER.size + arr.nbytes + len(state)
        if size > self.budget:
            logger.debug("a %d-token prefix (%d bytes) is larger than the whole budget", n, size)
            return
        try:
            self._make_room(size)
            payload_hash = hashlib.sha256(arr.tobytes())
            payload_hash.update(state)
            header = _HEADER.pack(MAGIC, VERSION, n, len(state), self.key, payload_hash.digest())
            with atomic_output(path, prefix=".partial-", suffix=_SUFFIX) as tmp, open(tmp, "wb") as f:
                f.write(header)
                f.write(arr.tobytes())
                f.write(state)
        except OSError as exc:
            if not self._write_failed_said:
                self._write_failed_said = True
                logger.warning("could not save a conversation's KV cache in %s (%s); chats "
                               "go on without it", self.folder, exc.strerror or exc)
            return
        index[path] = _Entry(path, arr)
        if supersede:
            for old in [e for e in index.values() if e.path != path and len(e.tokens) < n
                        and _common_prefix(e.tokens, arr) == len(e.tokens)]:
                self._discard(old.path, "a longer prefix of it was saved")

    # ---- the folder ---------------------------------------------------------------------------

    def _prefix_hash(self, tokens: np.ndarray) -> str:
        return hashlib.sha256(self.key + tokens.tobytes()).hexdigest()[:32]

    def _entries(self) -> dict[Path, _Entry]:
        """This key's files (header and tokens read once; a bad one is deleted)."""
        if self._index is None:
            self._index = {}
            try:
                paths = sorted(self.folder.glob(f"{self._prefix}-*{_SUFFIX}"))
            except OSError:
                paths = []
            for path in paths:
                tokens = self._read_tokens(path)
                if tokens is None:
                    self._discard(path, "damaged or from another model or settings")
                else:
                    self._index[path] = _Entry(path, tokens)
        return self._index

    def _header(self, data: bytes, size: int) -> tuple[int, int, bytes] | None:
        """(tokens, state bytes, payload sha256) of a file of `size` bytes, or None."""
        if len(data) < _HEADER.size:
            return None
        magic, version, n, n_state, key, digest = _HEADER.unpack_from(data)
        if (magic != MAGIC or version != VERSION or key != self.key
                or size != _HEADER.size + 4 * n + n_state):
            return None
        return n, n_state, digest

    def _read_tokens(self, path: Path) -> np.ndarray | None:
        try:
            with open(path, "rb") as f:
                head = f.read(_HEADER.size)
                parsed = self._header(head, os.fstat(f.fileno()).st_size)
                if parsed is None:
                    return None
                raw = f.read(4 * parsed[0])
        except OSError:
            return None
        tokens = np.frombuffer(raw, dtype=np.int32)
        if self._prefix_hash(tokens) != path.stem.partition("-")[2]:
            return None  # renamed, or a prefix that is not the one in its name
        return tokens

    def _read(self, path: Path, expect: np.ndarray | None) -> bytes | None:
        """The file's llama.cpp state after every check, or None."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        parsed = self._header(data, len(data))
        if parsed is None:
            return None
        n, _n_state, digest = parsed
        payload = memoryview(data)[_HEADER.size:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        tokens = np.frombuffer(payload[:4 * n], dtype=np.int32)
        if expect is None or not np.array_equal(tokens, expect):
            return None
        return bytes(payload[4 * n:])

    def _discard(self, path: Path, why: str) -> None:
        logger.info("discarded saved KV cache %s: %s", path.name, why)
        if self._index is not None:
            self._index.pop(path, None)
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)

    def _make_room(self, size: int) -> None:
        """Delete the least recently used files (of any model) until `size` more fits."""
        files = []
        for path in self.folder.glob(f"*{_SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue
            if not path.name.startswith("."):
                files.append((st.st_mtime_ns, st.st_size, path))
        total = sum(f[1] for f in files)
        for _mtime, file_size, path in sorted(files):
            if total + size <= self.budget:
                break
            try:
                path.unlink(missing_ok=True)
            except OSError:
                continue
            total -= file_size
            if self._index is not None:
                self._index.pop(path, None)
