"""A local Hugging Face compatible HTTP server with fault injection, for hub and download tests.

It implements the routes the real `huggingface_hub` client calls, with the headers it reads:

    GET  /api/models?search=&author=&filter=gguf&sort=&limit=         list_models
    GET  /api/models/<owner>/<name>[/revision/<rev>]?blobs=True       model_info(files_metadata=True)
    HEAD /<owner>/<name>/resolve/<rev>/<file>                         get_hf_file_metadata
    GET  /<owner>/<name>/resolve/<rev>/<file>                         hf_hub_download, Outrider
    GET  /cdn/<sha256>?repo=&file=                                    where LFS files redirect to

Like the real Hub, `resolve` answers an LFS file with a 302 to a CDN host carrying
`X-Repo-Commit`, `X-Linked-Etag` (the sha256) and `X-Linked-Size`; the "CDN" is this same
server reached as `localhost` instead of `127.0.0.1`, so the client treats it as another host
(and drops the Authorization header, as it must). With `lfs_redirect=False` the file is served
directly from `resolve`. Ranges (`bytes=N-`, `bytes=N-M`) answer 206 with `Content-Range`.

Errors carry the `X-Error-Code` the client maps to its exceptions: RepoNotFound,
RevisionNotFound, EntryNotFound, GatedRepo (401 unless `Authorization: Bearer <token>`).

Faults, per file (`set_fault`): HTTP 500 for the first N requests, the connection dropped when
the file reaches byte N, a stall at byte N (until `release_stalls()` or a timeout), bytes that
do not match the advertised hash, and a body longer than the file (`extra` bytes past its end,
framed three ways, below). `update_file` makes a new commit (a revision change). `stats()` counts
requests and body bytes actually written per file, so a test can assert that a resumed
download never received a byte twice.

A longer body is generated as it is sent, so a test can promise 2 GiB and send only what the
client reads before it hangs up (`stats().bytes_sent` says how much that was):

    Fault(extra=50 << 20)                          Content-Length: size + 50 MiB, all sent
    Fault(extra=2 << 30, extra_framing="close")    no Content-Length: sent until the client closes
    Fault(extra=4096, extra_framing="after-length")  Content-Length: size, then 4 KiB more anyway

    >>> with FakeHub() as hub:
    ...     hub.add_repo("tiny/Tiny-GGUF", {"tiny-F32.gguf": path})
    ...     os.environ["HF_ENDPOINT"] = hub.url
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK = 1 << 20


@dataclass
class Fault:
    """What goes wrong when a file is fetched. Each counter is used up as it fires."""

    fail_first: int = 0  # HTTP 500 for the first N requests (HEAD or GET, resolve or CDN)
    # Offsets are positions in the file, not in one response: a resumed GET that starts at
    # or before the offset meets the fault again (until its count is used up).
    drop_at: int | None = None  # close the connection when the file reaches this byte ...
    drop_times: int = 1  # ... on this many GETs
    stall_at: int | None = None  # stop sending at this byte ...
    stall_times: int = 1  # ... on this many GETs ...
    stall_seconds: float = 30.0  # ... until release_stalls() or this long, then drop
    corrupt: bool = False  # serve bytes that differ from the advertised sha256
    # A body that runs past the file's end by this many bytes (zeros), on every GET that
    # reaches the end; the advertised size (X-Linked-Size, the listing) stays the file's.
    extra: int = 0
    # How the longer body is framed: "length" declares it in Content-Length; "close" sends no
    # length and ends the body by closing the connection; "after-length" declares the file's
    # length and sends the extra bytes after it on the connection all the same.
    extra_framing: Literal["length", "close", "after-length"] = "length"


@dataclass
class FileStats:
    heads: int = 0
    gets: int = 0
    errors_500: int = 0
    bytes_sent: int = 0  # body bytes written to the socket, over all GETs
    ranges: list[str | None] = field(default_factory=list)  # Range header of each body GET
    auth: list[bool] = field(default_factory=list)  # whether each request had a token


@dataclass(frozen=True)
class Blob:
    """File content: bytes in memory, or a file on disk (large benchmark files)."""

    data: bytes | Path
    sha256: str
    size: int

    @classmethod
    def of(cls, data: bytes | Path) -> Blob:
        if isinstance(data, Path):
            digest = hashlib.sha256()
            with data.open("rb") as f:
                while block := f.read(CHUNK):
                    digest.update(block)
            return cls(data, digest.hexdigest(), data.stat().st_size)
        return cls(data, hashlib.sha256(data).hexdigest(), len(data))

    def read(self, start: int, end: int) -> bytes:
        if isinstance(self.data, bytes):
            return self.data[start:end]
        with self.data.open("rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclass
class FakeRepo:
    repo_id: str
    commits: dict[str, dict[str, Blob]]  # commit sha → files
    head: str
    gated: bool = False
    token: str | None = None
    license: str | None = "apache-2.0"
    downloads: int = 0
    likes: int = 0
    tags: tuple[str, ...] = ("gguf",)
    last_modified: datetime = field(default_factory=lambda: datetime(2024, 9, 19, 12, 0, tzinfo=UTC))

    def files(self, revision: str) -> dict[str, Blob] | None:
        sha = self.head if revision == "main" else revision
        return self.commits.get(sha)

    def commit_of(self, revision: str) -> str:
        return self.head if revision == "main" else revision


def _commit_sha(repo_id: str, n: int) -> str:
    return hashlib.sha1(f"{repo_id}@{n}".encode()).hexdigest()


def _iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.000Z")


class FakeHub:
    """The server. Start with `start()` (or `with`); `url` is `http://127.0.0.1:PORT`."""

    def __init__(self, lfs_redirect: bool = True) -> None:
        self.lfs_redirect = lfs_redirect
        self._repos: dict[str, FakeRepo] = {}
        self._faults: dict[tuple[str, str], Fault] = {}
        self._stats: dict[tuple[str, str], FileStats] = {}
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._commits = 0

    # -- set-up --------------------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: dict[str, bytes | Path], *, gated: bool = False,
                 token: str | None = None, license: str | None = "apache-2.0", downloads: int = 0,
                 likes: int = 0, tags: tuple[str, ...] = ("gguf",),
                 last_modified: datetime | None = None) -> FakeRepo:
        blobs = {name: Blob.of(data) for name, data in files.items()}
        with self._lock:
            self._commits += 1
            sha = _commit_sha(repo_id, self._commits)
            repo = FakeRepo(repo_id, {sha: blobs}, sha, gated=gated, token=token, license=license,
                            downloads=downloads, likes=likes, tags=tags)
            if last_modified is not None:
                repo.last_modified = last_modified
            self._repos[repo_id] = repo
        return repo

    def update_file(self, repo_id: str, name: str, data: bytes | Path) -> str:
        """Commit new content for one file: a new revision. Returns the new commit sha."""
        blob = Blob.of(data)
        with self._lock:
            repo = self._repos[repo_id]
            files = dict(repo.commits[repo.head])
            files[name] = blob
            self._commits += 1
            sha = _commit_sha(repo_id, self._commits)
            repo.commits[sha] = files
            repo.head = sha
            repo.last_modified = datetime.now(UTC)
        return sha

    def set_fault(self, repo_id: str, name: str, fault: Fault | None) -> None:
        with self._lock:
            if fault is None:
                self._faults.pop((repo_id, name), None)
            else:
                self._faults[(repo_id, name)] = fault

    def stats(self, repo_id: str, name: str) -> FileStats:
        with self._lock:
            return self._stats.setdefault((repo_id, name), FileStats())

    def reset_stats(self) -> None:
        with self._lock:
            self._stats.clear()

    def release_stalls(self) -> None:
        self._release.set()

    def repo(self, repo_id: str) -> FakeRepo:
        return self._repos[repo_id]

    # -- life ----------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake hub is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cdn_url(self) -> str:
        return f"http://localhost:{self.port}"

    def start(self, host: str = "127.0.0.1", port: int = 0) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = _QuietServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- used by the handler -------------------------------------------------------------------

    def _take_500(self, key: tuple[str, str]) -> bool:
        with self._lock:
            fault = self._faults.get(key)
            if fault is not None and fault.fail_first > 0:
                fault.fail_first -= 1
                self._stats.setdefault(key, FileStats()).errors_500 += 1
                return True
        return False

    def _body_plan(self, key: tuple[str, str], start: int, end: int, size: int) -> _Plan:
        """What goes wrong in a GET of bytes start..end of a `size`-byte file: drop and stall
        as counts of body bytes into this response. Uses a fault's count up when it fires."""
        with self._lock:
            fault = self._faults.get(key)
            if fault is None:
                return _Plan()
            drop = stall = None
            if fault.drop_at is not None and fault.drop_times > 0 and start <= fault.drop_at < end:
                fault.drop_times -= 1
                drop = fault.drop_at - start
            if fault.stall_at is not None and fault.stall_times > 0 and start <= fault.stall_at < end:
                fault.stall_times -= 1
                stall = fault.stall_at - start
            extra = fault.extra if end == size else 0
            return _Plan(drop, stall, fault.stall_seconds, fault.corrupt, extra,
                         fault.extra_framing)

    def _count(self, key: tuple[str, str], *, head: bool = False, range_: str | None = None,
               auth: bool = False, body: bool = False) -> None:
        with self._lock:
            s = self._stats.setdefault(key, FileStats())
            s.auth.append(auth)
            if head:
                s.heads += 1
            elif body:
                s.gets += 1
                s.ranges.append(range_)

    def _sent(self, key: tuple[str, str], n: int) -> None:
        with self._lock:
            self._stats.setdefault(key, FileStats()).bytes_sent += n

    def _find_blob(self, sha: str) -> Blob | None:
        with self._lock:
            for repo in self._repos.values():
                for files in repo.commits.values():
                    for blob in files.values():
                        if blob.sha256 == sha:
                            return blob
        return None


