"""Check a GGUF file before llama.cpp ever opens it, so a bad file is a typed error, not a crash.

    check_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))      # fine: returns None
    check_gguf(Path("half-downloaded.gguf"))                 # its first 49,181,216 bytes
    # TruncatedModel: half-downloaded.gguf is cut short: it has 49,181,216 of 98,362,432 bytes (50%) — an interrupted download?

A file that is not there is a typed error too:

    >>> check_gguf(Path("no-such-model.gguf"))
    Traceback (most recent call last):
    runtime.errors.ModelNotFound: no model file at no-such-model.gguf

What is checked (llama.cpp's loader checks the same things, but answers a bad file with a
log line and NULL, or worse, an abort): the path is a file; magic and version; key, tensor,
array and string counts within sane limits and within the file; known ggml types; tensor
offsets back to back and aligned; the data section inside the file (truncation) and not
followed by a tail larger than the model (header.read_local_header); an architecture this
llama.cpp knows; every part of a split model present and consistent; and what llama.cpp
asserts on (hyperparameters, tokenizer, tensor types: runtime.gguf.model_rules).

Only the header is read, plus the token list for the tokenizer rules (a few MB at most).
"""

from __future__ import annotations

import re
from pathlib import Path

from runtime.errors import CorruptModel, IncompleteSplit, UnsupportedArchitecture, shown
from runtime.gguf.constants import ARCHITECTURES
from runtime.gguf.header import GGUFHeader, read_local_header
from runtime.gguf.model_rules import check_model_rules, check_tensor_alignment

__all__ = ["SPLIT_NAME", "check_architecture", "check_gguf", "inspect_gguf", "read_local_header",
           "split_part_paths"]

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
        check_tensor_alignment(header, path)
        check_model_rules(header, header.tensors, path)
        return header, ((path, header),)
    parts = split_part_paths(path, count)
    missing = [i + 1 for i, part in enumerate(parts) if not part.is_file()]
    if missing:
        listed = ", ".join(str(n) for n in missing[:8]) + (" …" if len(missing) > 8 else "")
        raise IncompleteSplit(f"{shown(path.name)} is one of {count} parts; part(s) {listed} are missing "
                              f"from {shown(path.parent)}")
    headers: list[tuple[Path, GGUFHeader]] = []
    for i, part in enumerate(parts):
        part_header = header if part == path else read_local_header(part)
        if _split_count(part_header, part) != count or part_header.kv.get("split.no") != i:
            raise IncompleteSplit(f"{shown(part.name)} does not belong to the same {count}-part set "
                                  f"as {shown(path.name)}")
        headers.append((part, part_header))
    first = headers[0][1]
    check_architecture(first, headers[0][0])  # the metadata lives in the first part
    expected = first.kv.get("split.tensors.count")
    found = sum(len(h.tensors) for _, h in headers)
    if isinstance(expected, int) and expected != found:
        raise IncompleteSplit(f"the {count} parts of {shown(path.name)} hold {found} tensors, "
                              f"the first part says {expected}")
    for part, part_header in headers:
        check_tensor_alignment(part_header, part)
    check_model_rules(first, [t for _, h in headers for t in h.tensors], headers[0][0])
    return first, tuple(headers)


def check_architecture(header: GGUFHeader, path: Path | str) -> str:
    """The file's architecture, if this llama.cpp can run it; else a typed error."""
    name = shown(Path(str(path)).name)
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
        raise IncompleteSplit(f"{shown(path.name)} is part of a {count}-part model but is not named "
                              "like one (-00001-of-0000N.gguf), so the other parts cannot be found")
    prefix = match["prefix"]
    return tuple(path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf")
                 for i in range(1, count + 1))


def _split_count(header: GGUFHeader, path: Path | str) -> int:
    count = header.kv.get("split.count", 0)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 9999:
        raise CorruptModel(f"{shown(Path(str(path)).name)} has an impossible split.count {count!r}")
    no = header.kv.get("split.no", 0)
    if count > 1 and not (isinstance(no, int) and 0 <= no < count):
        raise CorruptModel(f"{shown(Path(str(path)).name)} says it is split part {no!r} of {count}")
    return count
