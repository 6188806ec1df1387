"""Read a remote GGUF's header with HTTP range requests: model facts without the weights.

    info = read_remote_model_info(
        "https://huggingface.co/bartowski/X-GGUF/resolve/main/X-Q4_K_M.gguf")
    info.quant, info.tensor_bytes              # fetched ~1-8 MiB of a 5 GB file

The first request asks for `FIRST_CHUNK` bytes; while the header parser reports that it
needs more, the next request asks for the missing bytes (at least doubling what is held),
so a 150k-token vocabulary costs two or three requests and never the tensor data.
Redirects are followed (the Hub answers `/resolve/<rev>/<file>` with a redirect to its CDN).
A server that ignores `Range` and answers 200 is read only as far as needed, then dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from runtime.errors import ModelFileError, ModelNotFound, TruncatedModel
from runtime.gguf.header import (
    GGUFHeader,
    HeaderBeyondFile,
    HeaderIncomplete,
    LazyArray,
    parse_header,
)
from runtime.gguf.info import ModelInfo, SpanReader, model_info_from_headers
from runtime.gguf.preflight import SPLIT_NAME, check_architecture

FIRST_CHUNK = 1 << 20
MAX_HEADER = 256 << 20  # no real header is near this; a bigger one is a broken file
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


@dataclass(frozen=True)
class RemoteHeader:
    header: GGUFHeader
    total_size: int
    bytes_fetched: int  # what came over the wire, for tests and the curious
    requests: int


def read_remote_model_info(url: str, headers: dict[str, str] | None = None,
                           client: httpx.Client | None = None) -> ModelInfo:
    """`ModelInfo` for the GGUF at `url` (any part of a split set), from header bytes only."""
    with _client(client) as http:
        first = read_remote_header(url, headers, http)
        check_architecture(first.header, _name(url))
        count = first.header.kv.get("split.count", 0)
        if not isinstance(count, int) or count <= 1:
            return model_info_from_headers(url, [first.header], [url], first.total_size,
                                           span_reader=_span_reader(url, headers))
        urls = split_part_urls(url, count)
        parts = [first if u == url else read_remote_header(u, headers, http) for u in urls]
        for i, part in enumerate(parts):
            if part.header.kv.get("split.no") != i or part.header.kv.get("split.count") != count:
                raise ModelFileError(f"{_name(urls[i])} is not part {i + 1} of {count}")
        check_architecture(parts[0].header, _name(urls[0]))
        return model_info_from_headers(
            urls[0], [p.header for p in parts], urls, sum(p.total_size for p in parts),
            urls.index(url), span_reader=_span_reader(urls[0], headers))


def read_remote_header(url: str, headers: dict[str, str] | None = None,
                       client: httpx.Client | None = None) -> RemoteHeader:
    """Fetch just enough of `url` to parse its header; check the file holds all the data."""
    with _client(client) as http:
        data, total = fetch_prefix(http, url, 0, FIRST_CHUNK, headers)
        requests = 1
        while True:
            try:
                header = parse_header(data, total)
                break
            except HeaderIncomplete as more:
                want = max(more.needed, 2 * len(data))
                if want > MAX_HEADER:
                    raise ModelFileError(f"{_name(url)}: its header is larger than "
                                         f"{MAX_HEADER >> 20} MiB; the file is not usable") from None
                chunk, total = fetch_prefix(http, url, len(data), min(want, total), headers)
                if not chunk:
                    raise ModelFileError(f"{_host(url)} stopped sending {_name(url)} "
                                         f"after {len(data):,} bytes") from None
                data += chunk
                requests += 1
            except HeaderBeyondFile:
                raise TruncatedModel(f"{_name(url)} ends inside its header (the server has "
                                     f"{total:,} bytes); an incomplete upload?") from None
    if header.data_end > total:
        raise TruncatedModel(f"{_name(url)} is cut short on the server: {total:,} of "
                             f"{header.data_end:,} bytes")
    return RemoteHeader(header, total, len(data), requests)


def fetch_prefix(http: httpx.Client, url: str, start: int, end: int,
                 headers: dict[str, str] | None) -> tuple[bytes, int]:
    """Bytes `start`..`end` (exclusive, clipped to the file) and the file's total size."""
    request_headers = {**(headers or {}), "Range": f"bytes={start}-{end - 1}",
                       "Accept-Encoding": "identity"}
    try:
        with http.stream("GET", url, headers=request_headers) as response:
            _raise_for_status(response, url)
            if response.status_code == 206:
                total = _total_from_content_range(response, url)
                return response.read(), total
            # 200: the server ignored the range; read up to `end` and hang up.
            total = int(response.headers.get("Content-Length", "0")) or end
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) >= end:
                    break
            return bytes(body[start:end]), total
    except httpx.HTTPError as exc:
        raise ModelFileError(f"cannot read {_name(url)} from {_host(url)}: {exc}") from exc


