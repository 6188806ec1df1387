"""A defensive reader for the header of a GGUF file: key/values and tensor infos, no data.

For the default model (SmolLM2-135M-Instruct Q4_1, 98,362,432 bytes), whose header takes a
little over 1 MiB:

    header = parse_header(open("m.gguf", "rb").read(4 << 20), total_size=98_362_432)
    header.kv["general.architecture"], len(header.tensors), header.data_end
    # ('llama', 272, 98362432)

The same on a file written here with the `gguf` package (one 4×8 F32 tensor):

    >>> import gguf, numpy as np, tempfile
    >>> folder = tempfile.TemporaryDirectory(); path = Path(folder.name, "tiny.gguf")
    >>> writer = gguf.GGUFWriter(path, "llama")
    >>> writer.add_tensor("output.weight", np.zeros((8, 4), np.float32))
    >>> writer.write_header_to_file(); writer.write_kv_data_to_file()
    >>> writer.write_tensors_to_file(); writer.close()
    >>> data = path.read_bytes()
    >>> header = parse_header(data, total_size=len(data))
    >>> header.kv["general.architecture"], header.tensors[0].shape, header.data_end == len(data)
    ('llama', (4, 8), True)
    >>> parse_header(data[:100], total_size=len(data))   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    runtime.gguf.header.HeaderIncomplete: header needs at least ... bytes
    >>> folder.cleanup()

Why not `gguf.GGUFReader`: it maps the tensor *data* as well, so it cannot work on the
header-only prefix that a remote read fetches; it trusts the counts in the file (an absurd
key or tensor count becomes a huge allocation or an opaque numpy error instead of a one-line
message); and it builds a numpy object per vocabulary entry, which takes seconds for a
150k-token vocabulary. This parser uses the `gguf` package's constants (magic, value types,
default alignment), bounds every count and length by the bytes that remain before it reads
anything, and keeps large arrays (token lists, scores) as byte spans to read on demand.

It works on any buffer (bytes, mmap). When the buffer ends before the header does, it raises
`HeaderIncomplete(needed)`: a local caller turns that into `TruncatedModel`, a remote caller
fetches more bytes and tries again. Contradictions raise `CorruptModel`; a wrong magic or
version raises `NotAGGUF`. The checks mirror llama.cpp's own loader (ggml/src/gguf.cpp):
names under 64 bytes and unique, at most 4 dimensions, known types, rows a multiple of the
block size, tensors laid out back to back at aligned offsets.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from runtime.errors import (
    CorruptModel,
    ModelFileError,
    ModelNotFound,
    NotAGGUF,
    TruncatedModel,
    shown,
)
from runtime.gguf.constants import GGML_TYPES

MAX_KV = 1 << 16  # real files have tens to a few hundred keys
MAX_TENSORS = 1 << 20  # the largest MoE files have tens of thousands
MAX_KEY_LENGTH = 1 << 16
MAX_STRING_LENGTH = 1 << 26  # 64 MiB: chat templates are kilobytes
MAX_ARRAY_ITEMS = 1 << 28  # vocabularies have up to ~10^6 entries
MAX_TENSOR_NAME = 63  # GGML_MAX_NAME - 1
MAX_DIMS = 4
EAGER_ARRAY_ITEMS = 4096  # arrays up to this length are read into tuples; longer ones lazily
# Bytes past the end of the tensor data that a file may carry before it is refused. Writers
# leave none; llama.cpp maps the whole file, and on a 1 TiB sparse tail it sat in
# llama_model_load_from_file for more than a minute.
MAX_TAIL_BYTES = 16 << 20

_SCALARS: dict[int, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<?"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class HeaderIncomplete(Exception):
    """The buffer ends before the header does; `needed` bytes from the start would do."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"header needs at least {needed} bytes")
        self.needed = needed


@dataclass(frozen=True)
class LazyArray:
    """A long array left in the file: `start`..`end` are absolute byte offsets of its items.

    `digest` is a sha256 prefix of those bytes (lengths included for strings), so two files
    with the same token list have the same digest without either list being decoded.
    """

    item_type: int
    count: int
    start: int
    end: int
    digest: str

    def decode(self, data: bytes) -> tuple[Any, ...]:
        """Items from `data`, the `end - start` bytes of the span."""
        if len(data) != self.end - self.start:
            raise CorruptModel("array bytes changed since the header was read")
        if self.item_type == GGUFValueType.STRING:
            return tuple(s.decode("utf-8", errors="replace") for s in self.raw_strings(data))
        fmt = _SCALARS[self.item_type]
        return tuple(item[0] for item in fmt.iter_unpack(data))

    def raw_strings(self, data: bytes) -> tuple[bytes, ...]:
        """A string array's items as stored, undecoded: token text compared byte for byte
        (llama.cpp's draft check does; a byte-level BPE piece need not be valid UTF-8)."""
        if self.item_type != GGUFValueType.STRING:
            raise CorruptModel("the array holds numbers, not strings")
        if len(data) != self.end - self.start:
            raise CorruptModel("array bytes changed since the header was read")
        out: list[bytes] = []
        pos = 0
        for _ in range(self.count):
            (n,) = _U64.unpack_from(data, pos)
            out.append(bytes(data[pos + 8:pos + 8 + n]))
            pos += 8 + n
        return tuple(out)


