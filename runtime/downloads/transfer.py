"""One resumable transfer: a streaming GET from a byte offset, appended to a partial file and
hashed as it arrives. The download manager (`runtime.downloads.manager`) drives it.

Why this exists instead of `huggingface_hub.hf_hub_download`: that function writes into the
HF cache's own `.incomplete` file, reports progress only through a tqdm class, cannot be
paused, and resumes only within one call. Outrider needs all three across restarts, so it
wraps the smallest piece itself — this one GET with a `Range` header (httpx) — while URLs,
headers, the token, the file's metadata and the error mapping stay huggingface_hub's.

    >>> import hashlib, httpx, tempfile
    >>> body = bytes(range(256)) * 4                        # the file on the server: 1,024 bytes
    >>> def serve(request):                                 # a server that honours Range
    ...     start = int(request.headers["Range"].removeprefix("bytes=").rstrip("-"))
    ...     return httpx.Response(206, stream=httpx.ByteStream(body[start:]))
    >>> client = httpx.Client(transport=httpx.MockTransport(serve))
    >>> folder = tempfile.TemporaryDirectory()
    >>> partial = Path(folder.name) / "file.gguf.part"
    >>> partial.write_bytes(body[:1000])                    # what an earlier attempt brought
    1000
    >>> hashing = Hashing(); hashing.sync(partial)          # hash what is already on disk
    >>> fetch_into(client, "https://huggingface.co/repo/resolve/main/file.gguf", {}, partial,
    ...            partial.stat().st_size, len(body), hashing, StopFlag(), stall_timeout=30,
    ...            on_progress=print, what="repo/file.gguf")
    1024
    >>> hashing.digest.hexdigest() == hashlib.sha256(body).hexdigest()  # the whole file's
    True
    >>> folder.cleanup()

Errors: `Retryable` (connection lost, stall, HTTP 5xx/408/429, a short body) carries how many
bytes the attempt brought; `OutOfSpace` when the disk filled up (the caller says how much is
free and needed); `Stopped` when the flag was raised; typed `OutriderError`s for the rest (404,
401/403, `OversizedDownload`).

Never a byte past the file's size: a body longer than the size the Hub advertised (a
Content-Length that says more, a body that runs on until the server closes) is cut at that
size within the chunk that crosses it, and the attempt ends with `OversizedDownload`:

    size 1,000,000, partial at 0, chunks of 65,536: the 16th chunk ends at 1,048,576;
    its first 16,960 bytes are written, the partial is 1,000,000 bytes, the connection closed.

Why not trust Content-Length: it is the server's word too, and a body without one (ended by
closing the connection) has no length at all. The advertised size is what the sha256 is for.
"""

from __future__ import annotations

import errno
import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Literal
from urllib.parse import urlsplit

import httpx

from runtime.errors import GatedRepo, HubError, OversizedDownload, RemoteFileNotFound
from runtime.hub.client import redact
from runtime.units import fmt_bytes

StopReason = Literal["pause", "cancel", "shutdown"]


class Stopped(Exception):
    """The transfer was asked to stop (pause, cancel, shutdown)."""