def fetch_range(url: str, start: int, end: int, headers: dict[str, str] | None = None) -> bytes:
    """Bytes `start`..`end` of a remote file (one request), e.g. a vocabulary span."""
    with _client(None) as http:
        data, _ = fetch_prefix(http, url, start, end, headers)
    if len(data) != end - start:
        raise ModelFileError(f"{_name(url)}: the server sent {len(data)} bytes, "
                             f"asked for {end - start}")
    return data


def split_part_urls(url: str, count: int) -> list[str]:
    """The URLs of every part of the split set `url` belongs to (same folder, llama.cpp names)."""
    parts = urlsplit(url)
    folder, _, name = parts.path.rpartition("/")
    match = SPLIT_NAME.match(name)
    if match is None or int(match["count"]) != count:
        raise ModelFileError(f"{name} is part of a {count}-part model but is not named like "
                             "one (-00001-of-0000N.gguf)")
    return [urlunsplit(parts._replace(path=f"{folder}/{match['prefix']}-{i:05d}-of-{count:05d}.gguf"))
            for i in range(1, count + 1)]


def _span_reader(url: str, headers: dict[str, str] | None) -> SpanReader:
    """Reads a span of `url` with one range request, sending the headers the header read
    sent (a gated model's token) plus any the caller adds."""
    def read(span: LazyArray, extra: dict[str, str] | None) -> bytes:
        return fetch_range(url, span.start, span.end, {**(headers or {}), **(extra or {})})

    return read


class _client:
    """Use the caller's client, or a fresh one closed on exit."""

    def __init__(self, client: httpx.Client | None) -> None:
        self.given = client
        self.own: httpx.Client | None = None

    def __enter__(self) -> httpx.Client:
        if self.given is not None:
            return self.given
        self.own = httpx.Client(follow_redirects=True, timeout=TIMEOUT)
        return self.own

    def __exit__(self, *exc: object) -> None:
        if self.own is not None:
            self.own.close()


def _raise_for_status(response: httpx.Response, url: str) -> None:
    code = response.status_code
    if code in (200, 206):
        return
    if code == 404:
        raise ModelNotFound(f"no file at {url} (HTTP 404)")
    if code in (401, 403):
        raise ModelFileError(f"{_host(url)} refused access to {_name(url)} (HTTP {code}); "
                             "a gated model may need a token")
    if code == 416:
        raise TruncatedModel(f"{_name(url)} is shorter than a GGUF header (HTTP 416)")
    raise ModelFileError(f"{_host(url)} answered HTTP {code} for {_name(url)}")


def _total_from_content_range(response: httpx.Response, url: str) -> int:
    match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
    if match is None or match[3] == "*":
        raise ModelFileError(f"{_host(url)} sent no usable Content-Range for {_name(url)}")
    return int(match[3])


def _name(url: str) -> str:
    return urlsplit(url).path.rpartition("/")[2] or url


def _host(url: str) -> str:
    return urlsplit(url).netloc or url
