"""Check a GGUF file before llama.cpp ever opens it, so a bad file is a typed error, not a crash.

    >>> check_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))      # fine: returns None
    >>> check_gguf(Path("half-downloaded.gguf"))
    TruncatedModel: half-downloaded.gguf is cut short: it has 49,181,216 of 98,362,432 bytes (50%) — an interrupted download?

What is checked (llama.cpp's loader checks the same things, but answers a bad file with a
log line and NULL, or worse, an abort): the path is a file; magic and version; key, tensor,
array and string counts within sane limits and within the file; known ggml types; tensor
offsets back to back and aligned; the data section inside the file (truncation); an
architecture this llama.cpp knows; every part of a split model present and consistent.
"""

from __future__ import annotations

import mmap
import re
from pathlib import Path

from runtime.errors import (
    CorruptModel,
    IncompleteSplit,
    ModelFileError,
    ModelNotFound,
    NotAGGUF,
    TruncatedModel,
    UnsupportedArchitecture,
)
from runtime.gguf.constants import ARCHITECTURES
from runtime.gguf.header import GGUFHeader, HeaderBeyondFile, check_magic, parse_header

# llama.cpp's split naming (llama_split_path): "<prefix>-00001-of-00003.gguf"
SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def check_gguf(path: Path) -> None:
    """Raise a typed `ModelFileError` if llama.cpp should not be given `path`; else None."""
    inspect_gguf(path)


def inspect_gguf(path: Path) -> tuple[GGUFHeader, tuple[tuple[Path, GGUFHeader], ...]]:
    """Preflight `path` and return its header plus (path, header) of every split part.

    For a single file the parts are just `((path, header),)`. For a split model `path` may
    be any part; the parts come back in order, the first holding the metadata.
    """
    path = Path(path)
    header = read_local_header(path)
    check_architecture(header, path)
    count = _split_count(header, path)
    if count <= 1:
        return header, ((path, header),)
    parts = split_part_paths(path, count)
    missing = [i + 1 for i, part in enumerate(parts) if not part.is_file()]
    if missing:
        listed = ", ".join(str(n) for n in missing[:8]) + (" …" if len(missing) > 8 else "")
        raise IncompleteSplit(f"{path.name} is one of {count} parts; part(s) {listed} are missing "
                              f"from {path.parent}")
    headers: list[tuple[Path, GGUFHeader]] = []
    for i, part in enumerate(parts):
        part_header = header if part == path else read_local_header(part)
        if _split_count(part_header, part) != count or part_header.kv.get("split.no") != i:
            raise IncompleteSplit(f"{part.name} does not belong to the same {count}-part set "
                                  f"as {path.name}")
        headers.append((part, part_header))
    first = headers[0][1]
    check_architecture(first, headers[0][0])  # the metadata lives in the first part
    expected = first.kv.get("split.tensors.count")
    found = sum(len(h.tensors) for _, h in headers)
    if isinstance(expected, int) and expected != found:
        raise IncompleteSplit(f"the {count} parts of {path.name} hold {found} tensors, "
                              f"the first part says {expected}")
    return first, tuple(headers)


def read_local_header(path: Path) -> GGUFHeader:
    """Parse one file's header and check that its tensor data is all there."""
    size = _file_size(path)
    try:
        with path.open("rb") as f:
            if size < 8:
                check_magic(f.read(8))
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                header = parse_header(view)
    except HeaderBeyondFile:
        raise TruncatedModel(f"{path.name} ends inside its header (at byte {size:,}); "
                             "an interrupted download?") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if header.data_end > size:
        percent = 100 * size // header.data_end
        raise TruncatedModel(f"{path.name} is cut short: it has {size:,} of {header.data_end:,} "
                             f"bytes ({percent}%) — an interrupted download?")
    return header


def check_architecture(header: GGUFHeader, path: Path | str) -> str:
    """The file's architecture, if this llama.cpp can run it; else a typed error."""
    name = Path(str(path)).name
    arch = header.kv.get("general.architecture")
    if header.kv.get("split.no", 0) != 0 and arch is None:
        return ""  # later split parts carry no metadata
    if not isinstance(arch, str):
        raise CorruptModel(f"{name} has no general.architecture; it is not a usable model")
    if arch == "clip":
        raise UnsupportedArchitecture(f"{name} is a multimodal projector (mmproj), not a "
                                      "language model; load the model file it belongs to")
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitecture(f"{name} is a {arch!r} model, an architecture this "
                                      "build of llama.cpp does not know")
    return arch


def split_part_paths(path: Path, count: int) -> tuple[Path, ...]:
    """All parts of the split set `path` belongs to, in order."""
    match = SPLIT_NAME.match(path.name)
    if match is None or int(match["count"]) != count:
        raise IncompleteSplit(f"{path.name} is part of a {count}-part model but is not named "
                              "like one (-00001-of-0000N.gguf), so the other parts cannot be found")
    prefix = match["prefix"]
    return tuple(path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf")
                 for i in range(1, count + 1))


def _split_count(header: GGUFHeader, path: Path | str) -> int:
    count = header.kv.get("split.count", 0)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 9999:
        raise CorruptModel(f"{Path(str(path)).name} has an impossible split.count {count!r}")
    no = header.kv.get("split.no", 0)
    if count > 1 and not (isinstance(no, int) and 0 <= no < count):
        raise CorruptModel(f"{Path(str(path)).name} says it is split part {no!r} of {count}")
    return count


def _file_size(path: Path) -> int:
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise ModelNotFound(f"no model file at {path}") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.gguf"))[:3]
        hint = f" (it holds {', '.join(found)})" if found else ""
        raise ModelNotFound(f"{path} is a folder, not a model file{hint}")
    if not path.is_file():
        raise ModelFileError(f"{path} is not a regular file")
    if stat.st_size == 0:
        raise NotAGGUF(f"{path.name} is empty (0 bytes)")
    return stat.st_size