class Retryable(Exception):
    """A failure worth another attempt; `received` bytes were appended before it."""

    def __init__(self, reason: str, received: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.received = received


class OutOfSpace(Exception):
    """The disk filled up (ENOSPC, EDQUOT) while appending; `received` bytes were appended
    before it (the partial file keeps them, a whole prefix of the file)."""

    def __init__(self, received: int) -> None:
        super().__init__(f"the disk filled up after {received:,} bytes")
        self.received = received


class StopFlag:
    """Raised once from any thread; `wait` is a sleep that a stop interrupts (backoffs)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: StopReason | None = None

    def stop(self, reason: StopReason) -> None:
        if self.reason is None:  # the first reason stands: a cancel is not undone by a shutdown
            self.reason = reason
        self._event.set()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Stopped(self.reason)

    def wait(self, seconds: float) -> None:
        if self._event.wait(seconds):
            raise Stopped(self.reason)


def sha256_prefix(path: Path, length: int, chunk: int = 4 << 20) -> Any:
    """A hashlib object fed the first `length` bytes of `path` (to resume hashing a partial:
    hashlib's state cannot be saved, so a partial from an earlier run is read once)."""
    digest = hashlib.sha256()
    remaining = length
    with path.open("rb") as f:
        while remaining > 0 and (block := f.read(min(chunk, remaining))):
            digest.update(block)
            remaining -= len(block)
    return digest


class Hashing:
    """The running sha256 of a partial file and how many of its bytes it has seen."""

    def __init__(self) -> None:
        self.digest: Any = hashlib.sha256()
        self.length = 0

    def sync(self, partial: Path) -> None:
        """Make the hash cover exactly the bytes on disk (re-reading them only if needed)."""
        size = partial.stat().st_size if partial.exists() else 0
        if size != self.length:
            self.digest = sha256_prefix(partial, size) if size else hashlib.sha256()
            self.length = size

    def reset(self) -> None:
        self.digest = hashlib.sha256()
        self.length = 0

    def update(self, chunk: bytes) -> None:
        self.digest.update(chunk)
        self.length += len(chunk)


class Rate:
    """Bytes per second over a sliding window, from an injectable clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window: float = 3.0) -> None:
        self._clock = clock
        self._window = window
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, received: int) -> float:
        now = self._clock()
        self._samples.append((now, received))
        while len(self._samples) > 2 and now - self._samples[0][0] > self._window:
            self._samples.popleft()
        t0, r0 = self._samples[0]
        return (received - r0) / (now - t0) if now > t0 else 0.0


def same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def fetch_into(client: httpx.Client, url: str, headers: dict[str, str], partial: Path,
               offset: int, size: int | None, hashing: Hashing, stop: StopFlag, *,
               stall_timeout: float, on_progress: Callable[[int], None], what: str) -> None:
    """GET `url` from byte `offset` and append to `partial`, hashing each chunk at once.

    `hashing` must cover the partial's first `offset` bytes. `on_progress(total_bytes)` is
    called after each chunk. A server that ignores Range (200) restarts the file from zero.
    The partial never grows past `size` (module doc).
    """
    headers = {**headers, "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    token = _bearer(headers)
    received = 0
    try:
        with client.stream("GET", url, headers=headers) as response:
            status = response.status_code
            if status == 416 and size is not None and offset >= size:
                return  # we already hold every byte
            _check_status(status, what)
            if offset and status == 200:  # Range ignored: the body is the whole file
                partial.unlink(missing_ok=True)
                hashing.reset()
                offset = 0
            room = None if size is None else size - offset  # what this body may add
            # iter_raw, not iter_bytes(chunk_size), and an unbuffered file: each chunk reaches
            # the file as soon as it is read, so nothing received waits in a buffer when the
            # connection drops, and the partial's size (what another Outrider process shows)
            # is never behind the progress reported here. Unbuffered also means a full disk
            # fails the write itself, never a later flush in close() that would hide it.
            with open(partial, "ab", buffering=0) as out:
                for chunk in response.iter_raw():
                    over = room is not None and received + len(chunk) > room
                    if room is not None and over:
                        chunk = chunk[:room - received]
                    _append(out, chunk, received)
                    hashing.update(chunk)
                    received += len(chunk)
                    on_progress(offset + received)
                    if over:
                        raise OversizedDownload(
                            f"the server sent more than the file's size ({size:,} bytes) for "
                            f"{what}; nothing past that size was saved")
                    if stop.stopped:
                        raise Stopped(stop.reason)
    except httpx.TimeoutException as exc:
        if stop.stopped:
            raise Stopped(stop.reason) from exc
        reason = (f"stalled: no data for {stall_timeout:g} s" if isinstance(exc, httpx.ReadTimeout)
                  else f"timed out ({type(exc).__name__})")
        raise Retryable(reason, received) from exc
    except httpx.TransportError as exc:
        if stop.stopped:
            raise Stopped(stop.reason) from exc
        detail = redact(str(exc) or type(exc).__name__, token)
        raise Retryable(f"connection lost after {fmt_bytes(received)} ({detail})", received) from exc
    if size is not None and offset + received < size:
        raise Retryable(f"the server closed the file at {offset + received:,} of {size:,} bytes",
                        received)


def _append(out: BinaryIO, chunk: bytes, received: int) -> None:
    """Write all of `chunk` to an unbuffered file (a raw write may take only part of it).
    A full disk is `OutOfSpace`; the bytes it let through stay, a prefix of the chunk."""
    view = memoryview(chunk)
    try:
        while view:
            written = out.write(view)
            view = view[written or 0:]
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OutOfSpace(received + len(chunk) - len(view)) from exc
        raise


def _bearer(headers: dict[str, str]) -> str | None:
    auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    return auth[7:] if auth.lower().startswith("bearer ") else None


def _check_status(status: int, what: str) -> None:
    if status in (200, 206):
        return
    if status == 404:
        raise RemoteFileNotFound(f"{what} was not found (HTTP 404)")
    if status in (401, 403):
        raise GatedRepo(f"{what}: access denied (HTTP {status}); a Hugging Face token with access is needed")
    if status >= 500 or status in (408, 429):
        raise Retryable(f"the server answered HTTP {status}")
    raise HubError(f"the server answered HTTP {status} for {what}")
