"""Search and inspect GGUF repositories on the Hugging Face Hub, or on the mirror in HF_ENDPOINT.

Everything goes through `huggingface_hub`'s own primitives (`HfApi.list_models`,
`HfApi.model_info`, `hf_hub_url`, `get_hf_file_metadata`, `build_hf_headers`); this module
turns their answers into small frozen dataclasses and their exceptions into Outrider's typed
errors, with the user's token redacted from every message.

`huggingface_hub` reads `HF_ENDPOINT` and `HF_HUB_OFFLINE` once, at import. Outrider reads them
at call time and passes `endpoint=` explicitly, so a mirror chosen in the settings (or a test's
local server) takes effect without restarting the process.

Outrider sends the Hub only the requests the user asked for: `huggingface_hub`'s telemetry is
off. Its user-agent code (2.x) would otherwise fetch a list of "agent harnesses" from
huggingface.co itself — ignoring a configured mirror — before the first request of a process.

    hub = Hub(token=None)                          # asks huggingface.co
    [r.repo_id for r in hub.search("qwen2.5 7b instruct", sort="downloads", limit=3)]
    # ['bartowski/Qwen2.5-7B-Instruct-GGUF', 'Qwen/Qwen2.5-7B-Instruct-GGUF', ...]
    details = hub.repo_details("Qwen/Qwen2.5-0.5B-Instruct-GGUF")
    details.file("qwen2.5-0.5b-instruct-q8_0.gguf").size      # from files_metadata
    # 675710816

Offline (`HF_HUB_OFFLINE=1`): answers fetched before are served from the cache
(`<user cache>/hub/`); anything else raises `HubOffline`.

No network: each call first resolves the endpoint's host name and opens a TCP connection to it,
each for at most `resolve_timeout` seconds (3 s; `check_reachable` says why), so a call without
a network is `HubUnreachable` within seconds instead of half a minute.

    >>> Hub(endpoint="https://hub.invalid").search("qwen")      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    runtime.errors.HubUnreachable: cannot reach https://hub.invalid: the name hub.invalid does not resolve (...)
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers
from huggingface_hub.utils import httpx as hub_http  # httpx2 from huggingface_hub 2.x, httpx in 1.x

from runtime.atomic_file import write_text
from runtime.errors import (
    GatedRepo,
    HubError,
    HubOffline,
    HubServerError,
    HubUnreachable,
    RemoteFileNotFound,
    RepoNotFound,
)
from runtime.paths import user_dirs

constants.HF_HUB_DISABLE_TELEMETRY = True  # read at each request: no extra calls to huggingface.co

DEFAULT_ENDPOINT = "https://huggingface.co"
LIBRARY_NAME = "outrider"
RESOLVE_TIMEOUT_S = 3.0

SortKey = Literal["downloads", "likes", "recent"]
# Outrider's sort names → huggingface_hub's (it maps "last_modified" to the API's lastModified).
_SORTS: dict[str, str] = {"downloads": "downloads", "likes": "likes", "recent": "last_modified"}
_SEARCH_EXPAND = ["author", "downloads", "likes", "lastModified", "gated", "tags"]


def hub_endpoint() -> str:
    """The Hub's base URL now: `HF_ENDPOINT` if set (a mirror, or a test server), else the Hub."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_mode() -> bool:
    """Whether `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is set now, as huggingface_hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def check_reachable(endpoint: str, timeout: float = RESOLVE_TIMEOUT_S) -> None:
    """Raise `HubUnreachable` unless `endpoint`'s host name resolves and its port takes a TCP
    connection, each within `timeout` s.

    Why: without a network the system resolver takes 15–45 s to give up, and huggingface_hub
    retries a refused or failed connection five times (1 + 2 + 4 + 8 + 8 s of backoff); the
    user would wait half a minute to learn there is no network. `getaddrinfo` has no timeout of
    its own, so it runs on a daemon thread that is left to finish alone when it takes too long.
    An IP address (a local mirror, a test server) needs no lookup. Behind a proxy the proxy
    resolves and connects, so nothing is checked here.
    """
    parts = urlsplit(endpoint)
    host = parts.hostname
    if not host or (parts.scheme in getproxies() and not proxy_bypass(host)):
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    outcome: list[Any] = []

    def look_up() -> None:
        try:
            outcome.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            outcome.append(exc)

    if _is_ip(host):
        outcome.append([(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                         0, "", (host, port))])
    else:
        lookup = threading.Thread(target=look_up, name="hub-resolve", daemon=True)
        lookup.start()
        lookup.join(timeout)
    if not outcome:
        raise HubUnreachable(f"cannot reach {endpoint}: the name {host} did not resolve "
                             f"within {timeout:g} s")
    if isinstance(outcome[0], OSError):
        raise HubUnreachable(f"cannot reach {endpoint}: the name {host} does not resolve "
                             f"({outcome[0]})")
    family, kind, proto, _name, address = outcome[0][0]
    try:
        with socket.socket(family, kind, proto) as probe:
            probe.settimeout(timeout)
            probe.connect(address)
    except OSError as exc:
        raise HubUnreachable(f"cannot reach {endpoint}: {exc}") from exc


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def redact(text: str, token: str | None) -> str:
    """`text` with the token replaced, so no message, log line or repr ever carries it.

    >>> redact("401 for Bearer hf_abc123", "hf_abc123")
    '401 for Bearer hf_***'
    """
    return text.replace(token, "hf_***") if token else text


@dataclass(frozen=True)
class RepoSummary:
    """One search hit."""

    repo_id: str
    author: str | None
    downloads: int
    likes: int
    last_modified: datetime | None
    gated: bool
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository. `sha256` is the LFS object's hash (None for small git files)."""

    name: str
    size: int | None
    sha256: str | None = None
    blob_id: str | None = None

    @property
    def is_gguf(self) -> bool:
        return self.name.lower().endswith(".gguf")