def metadata_value(kv: dict[str, Any], key: str, kind: type) -> Any:
    """`kv[key]` if it has the type `kind` (int, bool or str); None when absent.

    A key of the wrong type is a broken file (`CorruptModel`), never silently ignored: a
    bool is not an int here, though Python says it is.
    """
    value = kv.get(key)
    if value is None:
        return None
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is bool and isinstance(value, bool):
        return value
    if kind is str and isinstance(value, str):
        return value
    raise CorruptModel(f"metadata {key} has the wrong type ({type(value).__name__})")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    ggml_type: int
    offset: int  # relative to the start of the data section
    n_elements: int
    n_bytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    kv: dict[str, Any] = field(repr=False)  # scalars, strings, tuples, or LazyArray
    arrays: dict[str, LazyArray] = field(repr=False)  # where every array value lies
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    alignment: int
    data_offset: int  # absolute offset of the tensor data section
    data_size: int  # bytes of the data section the tensors need, padding included
    kv_types: dict[str, int] = field(default_factory=dict, repr=False)  # key → GGUFValueType

    @property
    def data_end(self) -> int:
        """The file size the header implies: a shorter file is truncated."""
        return self.data_offset + self.data_size


class _Cursor:
    """Reads little-endian values from `buf`, checking every length against what is left."""

    def __init__(self, buf: memoryview, total_size: int) -> None:
        self.buf = buf
        self.pos = 0
        self.total = total_size  # the whole file's size; len(buf) may be a prefix of it

    def need(self, n: int) -> None:
        end = self.pos + n
        if end > self.total:
            raise _PastEnd(end)
        if end > len(self.buf):
            raise HeaderIncomplete(end)

    def within(self, n: int) -> None:
        """Fail early (without reading) when `n` more bytes would pass the end of the file."""
        if self.pos + n > self.total:
            raise _PastEnd(self.pos + n)

    def unpack(self, fmt: struct.Struct) -> Any:
        self.need(fmt.size)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def string(self, what: str, limit: int, strict: bool = True) -> str:
        n = self.unpack(_U64)
        if n > limit:
            raise CorruptModel(f"{what} claims a length of {n:,} bytes; the file is corrupt")
        self.need(n)
        raw = self.buf[self.pos:self.pos + n].tobytes()
        self.pos += n
        if not strict:  # llama.cpp does not check values either (a name, a template)
            return raw.decode("utf-8", errors="replace")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptModel(f"{what} is not valid UTF-8; the file is corrupt") from exc