@dataclass(frozen=True)
class _Plan:
    """One GET's faults (`FakeHub._body_plan`)."""

    drop: int | None = None
    stall: int | None = None
    stall_seconds: float = 0.0
    corrupt: bool = False
    extra: int = 0
    framing: str = "length"


_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client hung up (keep-alive closed, a test dropped it): not news
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read counters, not logs

    # -- plumbing ------------------------------------------------------------------------------

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
               content_type: str = "application/json") -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, data: Any, status: int = 200) -> None:
        self._reply(status, json.dumps(data).encode())

    def _error(self, status: int, code: str | None, message: str,
               headers: dict[str, str] | None = None) -> None:
        h = dict(headers or {})
        if code:
            h["X-Error-Code"] = code
        h["X-Error-Message"] = message
        self._reply(status, json.dumps({"error": message}).encode(), h)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[7:] if auth.lower().startswith("bearer ") else None

    # -- routes --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def _route(self) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = parse_qs(parts.query)
        try:
            if path == "/api/models":
                return self._list_models(query)
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?", path)
            if m:
                return self._model_info(m.group(1), m.group(2) or "main", query)
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if m:
                return self._resolve(m.group(1), m.group(2), m.group(3))
            m = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
            if m:
                return self._cdn(m.group(1), query)
            self._error(404, None, "no such route")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _list_models(self, query: dict[str, list[str]]) -> None:
        search = (query.get("search") or [""])[0].lower()
        author = (query.get("author") or [None])[0]
        filters = query.get("filter") or []
        sort = (query.get("sort") or [None])[0]
        limit = int((query.get("limit") or ["1000"])[0])
        repos = [
            r for r in self.fake._repos.values()
            if search in r.repo_id.lower()
            and (author is None or r.repo_id.split("/")[0] == author)
            and all(f in r.tags for f in filters)
        ]
        keys = {"downloads": lambda r: r.downloads, "likes": lambda r: r.likes,
                "lastModified": lambda r: r.last_modified.timestamp()}
        if sort in keys:
            repos.sort(key=keys[sort], reverse=True)
        self._json([self._summary(r) for r in repos[:limit]])

    def _summary(self, r: FakeRepo) -> dict[str, Any]:
        return {
            "_id": r.head[:24], "id": r.repo_id, "modelId": r.repo_id,
            "author": r.repo_id.split("/")[0], "downloads": r.downloads, "likes": r.likes,
            "lastModified": _iso(r.last_modified), "createdAt": _iso(r.last_modified),
            "gated": "manual" if r.gated else False, "private": False,
            "tags": [*r.tags, *([f"license:{r.license}"] if r.license else [])],
            "library_name": "gguf",
        }

    def _model_info(self, repo_id: str, revision: str, query: dict[str, list[str]]) -> None:
        repo = self.fake._repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        files = repo.files(revision)
        if files is None:
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        blobs = (query.get("blobs") or ["false"])[0].lower() == "true"
        siblings: list[dict[str, Any]] = []
        for name, blob in files.items():
            s: dict[str, Any] = {"rfilename": name}
            if blobs:
                s["blobId"] = hashlib.sha1(blob.sha256.encode()).hexdigest()
                s["size"] = blob.size
                s["lfs"] = {"size": blob.size, "sha256": blob.sha256, "pointerSize": 134}
            siblings.append(s)
        info = self._summary(repo)
        info.update({"sha": repo.commit_of(revision), "disabled": False, "siblings": siblings,
                     "cardData": {"license": repo.license} if repo.license else {}})
        self._json(info)

    def _resolve(self, repo_id: str, revision: str, filename: str) -> None:
        key = (repo_id, filename)
        head = self.command == "HEAD"
        repo = self.fake._repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        self.fake._count(key, head=head, auth=self._token() is not None,
                         range_=self.headers.get("Range"), body=not head and not self.fake.lfs_redirect)
        if repo.gated and (self._token() is None or self._token() != repo.token):
            return self._error(401, "GatedRepo",
                               f"Access to model {repo_id} is restricted. You must have access to it "
                               "and be authenticated to access it. Please log in.")
        files = repo.files(revision)
        if files is None:
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        commit = repo.commit_of(revision)
        blob = files.get(filename)
        if blob is None:
            return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
        if self.fake._take_500(key):
            return self._error(500, None, "Internal Error (injected)")
        meta = {"X-Repo-Commit": commit, "X-Linked-Etag": f'"{blob.sha256}"',
                "X-Linked-Size": str(blob.size), "ETag": f'"{blob.sha256}"', "Accept-Ranges": "bytes"}
        if self.fake.lfs_redirect:
            location = (f"{self.fake.cdn_url}/cdn/{blob.sha256}"
                        f"?repo={quote(repo_id)}&file={quote(filename)}")
            return self._reply(302, b"", {**meta, "Location": location})
        self._send_blob(key, blob, meta)

    def _cdn(self, sha: str, query: dict[str, list[str]]) -> None:
        key = ((query.get("repo") or [""])[0], (query.get("file") or [""])[0])
        head = self.command == "HEAD"
        self.fake._count(key, head=head, auth=self._token() is not None,
                         range_=self.headers.get("Range"), body=not head)
        blob = self.fake._find_blob(sha)
        if blob is None:
            return self._error(404, None, "no such object")
        if self.fake._take_500(key):
            return self._error(500, None, "Internal Error (injected)")
        self._send_blob(key, blob, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"})

    def _send_blob(self, key: tuple[str, str], blob: Blob, headers: dict[str, str]) -> None:
        start, end = 0, blob.size  # end exclusive
        status = 200
        range_header = self.headers.get("Range")
        if range_header:
            m = _RANGE.match(range_header.strip())
            if m:
                start = int(m.group(1))
                if m.group(2):
                    end = min(int(m.group(2)) + 1, blob.size)
                if start >= blob.size or start >= end:
                    return self._error(416, None, "Range Not Satisfiable",
                                       {"Content-Range": f"bytes */{blob.size}"})
                status = 206
                headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{blob.size}"}
        plan = _Plan() if self.command == "HEAD" else self.fake._body_plan(key, start, end,
                                                                            blob.size)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        if plan.extra and plan.framing == "close":
            self.send_header("Connection", "close")
        else:
            declared = end - start + (plan.extra if plan.framing == "length" else 0)
            self.send_header("Content-Length", str(declared))
        self.end_headers()
        if self.command == "HEAD":
            return
        drop, stall, stall_seconds, corrupt = plan.drop, plan.stall, plan.stall_seconds, plan.corrupt
        limit = end - start
        cut = min(x for x in (drop, stall, limit) if x is not None)
        sent = 0
        pos = start
        while sent < cut:
            n = min(CHUNK, cut - sent)
            data = blob.read(pos, pos + n)
            if corrupt and pos <= blob.size // 2 < pos + n:
                i = blob.size // 2 - pos
                data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
            # Counted before the write: the client may have the bytes (and the test assert on
            # the count) before this thread runs again. A failed write takes them back.
            self.fake._sent(key, n)
            try:
                self.wfile.write(data)
                self.wfile.flush()
            except OSError:
                self.fake._sent(key, -n)
                raise
            sent += n
            pos += n
        if sent < limit:
            if stall is not None and sent == stall:
                deadline = time.monotonic() + stall_seconds
                while not self.fake._release.wait(0.05) and time.monotonic() < deadline:
                    pass
            self.close_connection = True  # drop: the client sees a short body
        elif plan.extra:
            self._send_extra(key, plan.extra)

    def _send_extra(self, key: tuple[str, str], extra: int) -> None:
        """`extra` zero bytes past the file's end, made as they go, until the client hangs up
        (a BrokenPipe the route swallows); then the connection ends, whatever the framing."""
        zeros = bytes(CHUNK)
        left = extra
        self.close_connection = True
        while left > 0:
            n = min(CHUNK, left)
            self.fake._sent(key, n)
            try:
                self.wfile.write(zeros[:n])
                self.wfile.flush()
            except OSError:
                self.fake._sent(key, -n)
                raise
            left -= n


def main() -> None:
    """Serve FILEs as one repository until stdin closes; prints the URL first.

    python -c "from tests.hubserver.server import main; main()" FILE... [--repo owner/name]
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="serve files as a fake Hugging Face repo")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repo", default="bench/Bench-GGUF")
    parser.add_argument("--no-redirect", action="store_true")
    args = parser.parse_args()
    hub = FakeHub(lfs_redirect=not args.no_redirect).start()
    hub.add_repo(args.repo, {p.name: p for p in args.files})
    print(hub.url, flush=True)
    try:
        sys.stdin.read()  # serve until stdin closes
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