@dataclass(frozen=True)
class RepoDetails:
    """A repository at one revision: `revision` is the commit sha the answer describes."""

    repo_id: str
    revision: str
    license: str | None
    gated: bool
    last_modified: datetime | None
    files: tuple[RepoFile, ...]
    downloads: int = 0
    likes: int = 0
    tags: tuple[str, ...] = ()

    @property
    def gguf_files(self) -> tuple[RepoFile, ...]:
        return tuple(f for f in self.files if f.is_gguf)

    def file(self, name: str) -> RepoFile:
        for f in self.files:
            if f.name == name:
                return f
        raise RemoteFileNotFound(f"{self.repo_id} has no file {name!r}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["last_modified"] = self.last_modified.isoformat() if self.last_modified else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RepoDetails:
        modified = data.get("last_modified")
        return cls(
            repo_id=data["repo_id"],
            revision=data["revision"],
            license=data.get("license"),
            gated=bool(data.get("gated")),
            last_modified=datetime.fromisoformat(modified) if modified else None,
            files=tuple(RepoFile(**f) for f in data["files"]),
            downloads=int(data.get("downloads") or 0),
            likes=int(data.get("likes") or 0),
            tags=tuple(data.get("tags") or ()),
        )


@dataclass(frozen=True)
class FileMetadata:
    """What a HEAD on `resolve/<revision>/<file>` says: where the bytes are and which bytes.

    `etag` is the LFS sha256 for LFS files (the Hub's X-Linked-Etag), the git blob id otherwise;
    `commit` is the revision the name resolved to; `location` is the URL to GET (a CDN after the
    Hub's redirect)."""

    url: str
    location: str
    etag: str
    commit: str
    size: int | None

    @property
    def sha256(self) -> str | None:
        """The etag when it is an LFS sha256 (64 hex digits)."""
        e = self.etag.lower()
        return e if len(e) == 64 and all(c in "0123456789abcdef" for c in e) else None


def _license(info: Any) -> str | None:
    card = getattr(info, "card_data", None)
    value = card.get("license") if card is not None else None
    if value:
        return str(value)
    for tag in getattr(info, "tags", None) or ():
        if tag.startswith("license:"):
            return str(tag.split(":", 1)[1])
    return None


class Hub:
    """The Hub as Outrider sees it: search, repository details, file URLs and headers.

    `token` is a user access token for gated or private repositories; None lets
    huggingface_hub use the locally saved one (`hf auth login`, `HF_TOKEN`). It is never
    logged: `repr()` and every error message redact it.
    """

    def __init__(self, token: str | None = None, endpoint: str | None = None,
                 cache_dir: Path | None = None, timeout: float = 20.0,
                 resolve_timeout: float = RESOLVE_TIMEOUT_S) -> None:
        self._token = token or None
        self._endpoint = endpoint.rstrip("/") if endpoint else None
        self._cache_dir = cache_dir
        self.timeout = timeout
        self.resolve_timeout = resolve_timeout

    def __repr__(self) -> str:
        token = "hf_***" if self._token else None
        return f"Hub(endpoint={self.endpoint!r}, token={token!r})"

    @property
    def endpoint(self) -> str:
        return self._endpoint or hub_endpoint()

    @property
    def has_token(self) -> bool:
        return self._token is not None

    def with_token(self, token: str | None) -> Hub:
        """The same hub with another token (after a GatedRepo error asked for one)."""
        return Hub(token, self._endpoint, self._cache_dir, self.timeout, self.resolve_timeout)

    # -- calls -------------------------------------------------------------------------------

    def search(self, text: str = "", sort: SortKey = "downloads", author: str | None = None,
               limit: int = 30) -> list[RepoSummary]:
        """GGUF repositories whose id contains `text`, most downloaded / liked / recent first."""
        if sort not in _SORTS:
            raise HubError(f"sort must be one of {', '.join(_SORTS)}, not {sort!r}")
        key = {"q": text, "sort": sort, "author": author, "limit": limit}
        cached = self._cached("search", key)
        if offline_mode():
            if cached is None:
                raise HubOffline("offline mode (HF_HUB_OFFLINE) is on and this search was never run")
            return [_summary_from_json(d) for d in cached]
        check_reachable(self.endpoint, self.resolve_timeout)
        api = HfApi(endpoint=self.endpoint, token=self._token_arg(), library_name=LIBRARY_NAME)
        with self._translate(None):
            models = list(api.list_models(
                filter="gguf", search=text or None, author=author,
                sort=cast(Any, _SORTS[sort]), limit=limit,
                expand=cast(Any, _SEARCH_EXPAND),
            ))
        hits = [
            RepoSummary(
                repo_id=m.id,
                author=m.author or m.id.split("/")[0],
                downloads=int(m.downloads or 0),
                likes=int(m.likes or 0),
                last_modified=m.last_modified,
                gated=bool(m.gated),
                tags=tuple(m.tags or ()),
            )
            for m in models
        ]
        self._store("search", key, [_summary_to_json(h) for h in hits])
        return hits

    def repo_details(self, repo_id: str, revision: str | None = None) -> RepoDetails:
        """Files with sizes and LFS sha256, license, gated flag, last modified, commit sha."""
        key = {"repo": repo_id, "revision": revision}
        cached = self._cached("repo", key)
        if offline_mode():
            if cached is None:
                raise HubOffline(f"offline mode (HF_HUB_OFFLINE) is on and {repo_id} was never looked up")
            return RepoDetails.from_dict(cached)
        check_reachable(self.endpoint, self.resolve_timeout)
        api = HfApi(endpoint=self.endpoint, token=self._token_arg(), library_name=LIBRARY_NAME)
        with self._translate(repo_id):
            info = api.model_info(repo_id, revision=revision, files_metadata=True,
                                  timeout=self.timeout)
        files = tuple(
            RepoFile(
                name=s.rfilename,
                size=(s.lfs.size if s.lfs else s.size),
                sha256=(s.lfs.sha256 if s.lfs else None),
                blob_id=s.blob_id,
            )
            for s in (info.siblings or ())
        )
        details = RepoDetails(
            repo_id=info.id,
            revision=info.sha or (revision or "main"),
            license=_license(info),
            gated=bool(info.gated),
            last_modified=info.last_modified,
            files=files,
            downloads=int(info.downloads or 0),
            likes=int(info.likes or 0),
            tags=tuple(info.tags or ()),
        )
        self._store("repo", key, details.to_dict())
        return details

    def file_url(self, repo_id: str, filename: str, revision: str = "main") -> str:
        return hf_hub_url(repo_id, filename, revision=revision, endpoint=self.endpoint)

    def headers(self) -> dict[str, str]:
        """Request headers with the user agent and, if any, the token (never print these)."""
        return dict(build_hf_headers(token=self._token_arg(), library_name=LIBRARY_NAME))

    def file_metadata(self, repo_id: str, filename: str, revision: str = "main") -> FileMetadata:
        """HEAD the file: its etag (sha256 for LFS), size, resolved commit and download URL."""
        if offline_mode():
            raise HubOffline(f"offline mode (HF_HUB_OFFLINE) is on; cannot fetch {filename}")
        check_reachable(self.endpoint, self.resolve_timeout)
        url = self.file_url(repo_id, filename, revision)
        with self._translate(repo_id, filename):
            meta = get_hf_file_metadata(url, token=self._token_arg(), library_name=LIBRARY_NAME,
                                        timeout=self.timeout, endpoint=self.endpoint)
        if meta.etag is None or meta.commit_hash is None:
            raise HubError(f"{self.endpoint} answered without ETag or X-Repo-Commit for {filename}; "
                           "is HF_ENDPOINT a Hugging Face compatible server?")
        return FileMetadata(url=url, location=meta.location, etag=meta.etag,
                            commit=meta.commit_hash, size=meta.size)

    # -- helpers -----------------------------------------------------------------------------

    def _token_arg(self) -> str | None:
        return self._token

    @contextmanager
    def _translate(self, repo_id: str | None, filename: str | None = None) -> Iterator[None]:
        """huggingface_hub's (and its HTTP client's) exceptions → typed errors, token redacted."""
        what = f"{repo_id}/{filename}" if filename else (repo_id or "the search")
        try:
            yield
        except OfflineModeIsEnabled as exc:
            raise HubOffline(f"offline mode (HF_HUB_OFFLINE) is on; cannot reach {what}") from exc
        except GatedRepoError as exc:
            hint = ("the token given has not been granted access; accept the terms on the repo page"
                    if self._token else "it needs a Hugging Face token (Settings → Hub token, or HF_TOKEN)")
            raise GatedRepo(f"{repo_id} is gated: {hint}") from exc
        except RevisionNotFoundError as exc:
            raise RepoNotFound(f"{repo_id} has no such revision") from exc
        except RemoteEntryNotFoundError as exc:
            raise RemoteFileNotFound(f"{repo_id} has no file {filename!r}") from exc
        except RepositoryNotFoundError as exc:
            raise RepoNotFound(f"{repo_id} was not found on {self.endpoint} "
                               "(or it is private and the token cannot see it)") from exc
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            if status in (401, 403):
                raise GatedRepo(f"{what}: access denied (HTTP {status}); a token with access is needed") from exc
            if status == 404:
                raise RemoteFileNotFound(f"{what} was not found (HTTP 404)") from exc
            message = redact(str(exc).splitlines()[0] if str(exc) else "", self._token)
            kind = HubServerError if status is not None and (status >= 500 or status == 429) else HubError
            raise kind(f"the Hub answered HTTP {status} for {what}: {message}") from exc
        except hub_http.TransportError as exc:
            raise HubUnreachable(f"cannot reach {self.endpoint}: "
                                 f"{redact(str(exc) or type(exc).__name__, self._token)}") from exc

    def _cache_file(self, kind: str, key: dict[str, Any]) -> Path | None:
        if self._cache_dir is None:
            return None
        raw = json.dumps({"endpoint": self.endpoint, "kind": kind, **key}, sort_keys=True)
        return self._cache_dir / "hub" / f"{kind}-{hashlib.sha256(raw.encode()).hexdigest()[:24]}.json"

    def _cached(self, kind: str, key: dict[str, Any]) -> Any:
        path = self._cache_file(kind, key)
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def _store(self, kind: str, key: dict[str, Any], value: Any) -> None:
        path = self._cache_file(kind, key)
        if path is None:
            return
        # A cache that cannot be written only costs the offline answer. (Two apps may share
        # the cache: write_text gives each writer its own temporary name.)
        with suppress(OSError):
            write_text(path, json.dumps(value))


def _summary_to_json(s: RepoSummary) -> dict[str, Any]:
    out = asdict(s)
    out["last_modified"] = s.last_modified.isoformat() if s.last_modified else None
    return out


def _summary_from_json(d: dict[str, Any]) -> RepoSummary:
    modified = d.get("last_modified")
    return RepoSummary(
        repo_id=d["repo_id"], author=d.get("author"), downloads=int(d.get("downloads") or 0),
        likes=int(d.get("likes") or 0),
        last_modified=datetime.fromisoformat(modified) if modified else None,
        gated=bool(d.get("gated")), tags=tuple(d.get("tags") or ()),
    )


def default_hub(token: str | None = None) -> Hub:
    """A Hub that caches answers in the user cache dir (for offline use)."""
    return Hub(token=token, cache_dir=user_dirs().cache)