class _PastEnd(Exception):
    """A read beyond the file's own size: the header promises more than the file holds."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


def check_magic(prefix: bytes) -> int:
    """The GGUF version from the first 8 bytes, or `NotAGGUF` saying what the file is."""
    if len(prefix) < 8:
        raise NotAGGUF(f"the file is only {len(prefix)} bytes long, too short to be a GGUF model")
    magic, version = struct.unpack_from("<II", prefix)
    if magic != GGUF_MAGIC:
        raise NotAGGUF(_what_is_it(prefix))
    if version == 1:
        raise NotAGGUF("GGUF version 1 files are no longer supported by llama.cpp; re-convert it")
    if version in (2 << 24, 3 << 24):
        raise NotAGGUF("big-endian GGUF files are not supported on this machine")
    if version not in (2, 3):
        raise NotAGGUF(f"GGUF version {version} is newer than this llama.cpp supports (2, 3)")
    return int(version)


def _what_is_it(prefix: bytes) -> str:
    if prefix[:4] in (b"ggml", b"ggmf", b"ggjt", b"lmgg", b"fmgg", b"tjgg"):
        return "this is an old GGML/GGJT model file; llama.cpp needs it converted to GGUF"
    if prefix[:2] == b"PK":
        return "this is a zip archive, not a GGUF model"
    if prefix.lstrip()[:1] in (b"<", b"{"):
        return "this is a text (HTML or JSON) file, not a GGUF model; was the download an error page?"
    return f"not a GGUF model (starts with {prefix[:4]!r}, expected b'GGUF')"


Buffer = bytes | bytearray | memoryview | mmap.mmap


def parse_header(buf: Buffer, total_size: int | None = None) -> GGUFHeader:
    """Parse the header in `buf` (the file, or a prefix of a file of `total_size` bytes).

    Raises NotAGGUF, CorruptModel, `HeaderIncomplete` (buffer too short, file may be fine) or
    `HeaderBeyondFile` (the header itself runs past the end of the file: truncated).
    """
    total = len(buf) if total_size is None else total_size
    view = memoryview(buf)
    try:
        check_magic(view[:8].tobytes())
        cur = _Cursor(view, total)
        cur.pos = 4
        return _parse(cur)
    except _PastEnd as exc:
        raise HeaderBeyondFile(exc.needed, total) from None
    finally:
        # An mmap cannot be closed while a view of it is alive, and a traceback keeps
        # this frame (and so the view) alive: let go of it explicitly.
        view.release()


class HeaderBeyondFile(Exception):
    """The header runs past the end of the file (a truncated download)."""

    def __init__(self, needed: int, size: int) -> None:
        super().__init__(f"header needs {needed} bytes, file has {size}")
        self.needed = needed
        self.size = size


def _parse(cur: _Cursor) -> GGUFHeader:
    version = cur.unpack(_U32)
    n_tensors = cur.unpack(_I64)
    n_kv = cur.unpack(_I64)
    # Counts beyond any real model are corruption; plausible counts that need more bytes
    # than the file has (each key/value takes at least 13, each tensor info 24) mean the
    # file was cut short. Either way nothing is allocated for them.
    if not 0 <= n_kv <= MAX_KV:
        raise CorruptModel(f"the header claims {n_kv:,} metadata keys; the file is corrupt")
    if not 0 <= n_tensors <= MAX_TENSORS:
        raise CorruptModel(f"the header claims {n_tensors:,} tensors; the file is corrupt")
    cur.within(n_kv * 13 + n_tensors * 24)

    kv: dict[str, Any] = {}
    kv_types: dict[str, int] = {}
    arrays: dict[str, LazyArray] = {}
    for _ in range(n_kv):
        key = cur.string("a metadata key", MAX_KEY_LENGTH)
        if key in kv:
            raise CorruptModel(f"metadata key {key!r} appears twice; the file is corrupt")
        value_type = cur.unpack(_U32)
        kv_types[key] = value_type
        if value_type == GGUFValueType.ARRAY:
            span = _array(cur, key)
            arrays[key] = span
            small = span.count <= EAGER_ARRAY_ITEMS
            kv[key] = span.decode(cur.buf[span.start:span.end].tobytes()) if small else span
        else:
            kv[key] = _value(cur, key, value_type)

    alignment = kv.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if "general.alignment" in kv and kv_types["general.alignment"] != GGUFValueType.UINT32:
        raise CorruptModel("general.alignment is not a uint32 (ggml/src/gguf.cpp refuses it)")
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
            or alignment & (alignment - 1):
        raise CorruptModel(f"general.alignment {alignment!r} is not a power of two")

    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for _ in range(n_tensors):
        tensors.append(_tensor_info(cur, seen))

    data_offset = _pad(cur.pos, alignment) if n_tensors else cur.pos
    data_size = 0
    for t in tensors:
        if t.offset != data_size:
            raise CorruptModel(f"tensor {t.name!r} starts at data offset {t.offset:,}, "
                               f"expected {data_size:,}; the file is corrupt")
        data_size += _pad(t.n_bytes, alignment)
    return GGUFHeader(version, kv, arrays, tuple(tensors), alignment, data_offset, data_size,
                      kv_types)


def _value(cur: _Cursor, key: str, value_type: int) -> Any:
    if value_type == GGUFValueType.STRING:
        return cur.string(f"the value of {key!r}", MAX_STRING_LENGTH, strict=False)
    if value_type in _SCALARS:
        return cur.unpack(_SCALARS[value_type])
    raise CorruptModel(f"metadata key {key!r} has unknown value type {value_type}")


def _array(cur: _Cursor, key: str) -> LazyArray:
    """Skip over an array, checking every item length, and say where it lies."""
    item_type = cur.unpack(_U32)
    count = cur.unpack(_U64)
    if item_type == GGUFValueType.STRING:
        min_size = 8
    elif item_type in _SCALARS:
        min_size = _SCALARS[item_type].size
    else:  # nested arrays: llama.cpp's loader refuses them too
        raise CorruptModel(f"metadata array {key!r} has unsupported item type {item_type}")
    if count > MAX_ARRAY_ITEMS:
        raise CorruptModel(f"metadata array {key!r} claims {count:,} items; the file is corrupt")
    cur.within(count * min_size)
    start = cur.pos
    if item_type != GGUFValueType.STRING:
        cur.need(count * min_size)
        cur.pos += count * min_size
    else:
        for i in range(count):
            n = cur.unpack(_U64)
            if n > MAX_STRING_LENGTH:
                raise CorruptModel(f"item {i} of {key!r} claims a length of {n:,} bytes; "
                                   "the file is corrupt")
            cur.need(n)
            cur.pos += n
    return LazyArray(item_type, count, start, cur.pos, _digest(cur, start))


def _digest(cur: _Cursor, start: int) -> str:
    return hashlib.sha256(cur.buf[start:cur.pos]).hexdigest()[:16]


def _tensor_info(cur: _Cursor, seen: set[str]) -> TensorInfo:
    name = cur.string("a tensor name", MAX_KEY_LENGTH)
    if len(name.encode()) > MAX_TENSOR_NAME:
        raise CorruptModel(f"tensor name {name[:40]!r}… is longer than llama.cpp allows")
    if name in seen:
        raise CorruptModel(f"tensor {name!r} appears twice; the file is corrupt")
    seen.add(name)
    n_dims = cur.unpack(_U32)
    if n_dims > MAX_DIMS:
        raise CorruptModel(f"tensor {name!r} has {n_dims} dimensions (at most 4)")
    shape = tuple(cur.unpack(_I64) for _ in range(n_dims))
    n_elements = 1
    for dim in shape:
        if dim < 0:
            raise CorruptModel(f"tensor {name!r} has a negative dimension {dim}")
        n_elements *= dim
    if n_elements >= 1 << 63:
        raise CorruptModel(f"tensor {name!r} has an impossible shape {shape}")
    ggml_type = cur.unpack(_U32)
    if ggml_type not in GGML_TYPES:
        raise CorruptModel(f"tensor {name!r} has unknown ggml type {ggml_type}; the file is "
                           "corrupt or needs a newer llama.cpp")
    type_name, block, block_bytes = GGML_TYPES[ggml_type]
    row = shape[0] if shape else 1
    if row % block:
        raise CorruptModel(f"tensor {name!r} rows of {row} values are not a multiple of "
                           f"{type_name}'s block of {block}")
    offset = cur.unpack(_U64)
    return TensorInfo(name, shape, ggml_type, offset, n_elements, n_elements // block * block_bytes)


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def read_local_header(path: Path) -> GGUFHeader:
    """Parse one local file's header and check that its tensor data is all there, and no more.

    Raises `ModelNotFound`, `NotAGGUF`, `TruncatedModel`, `CorruptModel` or `ModelFileError`.
    """
    size = _file_size(path)
    try:
        with path.open("rb") as f:
            if size < 8:
                check_magic(f.read(8))
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                header = parse_header(view)
    except HeaderBeyondFile:
        raise TruncatedModel(f"{shown(path.name)} ends inside its header (at byte {size:,}); "
                             "an interrupted download?") from None
    except (CorruptModel, NotAGGUF) as exc:  # the parser knows no file names
        raise type(exc)(f"{shown(path.name)}: {exc}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {shown(path)}: {exc.strerror or exc}") from exc
    if header.data_end > size:
        percent = 100 * size // header.data_end
        raise TruncatedModel(f"{shown(path.name)} is cut short: it has {size:,} of {header.data_end:,} "
                             f"bytes ({percent}%) — an interrupted download?")
    tail = size - header.data_end
    if tail > max(MAX_TAIL_BYTES, header.data_end // 8):
        raise CorruptModel(f"{shown(path.name)} is {size:,} bytes but its header accounts for only "
                           f"{header.data_end:,}; the other {tail:,} bytes are not part of the "
                           "model (a damaged or wrongly joined file?)")
    return header


def _file_size(path: Path) -> int:
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise ModelNotFound(f"no model file at {shown(path)}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {shown(path)}: {exc.strerror or exc}") from exc
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.gguf"))[:3]
        hint = f" (it holds {', '.join(found)})" if found else ""
        raise ModelNotFound(f"{shown(path)} is a folder, not a model file{hint}")
    if not path.is_file():
        raise ModelFileError(f"{shown(path)} is not a regular file")
    if stat.st_size == 0:
        raise NotAGGUF(f"{shown(path.name)} is empty (0 bytes)")
    return stat.st_size
